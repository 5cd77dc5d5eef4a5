//! The built binary, as an operator runs it: /metrics checked by promtool, content negotiation,
//! readiness, SIGTERM, and start-up errors that are one sentence and exit code 2.

use std::{
    net::{TcpListener, TcpStream},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use drainwatch_tests::{
    agent::{Agent, binary, free_port, get, promtool_check},
    require_root,
};

#[test]
fn metrics_pass_promtool_and_negotiate_openmetrics() {
    let agent = Agent::start(&[]);
    // Move counters: a refused connect on the host's loopback touches no container, so the
    // kernel side drops it and counts it as filtered; a listener opening and closing is kept.
    let closed = free_port();
    assert!(TcpStream::connect(("127.0.0.1", closed)).is_err());
    drop(TcpListener::bind("127.0.0.1:0").unwrap());
    let deadline = Instant::now() + Duration::from_secs(10);
    let at_least = |metric: &str, n: f64| agent.metric(metric).unwrap_or(0.0) >= n;
    while !(at_least(
        "drainwatch_events_filtered_total{kind=\"inet_sk_error_report\"}",
        1.0,
    ) && at_least("drainwatch_events_total{kind=\"inet_sock_set_state\"}", 2.0))
    {
        assert!(
            Instant::now() < deadline,
            "the refused connect and the listener never reached /metrics"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    let (status, headers, plain) = get(agent.port, "/metrics", "text/plain").unwrap();
    assert_eq!(status, 200);
    let ct = headers
        .iter()
        .find(|(k, _)| k == "content-type")
        .map(|(_, v)| v.as_str());
    assert_eq!(ct, Some("text/plain; version=0.0.4; charset=utf-8"));
    for line in [
        "drainwatch_probe_attached{signal=\"resets_sent\",hook=\"tp_btf:tcp_send_reset\"} 1",
        "drainwatch_probe_attached{signal=\"accept_wait\",hook=\"kretprobe:inet_csk_accept\"} 0",
        "drainwatch_events_lost_total{stage=\"ringbuf\"} 0",
    ] {
        assert!(plain.contains(line), "missing {line:?} in:\n{plain}");
    }
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let build = format!(
        "drainwatch_build_info{{version=\"{}\",kernel=\"{}\"}} 1",
        env!("CARGO_PKG_VERSION"),
        kernel.trim()
    );
    assert!(plain.contains(&build), "missing {build:?}");

    promtool_check(&plain);

    let (status, headers, om) = get(
        agent.port,
        "/metrics",
        "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5",
    )
    .unwrap();
    assert_eq!(status, 200);
    let ct = headers
        .iter()
        .find(|(k, _)| k == "content-type")
        .map(|(_, v)| v.as_str());
    assert_eq!(
        ct,
        Some("application/openmetrics-text; version=1.0.0; charset=utf-8")
    );
    assert!(om.ends_with("# EOF\n"));
    assert_eq!(get(agent.port, "/healthz", "*/*").unwrap().0, 200);
}

#[test]
fn sigterm_detaches_and_exits_0_within_a_second() {
    let mut agent = Agent::start(&[]);
    // SAFETY: kill(2) on our own child.
    assert_eq!(
        unsafe { libc::kill(agent.child.id() as i32, libc::SIGTERM) },
        0
    );
    let sent = Instant::now();
    let status = loop {
        if let Some(s) = agent.child.try_wait().unwrap() {
            break s;
        }
        assert!(
            sent.elapsed() < Duration::from_secs(1),
            "still running 1 s after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(status.code(), Some(0), "{}", agent.stderr());
}

/// Runs the binary to completion; returns (exit code, stderr).
fn run_to_exit(cmd: &mut Command) -> (Option<i32>, String) {
    let out = cmd.stdout(Stdio::null()).output().expect("run drainwatch");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn assert_one_sentence(stderr: &str, needle: &str) {
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("drainwatch: ") && last.contains(needle),
        "last line {last:?} in:\n{stderr}"
    );
    assert!(
        !stderr.contains("panicked") && !stderr.contains("stack backtrace"),
        "{stderr}"
    );
}

#[test]
fn startup_errors_are_one_sentence_and_exit_2() {
    require_root();
    let held = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = held.local_addr().unwrap().port();
    let (code, err) =
        run_to_exit(Command::new(binary()).args(["--listen", &format!("127.0.0.1:{port}")]));
    assert_eq!(code, Some(2));
    assert_one_sentence(&err, "cannot listen on 127.0.0.1:");

    let listen = format!("127.0.0.1:{}", free_port());
    let (code, err) = run_to_exit(Command::new(binary()).args([
        "--listen",
        &listen,
        "--btf",
        "/nonexistent/vmlinux",
    ]));
    assert_eq!(code, Some(2));
    assert_one_sentence(&err, "CONFIG_DEBUG_INFO_BTF");

    let (code, err) = run_to_exit(Command::new(binary()).args([
        "--listen",
        &listen,
        "--ring-buffer-bytes",
        "5000",
    ]));
    assert_eq!(code, Some(2));
    assert_one_sentence(&err, "power of two");

    let (code, err) = run_to_exit(Command::new(binary()).args(["--listen", "not-an-address"]));
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("invalid value 'not-an-address'"), "{err}");

    let (code, err) = run_to_exit(
        Command::new("setpriv")
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "--inh-caps=-all",
            ])
            .arg(binary())
            .args(["--listen", &listen]),
    );
    assert_eq!(code, Some(2), "{err}");
    assert_one_sentence(&err, "needs root");
}

#[test]
fn every_flag_has_an_environment_variable() {
    let out = Command::new(binary()).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for var in [
        "DRAINWATCH_LISTEN",
        "DRAINWATCH_PROCFS_ROOT",
        "DRAINWATCH_CGROUPFS_ROOT",
        "DRAINWATCH_LOG_FORMAT",
        "DRAINWATCH_RING_BUFFER_BYTES",
    ] {
        assert!(help.contains(var), "--help lacks {var}:\n{help}");
    }
    // And the variable is honoured: a bad value through the environment fails like the flag.
    let (code, err) = run_to_exit(
        Command::new(binary())
            .env("DRAINWATCH_RING_BUFFER_BYTES", "5000")
            .env("DRAINWATCH_LISTEN", format!("127.0.0.1:{}", free_port())),
    );
    assert_eq!(code, Some(2), "{err}");
    assert_one_sentence(&err, "power of two");
}
