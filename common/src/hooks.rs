//! The one list of hooks. `for_each_hook!(then)` hands the table below to the macro `then`,
//! which generates what each crate needs from it:
//! - here: `EventKind` (with `ALL`, `COUNT`, `name()`, `from_u32()`, `index()`);
//! - `config.rs`: one `Config` member per tracepoint (`<stem>::Fields`) and its `UNSET` value;
//! - the agent (`capture/mod.rs`): which tracefs format file fills which `Config` member.
//!
//! The agent's own list (`capture/event.rs`, `events!`) maps each kind to its decoded `Event`
//! variant; its `match` on `EventKind` is exhaustive, so a kind without a decoder does not build.

/// Calls `$then! { kinds { .. } tracepoints { .. } }` with the table of hooks.
///
/// - `kinds`: `<number> => <EventKind variant>, <stem>;` — the number every record's header
///   carries (1, 2, 3, … in order: it indexes the per-kind counter arrays), and the module
///   (`common/src/<stem>.rs`) whose `Event` the kind's records are.
/// - `tracepoints`: `<tracefs category> / <stem>;` — classic tracepoints whose format fields a
///   program reads: `common/src/<stem>.rs` has their `Fields`, `Config` a member `<stem>`, and
///   the agent fills it with `capture::hooks::<stem>::fields` from
///   `events/<category>/<stem>/format`. The order is `Config`'s layout.
#[macro_export]
macro_rules! for_each_hook {
    ($then:ident) => {
        $then! {
            kinds {
                1 => TcpSendReset, tcp_send_reset;
                2 => TcpReceiveReset, tcp_receive_reset;
                3 => InetSockSetState, inet_sock_set_state;
                4 => InetSkErrorReport, inet_sk_error_report;
                5 => SignalGenerate, signal_generate;
                6 => SchedProcessExit, sched_process_exit;
                7 => CgroupRmdir, cgroup_rmdir;
                8 => KfreeSkb, kfree_skb;
                9 => InetCskAccept, inet_csk_accept;
                // tp_btf only (sock_send_length + sock_recv_length): no format fields read.
                10 => SockLength, sock_length;
            }
            tracepoints {
                tcp / tcp_send_reset;
                tcp / tcp_receive_reset;
                sock / inet_sock_set_state;
                sock / inet_sk_error_report;
                signal / signal_generate;
                sched / sched_process_exit;
                cgroup / cgroup_rmdir;
                skb / kfree_skb;
                // Emits `inet_csk_accept` events.
                syscalls / sys_exit_accept;
            }
        }
    };
}

/// `EventKind` from the table's `kinds`.
macro_rules! event_kinds {
    (
        kinds { $($num:literal => $kind:ident, $stem:ident;)* }
        tracepoints { $($_t:tt)* }
    ) => {
        /// Which hook produced an event; the first field of every record.
        #[repr(u32)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum EventKind {
            $(
                #[doc = concat!("`", stringify!($stem), "`")]
                $kind = $num,
            )*
        }

        impl EventKind {
            pub const COUNT: u32 = [$($num),*].len() as u32;

            pub const ALL: [EventKind; EventKind::COUNT as usize] = [$(EventKind::$kind),*];

            pub fn from_u32(v: u32) -> Option<Self> {
                match v {
                    $($num => Some(EventKind::$kind),)*
                    _ => None,
                }
            }

            /// Index into per-kind arrays (loss counters), 0-based.
            pub const fn index(self) -> usize {
                self as usize - 1
            }

            /// The hook's stem: `tcp_send_reset`. Also the `kind` label value of metrics.
            pub const fn name(self) -> &'static str {
                match self {
                    $(EventKind::$kind => stringify!($stem),)*
                }
            }
        }

        // Numbered 1, 2, 3, … in table order: `index()` addresses arrays of `COUNT` entries.
        const _: () = {
            let mut i = 0;
            while i < EventKind::ALL.len() {
                assert!(EventKind::ALL[i].index() == i);
                i += 1;
            }
        };
    };
}

for_each_hook!(event_kinds);

impl EventKind {
    /// A container's lifecycle (signals, exits, cgroup removals): what every stop record is
    /// built on, rare next to packet-path records. Their records have a ring buffer of their
    /// own and no per-CPU budget, so that a flood of packets cannot crowd them out.
    pub const fn lifecycle(self) -> bool {
        matches!(
            self,
            EventKind::SignalGenerate | EventKind::SchedProcessExit | EventKind::CgroupRmdir
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_round_trip_and_name_their_hooks() {
        assert_eq!(EventKind::COUNT, 10);
        for k in EventKind::ALL {
            assert_eq!(EventKind::from_u32(k as u32), Some(k));
        }
        assert_eq!(EventKind::from_u32(0), None);
        assert_eq!(EventKind::from_u32(11), None);
        assert_eq!(EventKind::SockLength.name(), "sock_length");
        assert_eq!(EventKind::TcpSendReset.name(), "tcp_send_reset");
        assert_eq!(EventKind::InetCskAccept.name(), "inet_csk_accept");
    }
}
