//! The real agent binary on the running kernel: its start-up lines and probe metrics against
//! the kernel's facts, and one whole stop of a synthetic container checked exact. The
//! container is what a runtime makes, made by hand: a cgroup named as Docker names one
//! (`/docker/<64 hex>`), a network namespace of its own with loopback only, a server in both
//! with a listener and one request in flight, stopped by SIGTERM (no handler: exit 143), then
//! its cgroup removed.

use std::{
    fs::File,
    io::{BufRead, BufReader, Read, Write},
    net::TcpStream,
    os::{fd::AsRawFd, unix::process::CommandExt},
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use drainwatch::{export::view::StopView, model::stop::Outcome};

use super::{Runner, expect::Facts};
use crate::agent::{Agent, free_port, get, stop_record, wait_for};
use crate::cgroup_v2_root;

/// The port the container's server listens on, inside its own namespace.
const PORT: u16 = 8080;

pub fn run(r: &mut Runner, facts: &Facts) {
    if !r.wanted("agent_startup") && !LAYOUTS.iter().any(|l| r.wanted(l.check)) {
        return;
    }
    let log = std::env::temp_dir().join(format!("dw-matrix-agent-{}.log", std::process::id()));
    let agent = match std::panic::catch_unwind(|| start_agent(&log)) {
        Ok(a) => a,
        Err(p) => {
            let msg = super::message(&*p);
            r.check("agent_startup", || panic!("{msg}"));
            for l in &LAYOUTS {
                r.check(l.check, || panic!("the agent did not start"));
            }
            return;
        }
    };
    r.check("agent_startup", || startup(&agent, &log, facts));
    for l in &LAYOUTS {
        r.check(l.check, || container_stop(&agent, l));
    }
    drop(agent);
    let _ = std::fs::remove_file(&log);
}

/// The agent, its log going to `log`; ready within 3 minutes (TCG loads programs slowly).
fn start_agent(log: &PathBuf) -> Agent {
    crate::require_root();
    let port = free_port();
    let child = Command::new(crate::agent::binary())
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .env("DRAINWATCH_LOG", "info")
        .stdout(Stdio::null())
        .stderr(File::create(log).expect("agent log file"))
        .spawn()
        .expect("spawn drainwatch");
    let mut agent = Agent {
        child,
        port,
        token: None,
    };
    let t = Instant::now();
    loop {
        if let Ok((200, _, _)) = get(port, "/readyz", "*/*") {
            break;
        }
        if let Ok(Some(status)) = agent.child.try_wait() {
            panic!(
                "drainwatch exited during start-up: {status}: {}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        assert!(
            t.elapsed() < Duration::from_secs(180),
            "not ready within 180 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    println!("DWK-AGENT ready in {:.1}s", t.elapsed().as_secs_f64());
    agent
}

/// One start-up line per signal and the probe gauges, each as the kernel's facts say.
fn startup(agent: &Agent, log: &PathBuf, facts: &Facts) -> String {
    let text = std::fs::read_to_string(log).expect("agent log");
    let metrics = agent.metrics_text();
    let mut degraded = Vec::new();
    for p in drainwatch::capture::plan::PLAN {
        let want = facts.expected("natural", p.signal);
        let line = match &want {
            Some(hook) => format!("{}: {hook}", p.title),
            None => format!("{}: unavailable: {}", p.title, p.unavailable),
        };
        assert!(
            text.contains(&line),
            "no start-up line {line:?} in:\n{text}"
        );
        if let Some(hook) = &want {
            let attached = format!(
                "drainwatch_probe_attached{{signal=\"{}\",hook=\"{hook}\"}} 1",
                p.signal
            );
            assert!(metrics.contains(&attached), "no {attached}");
        }
        let gauge = agent
            .metric(&format!(
                "drainwatch_probe_degraded{{signal=\"{}\"}}",
                p.signal
            ))
            .unwrap_or_else(|| panic!("no drainwatch_probe_degraded for {}", p.signal));
        // Unavailable signals are degraded; of the others, only those whose line says so.
        let says = text
            .lines()
            .any(|l| l.contains(&format!("{}: ", p.title)) && l.contains("(degraded: "));
        let expect = want.is_none() || says;
        assert_eq!(gauge, f64::from(u8::from(expect)), "{} degraded", p.signal);
        if expect {
            degraded.push(p.signal);
        }
    }
    format!("one line per signal; degraded: {degraded:?}")
}

/// A random container id, as Docker's: 64 hex digits.
fn container_id() -> String {
    (0..4)
        .map(|_| format!("{:016x}", fastrand::u64(..)))
        .collect()
}

/// A random pod uid, as the API server makes them (a UUID).
fn pod_uid() -> String {
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        fastrand::u32(..),
        fastrand::u16(..),
        fastrand::u16(..),
        fastrand::u16(..),
        fastrand::u64(..1 << 48)
    )
}

/// Where a runtime puts a container's cgroup, as nodes lay them out: Docker's own, and the
/// kubelet's systemd driver (the default on pure cgroup v2 nodes) with containerd's and
/// CRI-O's scopes. The QEMU kernels mount cgroup2 alone at `/sys/fs/cgroup`, as those nodes
/// do; this machine's hybrid mount runs them in its unified hierarchy.
pub struct Layout {
    /// The check's name.
    pub check: &'static str,
    /// What the stop record's `container.runtime` says.
    runtime: &'static str,
    /// The cgroup's path below the v2 root, from the container id and the pod uid.
    path: fn(&str, &str) -> Vec<String>,
}

/// The kubelet's systemd-driver slices of a BestEffort pod (its uid's dashes as
/// underscores, as systemd unit names need), then the runtime's scope.
fn kubepods(uid: &str, scope: String) -> Vec<String> {
    vec![
        "kubepods.slice".into(),
        "kubepods-besteffort.slice".into(),
        format!("kubepods-besteffort-pod{}.slice", uid.replace('-', "_")),
        scope,
    ]
}

pub const LAYOUTS: [Layout; 3] = [
    Layout {
        check: "container_stop",
        runtime: "docker",
        path: |id, _| vec!["docker".into(), id.into()],
    },
    Layout {
        check: "container_stop_kubelet_containerd",
        runtime: "containerd",
        path: |id, uid| kubepods(uid, format!("cri-containerd-{id}.scope")),
    },
    Layout {
        check: "container_stop_kubelet_crio",
        runtime: "cri-o",
        path: |id, uid| kubepods(uid, format!("crio-{id}.scope")),
    },
];

fn container_stop(agent: &Agent, layout: &Layout) -> String {
    let (id, uid) = (container_id(), pod_uid());
    let mut cgroup = cgroup_v2_root();
    // Only the directories made here are removed (a node's own kubepods.slice stays).
    let mut made = Vec::new();
    for part in (layout.path)(&id, &uid) {
        cgroup.push(part);
        if !cgroup.exists() {
            std::fs::create_dir(&cgroup).expect("mkdir the container's cgroup");
            made.push(cgroup.clone());
        }
    }
    let result = std::panic::catch_unwind(|| stop_in(agent, &id, &cgroup, layout));
    for dir in made.iter().rev() {
        let _ = std::fs::remove_dir(dir);
    }
    result.unwrap_or_else(|p| std::panic::resume_unwind(p))
}

fn stop_in(agent: &Agent, id: &str, cgroup: &std::path::Path, layout: &Layout) -> String {
    let mut server = spawn_server(cgroup);
    let pid = server.id();
    let mut out = BufReader::new(server.stdout.take().expect("server stdout"));
    let mut line = String::new();
    out.read_line(&mut line).expect("server says it listens");
    assert_eq!(line.trim(), "listening", "server: {line}");
    // The agent adopts it at its next scan (once a second): its series appear under its name.
    let named = format!("container=\"{}\"", &id[..12]);
    wait_for(
        "the agent follows the container",
        Duration::from_secs(30),
        || agent.metrics_text().contains(&named),
    );
    // A request in flight: sent from this process, inside the container's namespace.
    let client = std::thread::spawn(move || {
        let ns = File::open(format!("/proc/{pid}/ns/net")).expect("its namespace");
        // SAFETY: setns on this thread only, with a namespace fd.
        assert_eq!(
            unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) },
            0
        );
        let mut s = TcpStream::connect(("127.0.0.1", PORT)).expect("connect in the container");
        s.write_all(b"GET /work HTTP/1.1\r\n\r\n").expect("send");
        s.set_read_timeout(Some(Duration::from_secs(30))).ok();
        let mut rest = Vec::new();
        let end = s.read_to_end(&mut rest);
        (end.map(|_| rest.len()), s.local_addr().expect("addr"))
    });
    line.clear();
    out.read_line(&mut line).expect("server read the request");
    assert_eq!(line.trim(), "read 22", "server: {line}");
    // The stop: SIGTERM with the request in flight; no handler, so the default action.
    // SAFETY: kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGTERM) }, 0);
    let status = server.wait().expect("wait");
    let (answer, client_addr) = client.join().expect("client thread");
    assert_eq!(
        answer.ok(),
        Some(0),
        "the client's request was cut, unanswered"
    );
    std::fs::remove_dir(cgroup).expect("rmdir the container's cgroup");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(libc::SIGTERM));

    let stop: StopView = serde_json::from_value(stop_record(agent, id)).expect("a stop record");
    let want_listener = format!("127.0.0.1:{PORT}");
    let s = &stop;
    assert_eq!(s.container.id, id, "{s:#?}");
    assert_eq!(s.container.runtime, layout.runtime, "{s:#?}");
    assert_eq!(s.outcome, Some(Outcome::ExitAtOnce), "{s:#?}");
    assert_eq!(
        (s.exit_code, s.exit_signal),
        (Some(143), Some(15)),
        "{s:#?}"
    );
    assert_eq!(
        s.sigterm_sender.as_ref().map(|x| x.pid),
        Some(std::process::id())
    );
    assert!(
        s.sigkill_at.is_none() && s.complete && s.cgroup_removed_at.is_some(),
        "{s:#?}"
    );
    assert_eq!(s.connections_at_sigterm, Some(1), "{s:#?}");
    assert_eq!(s.loss.inflight_cut, 1, "{s:#?}");
    assert_eq!(
        (s.loss.refused, s.loss.accepted_after_sigterm),
        (0, 0),
        "{s:#?}"
    );
    assert_eq!(s.events_lost, 0);
    let listeners: Vec<_> = s.listeners.iter().map(|l| l.address.as_str()).collect();
    assert_eq!(listeners, [want_listener.as_str()], "{s:#?}");
    assert!(s.listeners[0].closed_at.is_some(), "{s:#?}");
    format!(
        "{} {} pid {pid}: exit 143 on SIGTERM from pid {}, 1 in-flight request from {client_addr} cut, listener {want_listener} closed, cgroup removed",
        layout.runtime,
        &id[..12],
        std::process::id()
    )
}

