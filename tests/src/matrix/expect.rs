//! What each plan must choose on the running kernel, from what the kernel itself says (its
//! tracefs formats and whether the kprobe PMU exists), not from version numbers: the agent's
//! choice is checked against an independent reading of the same facts.

use std::path::{Path, PathBuf};

use drainwatch::capture::tracefs::Format;
use serde::Serialize;

use super::Loaded;

const SEND_RESET_KPROBES: &str = "kprobe:tcp_v4_send_reset+tcp_v6_send_reset+tcp_send_active_reset";
const LISTEN_OVERFLOW_KPROBES: &str = "kprobe:tcp_v4_syn_recv_sock+tcp_v6_syn_recv_sock";

/// The kernel's answers that decide the plan.
#[derive(Debug, Clone, Serialize)]
pub struct Facts {
    /// `/sys/bus/event_source/devices/kprobe` exists (CONFIG_KPROBES).
    pub kprobes: bool,
    /// `tcp:tcp_send_reset` has `reason` (6.10+: with it came the 3-argument prototype the
    /// tp_btf program reads, and socket-less resets).
    pub send_reset_reason: bool,
    /// `sock:inet_sk_error_report` exists (5.14+).
    pub error_report: bool,
    /// `skb:kfree_skb` numbers `TCP_LISTEN_OVERFLOW` among its drop reasons.
    pub listen_overflow_reason: bool,
    /// `skb:kfree_skb` has `rx_sk` (6.11+: the 4-argument prototype of the tp_btf program).
    pub kfree_skb_rx_sk: bool,
    /// `sock:sock_send_length` exists (6.3+).
    pub sock_length: bool,
    /// `/proc/kallsyms` has `bpf_get_socket_ptr_cookie`: tracing programs may call
    /// `bpf_get_socket_cookie` (5.12+), which the tp_btf `tcp_receive_reset` program does.
    pub tracing_socket_cookie: bool,
    /// Soft RLIMIT_MEMLOCK when the matrix started, in KiB (`None`: unlimited).
    pub memlock_kib: Option<u64>,
}

fn events_dir() -> PathBuf {
    [
        "/sys/kernel/tracing/events",
        "/sys/kernel/debug/tracing/events",
    ]
    .into_iter()
    .map(PathBuf::from)
    .find(|p| p.is_dir())
    .expect("tracefs is mounted")
}

fn format(dir: &Path, tp: &str) -> Option<Format> {
    let text = std::fs::read_to_string(dir.join(tp).join("format")).ok()?;
    Format::parse(&text).ok()
}

impl Facts {
    pub fn read() -> Self {
        let dir = events_dir();
        let send = format(&dir, "tcp/tcp_send_reset");
        let skb = format(&dir, "skb/kfree_skb");
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: a valid rlimit pointer.
        unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) };
        Self {
            kprobes: Path::new("/sys/bus/event_source/devices/kprobe/type").exists(),
            send_reset_reason: send.as_ref().is_some_and(|f| f.field("reason").is_some()),
            error_report: format(&dir, "sock/inet_sk_error_report").is_some(),
            listen_overflow_reason: skb
                .as_ref()
                .and_then(|f| f.symbol_value("reason", "TCP_LISTEN_OVERFLOW"))
                .is_some(),
            kfree_skb_rx_sk: skb.as_ref().is_some_and(|f| f.field("rx_sk").is_some()),
            sock_length: format(&dir, "sock/sock_send_length").is_some(),
            tracing_socket_cookie: std::fs::read_to_string("/proc/kallsyms")
                .expect("/proc/kallsyms")
                .lines()
                .any(|l| l.split_whitespace().nth(2) == Some("bpf_get_socket_ptr_cookie")),
            memlock_kib: (lim.rlim_cur != libc::RLIM_INFINITY).then_some(lim.rlim_cur / 1024),
        }
    }

    /// The hook each signal must use under `variant` (`None`: it must be unavailable).
    pub fn expected(&self, variant: &str, signal: &str) -> Option<String> {
        let classic = variant == "classic";
        let btf = |name: &str, tp: &str| {
            Some(if classic {
                tp.to_string()
            } else {
                format!("tp_btf:{name}")
            })
        };
        match signal {
            "resets_sent" if variant == "kprobes" => {
                self.kprobes.then(|| SEND_RESET_KPROBES.to_string())
            }
            "resets_sent" if self.send_reset_reason => {
                btf("tcp_send_reset", "tracepoint:tcp:tcp_send_reset")
            }
            "resets_sent" if self.kprobes && !classic => Some(SEND_RESET_KPROBES.into()),
            "resets_sent" => Some("tracepoint:tcp:tcp_send_reset".into()),
            "resets_received" if self.tracing_socket_cookie => {
                btf("tcp_receive_reset", "tracepoint:tcp:tcp_receive_reset")
            }
            "resets_received" => Some("tracepoint:tcp:tcp_receive_reset".into()),
            "socket_states" => btf("inet_sock_set_state", "tracepoint:sock:inet_sock_set_state"),
            "socket_errors" if self.error_report => btf(
                "inet_sk_error_report",
                "tracepoint:sock:inet_sk_error_report",
            ),
            "socket_errors" => None,
            "listen_overflows" if variant == "kprobes" => {
                self.kprobes.then(|| LISTEN_OVERFLOW_KPROBES.to_string())
            }
            "listen_overflows" if self.listen_overflow_reason => {
                Some(if self.kfree_skb_rx_sk && !classic {
                    "tp_btf:kfree_skb".into()
                } else {
                    "tracepoint:skb:kfree_skb".into()
                })
            }
            "listen_overflows" if self.kprobes && !classic => Some(LISTEN_OVERFLOW_KPROBES.into()),
            "listen_overflows" => None,
            "accept_wait" if self.kprobes && !classic => Some("kretprobe:inet_csk_accept".into()),
            "accept_wait" => Some("tracepoint:syscalls:sys_exit_accept+sys_exit_accept4".into()),
            "upstream_requests" if self.sock_length && !classic => {
                Some("tp_btf:sock_send_length+sock_recv_length+tcp_destroy_sock".into())
            }
            "upstream_requests" => None,
            "signals" => Some("tracepoint:signal:signal_generate".into()),
            "process_exits" => Some("tracepoint:sched:sched_process_exit".into()),
            "cgroup_removals" => Some("tracepoint:cgroup:cgroup_rmdir".into()),
            other => panic!("the matrix has no expectation for signal {other}"),
        }
    }
}

/// Every signal of the loaded plan chose what the kernel's facts say it must; a signal that
/// attaches nothing says why. Returns the chosen hooks, one line.
pub fn check_plan(facts: &Facts, l: &Loaded) -> String {
    let v = l.variant.name;
    let mut wrong = Vec::new();
    let mut out = Vec::new();
    for st in &l.h.capture.statuses {
        let want = facts.expected(v, st.signal);
        let got = st.chosen().map(str::to_string);
        if want != got {
            wrong.push(format!(
                "{}: chose {got:?}, the kernel's facts say {want:?} ({})",
                st.signal,
                st.summary()
            ));
        }
        if got.is_none() {
            // Every hook tried says why it failed; none tried only when the variant skipped
            // them all.
            assert!(
                st.tried.iter().all(|(_, r)| r.is_err())
                    && (!st.tried.is_empty() || !l.variant.skip.is_empty()),
                "{}",
                st.summary()
            );
        }
        out.push(st.summary());
    }
    assert!(wrong.is_empty(), "{}", wrong.join("; "));
    out.join("; ")
}
