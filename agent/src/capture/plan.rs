//! The attach plan: for every signal drainwatch watches, an ordered list of hooks. The agent
//! tries them in order and keeps the first that attaches; what a kernel offers is learned from
//! the real attach result, never from version numbers or feature probes.

/// One way of getting a signal from the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hook {
    /// A classic tracepoint; `needs` lists format fields without which this entry is skipped
    /// (the next entry is then tried), beyond those the hook module requires anyway.
    Tracepoint {
        category: &'static str,
        /// The tracepoint (its format gives the program's field offsets).
        name: &'static str,
        /// The program attached.
        program: &'static str,
        /// More tracepoints of the same layout the same program attaches to.
        also: &'static [&'static str],
        needs: &'static [&'static str],
        /// Why the entry is only a fallback when it is the chosen one.
        degraded: Option<&'static str>,
    },
    /// A BTF-typed raw tracepoint (tp_btf): the kernel passes the tracepoint's arguments
    /// (`struct sock *` and the states, for `inet_sock_set_state`) without building a record,
    /// and the program reads the socket with plain loads. It still takes its state numbering
    /// from the classic tracepoint's format. `offsets` are BTF members it cannot do without.
    BtfTracepoint {
        /// The tracepoint; the program is `<name>_btf`.
        name: &'static str,
        program: &'static str,
        /// More (tracepoint, program) pairs attached with it, all or none.
        also: &'static [(&'static str, &'static str)],
        offsets: &'static [&'static str],
        /// What the program takes from the classic tracepoint's format (a field, or
        /// `field=SYMBOL` for a number from its symbol table): the entry is skipped when this
        /// kernel's format lacks it, as the program would attach and never match.
        needs: &'static [&'static str],
    },
    /// kprobes on every listed function (all must attach), or kretprobes when `ret`.
    Kprobe {
        functions: &'static [(&'static str, &'static str)],
        ret: bool,
    },
}

impl Hook {
    /// The `hook` label value: `tracepoint:tcp:tcp_send_reset`, `kprobe:tcp_v4_send_reset+...`.
    pub fn label(&self) -> String {
        match self {
            Hook::Tracepoint {
                category,
                name,
                also,
                ..
            } => {
                let mut l = format!("tracepoint:{category}:{name}");
                for a in *also {
                    l.push('+');
                    l.push_str(a);
                }
                l
            }
            Hook::BtfTracepoint { name, also, .. } => {
                let mut l = format!("tp_btf:{name}");
                for (a, _) in *also {
                    l.push('+');
                    l.push_str(a);
                }
                l
            }
            Hook::Kprobe { functions, ret } => {
                let kind = if *ret { "kretprobe" } else { "kprobe" };
                let names: Vec<_> = functions.iter().map(|(f, _)| *f).collect();
                format!("{kind}:{}", names.join("+"))
            }
        }
    }
}

pub struct SignalPlan {
    /// The `signal` label value.
    pub signal: &'static str,
    /// Human wording for the start-up log line.
    pub title: &'static str,
    pub hooks: &'static [Hook],
    /// What to say when nothing attached.
    pub unavailable: &'static str,
}

const fn tp(category: &'static str, name: &'static str) -> Hook {
    Hook::Tracepoint {
        category,
        name,
        program: name,
        also: &[],
        needs: &[],
        degraded: None,
    }
}

