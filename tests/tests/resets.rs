//! Resets and refused connects against the kernel's own counters. A real container (podman,
//! its own network namespace) makes RSTs of three kinds (`tests/lab/rsts.py`): connects to
//! ports nothing listens on (IPv4 and IPv6), SO_LINGER-0 aborts, and sends to a connection
//! whose other end had closed. Ground truth is the namespace's `Tcp: OutRsts`
//! (`/proc/<pid>/net/snmp`, read before and after) and what the script's own sockets saw.
//! Linux keeps no counter of RSTs received (`EstabResets` counts established connections
//! closed by a RST either way, and aborts too), so received RSTs are checked against the
//! sockets' own errors: ECONNREFUSED, ECONNRESET, EPIPE.

use std::fs;

use drainwatch_tests::agent::metric_sum as sum;
use drainwatch_tests::{
    agent::{Agent, sync},
    lab::container::{Backend, BackendOpts, Mode, lab_python, podman},
    require_root, snmp_tcp,
};
use serde_json::Value;

struct Counts {
    out_rsts: u64,
    sent: f64,
    received: f64,
    refused: f64,
}

fn counts(agent: &Agent, b: &Backend) -> Counts {
    sync(agent);
    let m = agent.metrics_text();
    let c = ("container", b.container.as_str());
    Counts {
        out_rsts: snmp_tcp(b.pid, "OutRsts"),
        sent: sum(
            &m,
            "drainwatch_connection_resets_total",
            &[c, ("direction", "sent")],
        ),
        received: sum(
            &m,
            "drainwatch_connection_resets_total",
            &[c, ("direction", "received")],
        ),
        refused: sum(&m, "drainwatch_refused_connections_total", &[c]),
    }
}

#[test]
fn every_reset_and_refusal_of_a_container_equals_the_kernels_count() {
    require_root();
    const N: u64 = 40;
    // Its own namespace, as a lone container has: every RST there is this container's.
    let opts = BackendOpts {
        netns_holder: false,
        ..Default::default()
    };
    let b = Backend::start("rsts", Mode::CloseListener, opts);
    let agent = Agent::start(&[]);
    agent.wait_adopted(&b.container);
    let before = counts(&agent, &b);

    fs::copy(
        concat!(env!("CARGO_MANIFEST_DIR"), "/lab/rsts.py"),
        b.log_dir.join("rsts.py"),
    )
    .expect("copy rsts.py");
    let n = N.to_string();
    let out = podman(&["exec", &b.container, &lab_python(), "/lab/log/rsts.py", &n])
        .expect("rsts.py in the container");
    let seen: Value = serde_json::from_str(out.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("rsts.py printed {out:?}: {e}"));
    assert_eq!(seen["unexpected"], Value::Array(vec![]), "{seen}");
    let got = |k: &str| seen[k].as_u64().unwrap_or_else(|| panic!("{k} in {seen}"));
    let (refused, aborts, peer_closed) = (got("refused"), got("aborts"), got("peer_closed"));
    assert_eq!(
        (refused, aborts, peer_closed),
        (N, N, N),
        "what the sockets saw"
    );

    let after = counts(&agent, &b);
    let kernel = after.out_rsts - before.out_rsts;
    println!(
        "kernel OutRsts +{kernel}; drainwatch sent +{}, received +{}, refused +{}",
        after.sent - before.sent,
        after.received - before.received,
        after.refused - before.refused
    );
    assert_eq!(kernel, 3 * N, "the namespace's own count of RSTs sent");
    assert_eq!(
        after.sent - before.sent,
        kernel as f64,
        "resets sent = TcpOutRsts"
    );
    assert_eq!(
        after.refused - before.refused,
        refused as f64,
        "refused connects = the connects that failed ECONNREFUSED"
    );
    assert_eq!(
        after.received - before.received,
        (refused + aborts + peer_closed) as f64,
        "resets received = the sockets that failed ECONNREFUSED, ECONNRESET or EPIPE"
    );
}