/// This binary's `serve` mode in the container's cgroup and a new network namespace.
fn spawn_server(cgroup: &std::path::Path) -> Child {
    let procs = std::ffi::CString::new(cgroup.join("cgroup.procs").as_os_str().as_encoded_bytes())
        .expect("path");
    let mut cmd = Command::new(std::env::current_exe().expect("own path"));
    cmd.args(["serve", &PORT.to_string()])
        .stdout(Stdio::piped());
    // SAFETY: between fork and exec only async-signal-safe calls: open, write, close, unshare.
    unsafe {
        cmd.pre_exec(move || {
            let fd = libc::open(procs.as_ptr(), libc::O_WRONLY);
            if fd < 0 || libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                return Err(std::io::Error::last_os_error());
            }
            libc::close(fd);
            if libc::unshare(libc::CLONE_NEWNET) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.spawn().expect("start the container's server")
}

/// `kernel-matrix serve PORT`: loopback up, listen, tell the parent, read one request, tell
/// the parent, then wait (the request stays unanswered: in flight) until killed.
pub fn serve(port: u16) -> ! {
    let up = Command::new("ip")
        .args(["link", "set", "lo", "up"])
        .status();
    assert!(up.is_ok_and(|s| s.success()), "ip link set lo up");
    let l = std::net::TcpListener::bind(("127.0.0.1", port)).expect("bind");
    println!("listening");
    let (mut c, _) = l.accept().expect("accept");
    let mut buf = [0u8; 256];
    let n = c.read(&mut buf).expect("read");
    println!("read {n}");
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}