pub const PLAN: &[SignalPlan] = &[
    SignalPlan {
        signal: "resets_sent",
        title: "resets sent",
        hooks: &[
            // 6.10+: `tcp_send_reset(sk, skb, reason)`, whose BTF prototype an older kernel's
            // two-argument one fails to load against.
            Hook::BtfTracepoint {
                name: "tcp_send_reset",
                program: "tcp_send_reset_btf",
                also: &[],
                offsets: &[
                    "sock.__sk_common.skc_net",
                    "net.ns.inum",
                    "sk_buff.dev",
                    "net_device.nd_net",
                    "sk_buff.head",
                    "sk_buff.data",
                    "sk_buff.network_header",
                ],
                needs: &[],
            },
            // 6.10+ fires for socket-less resets too (and carries the reason): `reason` marks it.
            Hook::Tracepoint {
                category: "tcp",
                name: "tcp_send_reset",
                program: "tcp_send_reset",
                also: &[],
                needs: &["reason"],
                degraded: None,
            },
            Hook::Kprobe {
                functions: &[
                    ("tcp_v4_send_reset", "kprobe_tcp_v4_send_reset"),
                    ("tcp_v6_send_reset", "kprobe_tcp_v6_send_reset"),
                    ("tcp_send_active_reset", "kprobe_tcp_send_active_reset"),
                ],
                ret: false,
            },
            Hook::Tracepoint {
                category: "tcp",
                name: "tcp_send_reset",
                program: "tcp_send_reset",
                also: &[],
                needs: &[],
                degraded: Some(
                    "pre-6.10 tracepoint: misses resets that answer packets with no socket",
                ),
            },
        ],
        unavailable: "needs tracepoint tcp:tcp_send_reset or kprobes",
    },
    SignalPlan {
        signal: "resets_received",
        title: "resets received",
        hooks: &[
            Hook::BtfTracepoint {
                name: "tcp_receive_reset",
                program: "tcp_receive_reset_btf",
                also: &[],
                offsets: &["sock.__sk_common.skc_net", "net.ns.inum"],
                needs: &[],
            },
            tp("tcp", "tcp_receive_reset"),
        ],
        unavailable: "needs tracepoint tcp:tcp_receive_reset",
    },
    SignalPlan {
        signal: "socket_states",
        title: "socket states",
        hooks: &[
            Hook::BtfTracepoint {
                name: "inet_sock_set_state",
                program: "inet_sock_set_state_btf",
                also: &[],
                offsets: &[
                    "sock.sk_protocol",
                    "sock.__sk_common.skc_net",
                    "net.ns.inum",
                ],
                needs: &[],
            },
            tp("sock", "inet_sock_set_state"),
        ],
        unavailable: "needs tracepoint sock:inet_sock_set_state",
    },
    SignalPlan {
        signal: "socket_errors",
        title: "socket errors",
        hooks: &[
            Hook::BtfTracepoint {
                name: "inet_sk_error_report",
                program: "inet_sk_error_report_btf",
                also: &[],
                offsets: &[
                    "sock.sk_protocol",
                    "sock.sk_err",
                    "sock.__sk_common.skc_net",
                    "net.ns.inum",
                ],
                needs: &[],
            },
            tp("sock", "inet_sk_error_report"),
        ],
        unavailable: "needs tracepoint sock:inet_sk_error_report",
    },
    SignalPlan {
        signal: "signals",
        title: "signals",
        hooks: &[tp("signal", "signal_generate")],
        unavailable: "needs tracepoint signal:signal_generate",
    },
    SignalPlan {
        signal: "process_exits",
        title: "process exits",
        hooks: &[tp("sched", "sched_process_exit")],
        unavailable: "needs tracepoint sched:sched_process_exit",
    },
    SignalPlan {
        signal: "cgroup_removals",
        title: "cgroup removals",
        hooks: &[tp("cgroup", "cgroup_rmdir")],
        unavailable: "needs tracepoint cgroup:cgroup_rmdir",
    },
    SignalPlan {
        signal: "listen_overflows",
        title: "listen overflows",
        hooks: &[
            // 6.11+: `kfree_skb(skb, location, reason, rx_sk)`; an older kernel's prototype
            // (no `rx_sk`) fails to load against it. Every freed packet runs it: the reason
            // check comes first, with no trace record built.
            Hook::BtfTracepoint {
                name: "kfree_skb",
                program: "kfree_skb_btf",
                also: &[],
                offsets: &["sock.__sk_common.skc_net", "net.ns.inum"],
                // 6.12 has the 4-argument prototype but no TCP_LISTEN_OVERFLOW drop reason
                // (the kernel matrix found the program attached and blind there).
                needs: &["reason=TCP_LISTEN_OVERFLOW"],
            },
            tp("skb", "kfree_skb"),
            // Kernels without that drop reason: the accept-queue check where the kernel makes
            // it (see the program).
            Hook::Kprobe {
                functions: &[
                    ("tcp_v4_syn_recv_sock", "kprobe_tcp_v4_syn_recv_sock"),
                    ("tcp_v6_syn_recv_sock", "kprobe_tcp_v6_syn_recv_sock"),
                ],
                ret: false,
            },
        ],
        unavailable: "needs tracepoint skb:kfree_skb with drop reason TCP_LISTEN_OVERFLOW, or kprobes",
    },
    SignalPlan {
        signal: "accept_wait",
        title: "accept wait",
        hooks: &[
            Hook::Kprobe {
                functions: &[("inet_csk_accept", "kretprobe_inet_csk_accept")],
                ret: true,
            },
            // accept4() and accept() returning a descriptor, followed to its socket via BTF.
            Hook::Tracepoint {
                category: "syscalls",
                name: "sys_exit_accept",
                program: "sys_exit_accept",
                also: &["sys_exit_accept4"],
                needs: &[],
                degraded: None,
            },
            // The same without bpf_get_current_task_btf (5.11+), whose call the verifier of
            // 5.10 rejects: the task's network namespace by probe reads instead.
            Hook::Tracepoint {
                category: "syscalls",
                name: "sys_exit_accept",
                program: "sys_exit_accept_probe",
                also: &["sys_exit_accept4"],
                needs: &[],
                degraded: None,
            },
        ],
        unavailable: "needs kprobe, fentry or the syscalls:sys_exit_accept tracepoints",
    },
    SignalPlan {
        signal: "upstream_requests",
        title: "upstream requests",
        hooks: &[
            // 6.3+. Only proxies' upstream sockets are followed (`UPSTREAM_SOCKS`). Without
            // it no cut is judged: a retry cannot be told from a new request of equal size.
            Hook::BtfTracepoint {
                name: "sock_send_length",
                program: "sock_send_length_btf",
                // tcp_destroy_sock: a reset upstream's close by its proxy (see `sock_length`).
                also: &[
                    ("sock_recv_length", "sock_recv_length_btf"),
                    ("tcp_destroy_sock", "tcp_destroy_sock_btf"),
                ],
                offsets: &[],
                needs: &[],
            },
        ],
        unavailable: "needs tp_btf sock:sock_send_length, sock:sock_recv_length (Linux 6.3+) and tcp:tcp_destroy_sock: proxy retries and upstream aborts are not judged",
    },
];

