//! Health checks apart from requests, end to end: a process named `kubelet` on this node (a
//! copy of curl, as the kubelet's httpGet probes are its own connections) probes a container
//! every 150 ms while it stops with its listener closed; the test process's own connects are
//! the requests. Ground truth is each side's own count of refused connects.

use std::{
    net::TcpStream,
    process::Command,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use drainwatch_tests::{
    agent::{Agent, get, stop_record, wait_for},
    lab::{Backend, BackendOpts, Mode, container::http_get},
};

/// What one probe met: answered, refused, or something else (curl's own words).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Probe {
    Ok,
    Refused,
    Other(String),
}

#[test]
fn the_kubelets_refused_probes_are_not_requests() {
    let dir = tempfile_dir();
    let kubelet = format!("{dir}/kubelet");
    std::fs::copy("/usr/bin/curl", &kubelet).expect("curl, copied as the kubelet");

    let agent = Agent::start(&[]);
    let b = Backend::start("probed", Mode::CloseListener, BackendOpts::default());
    let addr = b.addr();
    let url = format!("http://{addr}/health");
    b.require_route();

    let stop = Arc::new(AtomicBool::new(false));
    let prober = {
        let (stop, kubelet) = (stop.clone(), kubelet.clone());
        std::thread::spawn(move || {
            let mut seen = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                let out = Command::new(&kubelet)
                    .args(["-sS", "-o", "/dev/null", "-m", "1", &url])
                    .output()
                    .expect("run the kubelet");
                let err = String::from_utf8_lossy(&out.stderr).to_string();
                // curl's exit 7 at once: the SYN was answered with RST (an unreachable
                // address would time out instead: exit 28).
                seen.push(if out.status.success() {
                    Probe::Ok
                } else if out.status.code() == Some(7) {
                    Probe::Refused
                } else {
                    Probe::Other(err)
                });
                std::thread::sleep(Duration::from_millis(150));
            }
            seen
        })
    };
    // The agent announces a container it follows with zeroed stop counters.
    let named = format!("container=\"{}\"", b.container);
    wait_for(
        "the agent follows the container",
        Duration::from_secs(15),
        || {
            get(agent.port, "/metrics", "text/plain")
                .is_ok_and(|(_, _, body)| body.contains(&named))
        },
    );

    // A request in flight keeps the container alive for 2 s after it closes its listener.
    let inflight =
        std::thread::spawn(move || http_get(addr, "/work?ms=2000&id=p1", Duration::from_secs(10)));
    wait_for(
        "the backend starts the request",
        Duration::from_secs(10),
        || b.work_log().iter().any(|w| w.started && w.id == "p1"),
    );
    let stopping = {
        let id = b.container.clone();
        std::thread::spawn(move || {
            Command::new("podman")
                .args(["stop", "-t", "10", &id])
                .output()
        })
    };
    wait_for("the listener closed", Duration::from_secs(10), || {
        b.events().iter().any(|e| e.kind == "listener-closed")
    });
    // Three requests of the test process meet the closed listener.
    let mut refused_requests = 0;
    for _ in 0..3 {
        let e = TcpStream::connect(addr).expect_err("the listener is closed");
        assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused);
        refused_requests += 1;
        std::thread::sleep(Duration::from_millis(200));
    }
    let served = inflight.join().expect("client thread");
    assert!(served.is_ok(), "the in-flight request finished: {served:?}");
    stop.store(true, Ordering::SeqCst);
    let probes = prober.join().expect("prober thread");
    stopping
        .join()
        .expect("podman stop")
        .expect("podman stop ran");

    let refused_probes = probes.iter().filter(|p| **p == Probe::Refused).count() as u64;
    println!("kubelet saw: {probes:?}");
    assert!(
        probes.contains(&Probe::Ok),
        "probes answered before the stop"
    );
    assert!(
        refused_probes >= 5,
        "probes refused while it drained: {probes:?}"
    );
    assert!(
        !probes.iter().any(|p| matches!(p, Probe::Other(_))),
        "every probe answered or refused: {probes:?}"
    );

    let s = stop_record(&agent, &b.id);
    println!("drainwatch: {s:#}");
    assert_eq!(s["loss"]["refused"], refused_requests, "{s:#}");
    assert_eq!(s["loss"]["probes"]["refused"], refused_probes, "{s:#}");
    assert_eq!(
        s["loss"]["probes"]["by_schedule"], 0,
        "the kubelet is known"
    );
    assert_eq!(
        s["loss"]["accepted_after_sigterm"], 0,
        "no request came after it"
    );
    assert_eq!(s["outcome"], "listener_closed_early");
    let metric = |result: &str| {
        agent.metric(&format!(
            "drainwatch_stop_probe_failures_total{{namespace=\"\",workload=\"{}\",{named},result=\"{result}\"}}",
            s["container"]["workload"].as_str().unwrap_or_default(),
        ))
    };
    assert_eq!(metric("refused"), Some(refused_probes as f64));
    let _ = std::fs::remove_dir_all(&dir);
}

fn tempfile_dir() -> String {
    let dir = std::env::temp_dir().join(format!("dw-kubelet-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir.to_string_lossy().into_owned()
}
