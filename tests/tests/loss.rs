//! Loss accounting: what the kernel could not hand over and what the queue could not hold are
//! counted exactly. Only the signal program is attached, and the signals are ones the test
//! sends to a child that ignores them, so the test knows how many events it generated.

use std::{os::unix::process::CommandExt, process::Command};

use drainwatch::{capture::event::Event, telemetry::LossStage};
use drainwatch_common::{
    EventKind,
    config::{BUDGET_WINDOW_NS, per_window},
};
use drainwatch_tests::Harness;

/// A child that ignores SIGINT (the disposition survives exec), so it can be sent any number.
fn sigint_ignoring_child() -> std::process::Child {
    let mut cmd = Command::new("sleep");
    cmd.arg("60");
    // SAFETY: signal(2) is async-signal-safe, as pre_exec requires.
    unsafe {
        cmd.pre_exec(|| {
            libc::signal(libc::SIGINT, libc::SIG_IGN);
            Ok(())
        });
    }
    cmd.spawn().expect("spawn sleep")
}

fn burst(pid: u32, n: u64) {
    for _ in 0..n {
        // SAFETY: kill(2) on our own child.
        assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGINT) }, 0);
    }
}

fn count(events: &[Event], pid: u32) -> (u64, u64) {
    let ours = events
        .iter()
        .filter(|e| matches!(e, Event::Signal(s) if s.target_pid == pid as i32 && s.sig == libc::SIGINT))
        .count() as u64;
    (ours, events.len() as u64 - ours)
}

#[test]
fn a_full_ring_buffer_counts_exactly_what_it_dropped() {
    const N: u64 = 2000;
    // One page: a few dozen signal records fit; the reader does not run during the burst.
    let mut h = Harness::start(&["signals"], 4096);
    let mut child = sigint_ignoring_child();
    let pid = child.id();
    burst(pid, N);
    let events = h.events();
    let (received, other) = count(&events, pid);
    let lost = h.metrics.lost_count(LossStage::Ringbuf);
    child.kill().unwrap();
    child.wait().unwrap();

    assert_eq!(
        other, 0,
        "another process sent SIGINT/TERM/KILL/QUIT during the test: {events:#?}"
    );
    assert!(
        received > 0 && lost > 0,
        "the burst must overflow a one-page buffer: received {received}, lost {lost}"
    );
    assert_eq!(lost, N - received, "lost = generated - received");
    assert_eq!(h.metrics.events_count(EventKind::SignalGenerate), received);
    assert_eq!(h.metrics.lost_count(LossStage::Queue), 0);
}

#[test]
fn a_full_queue_counts_exactly_what_it_dropped() {
    const N: u64 = 300;
    const QUEUE: usize = 10;
    let mut h = Harness::start_with_queue(&["signals"], 1 << 22, QUEUE);
    let mut child = sigint_ignoring_child();
    let pid = child.id();
    burst(pid, N);
    let events = h.events();
    child.kill().unwrap();
    child.wait().unwrap();

    let (received, other) = count(&events, pid);
    assert_eq!(other, 0, "{events:#?}");
    assert_eq!(received, QUEUE as u64, "the queue holds {QUEUE}");
    assert_eq!(
        h.metrics.events_count(EventKind::SignalGenerate),
        N,
        "all reached the reader"
    );
    assert_eq!(h.metrics.lost_count(LossStage::Queue), N - QUEUE as u64);
    assert_eq!(h.metrics.lost_count(LossStage::Ringbuf), 0);
}

#[test]
fn a_packet_flood_past_the_budget_is_shed_and_counted_exactly() {
    const N: u64 = 3000;
    const PER_CPU: u32 = 50;
    // Socket-less RSTs (connects to a closed loopback port): a packet-path hook with a
    // budget. Ground truth is the kernel's own count of RSTs it sent (`Tcp: OutRsts`).
    let mut h = Harness::start_budget(&["resets_sent"], PER_CPU);
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = closed.local_addr().expect("addr");
    drop(closed);
    let me = std::process::id();
    let before = drainwatch_tests::snmp_tcp(me, "OutRsts");
    let began = std::time::Instant::now();
    for _ in 0..N {
        let e = std::net::TcpStream::connect(addr).expect_err("nothing listens");
        assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused);
    }
    let elapsed = began.elapsed();
    let secs = elapsed.as_secs() + 1;
    // The kernel's budget is per window of 2^30 ns: the windows this run touched.
    let windows = elapsed.as_nanos() as u64 / BUDGET_WINDOW_NS + 2;
    let sent = drainwatch_tests::snmp_tcp(me, "OutRsts") - before;
    let received = h.events().len() as u64;
    let shed = h.metrics.lost_count(LossStage::Shed);
    println!("OutRsts +{sent}; received {received}, shed {shed}, in {secs} s");
    assert!(sent >= N, "the kernel sent a RST per connect: {sent}");
    assert!(
        shed > 0,
        "{N} in {secs} s is past {PER_CPU} a second per CPU"
    );
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    assert!(
        received <= u64::from(per_window(PER_CPU)) * cpus * windows,
        "the budget held: {received} received in {windows} windows"
    );
    assert_eq!(
        received + shed,
        sent,
        "received + shed = the kernel's OutRsts"
    );
    assert_eq!(h.metrics.lost_count(LossStage::Ringbuf), 0);
}