/// What happened to one signal's plan on this kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignalStatus {
    pub signal: &'static str,
    pub title: &'static str,
    /// Every hook tried, in order, with the error of those that failed.
    pub tried: Vec<(String, Result<(), String>)>,
    /// Why the chosen hook is less than complete (missing optional fields or BTF members).
    pub degraded: Vec<String>,
    pub unavailable: &'static str,
}

impl SignalStatus {
    pub fn chosen(&self) -> Option<&str> {
        self.tried
            .iter()
            .find(|(_, r)| r.is_ok())
            .map(|(h, _)| h.as_str())
    }

    /// The one start-up log line for this signal.
    pub fn summary(&self) -> String {
        match self.chosen() {
            Some(hook) if self.degraded.is_empty() => format!("{}: {hook}", self.title),
            Some(hook) => format!(
                "{}: {hook} (degraded: {})",
                self.title,
                self.degraded.join("; ")
            ),
            None => {
                let why: Vec<_> = self
                    .tried
                    .iter()
                    .filter_map(|(h, r)| r.as_ref().err().map(|e| format!("{h}: {e}")))
                    .collect();
                format!(
                    "{}: unavailable: {} ({})",
                    self.title,
                    self.unavailable,
                    why.join("; ")
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_signal_has_hooks_and_unique_labels() {
        let mut seen = std::collections::HashSet::new();
        for p in PLAN {
            assert!(!p.hooks.is_empty(), "{}", p.signal);
            assert!(seen.insert(p.signal), "duplicate {}", p.signal);
        }
        assert_eq!(
            PLAN[0].hooks[2].label(),
            "kprobe:tcp_v4_send_reset+tcp_v6_send_reset+tcp_send_active_reset"
        );
        assert_eq!(PLAN[0].hooks[0].label(), "tp_btf:tcp_send_reset");
        assert_eq!(PLAN[0].hooks[1].label(), "tracepoint:tcp:tcp_send_reset");
        let states = PLAN.iter().find(|p| p.signal == "socket_states").unwrap();
        let labels: Vec<_> = states.hooks.iter().map(Hook::label).collect();
        assert_eq!(
            labels,
            [
                "tp_btf:inet_sock_set_state",
                "tracepoint:sock:inet_sock_set_state"
            ]
        );
        let io = PLAN
            .iter()
            .find(|p| p.signal == "upstream_requests")
            .unwrap();
        assert_eq!(
            io.hooks[0].label(),
            "tp_btf:sock_send_length+sock_recv_length+tcp_destroy_sock"
        );
    }

    #[test]
    fn summaries_read_as_one_line_per_signal() {
        let ok = SignalStatus {
            signal: "resets_sent",
            title: "resets sent",
            tried: vec![("tracepoint:tcp:tcp_send_reset".into(), Ok(()))],
            degraded: vec![],
            unavailable: "x",
        };
        assert_eq!(ok.summary(), "resets sent: tracepoint:tcp:tcp_send_reset");
        let none = SignalStatus {
            signal: "accept_wait",
            title: "accept wait",
            tried: vec![(
                "kretprobe:inet_csk_accept".into(),
                Err("kprobes are not supported by this kernel".into()),
            )],
            degraded: vec![],
            unavailable: "needs kprobe or fentry",
        };
        assert_eq!(none.chosen(), None);
        assert_eq!(
            none.summary(),
            "accept wait: unavailable: needs kprobe or fentry (kretprobe:inet_csk_accept: kprobes are not supported by this kernel)"
        );
    }
}
