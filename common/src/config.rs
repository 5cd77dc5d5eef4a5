//! What the agent learns at start-up and hands to the programs as one global: tracepoint field
//! offsets from tracefs format files (one member per tracepoint of the hook table, see
//! `hooks.rs`), kernel struct offsets from BTF, and filters.

use crate::fields::KernelOffsets;

/// `Config` and `Config::UNSET` from the table's `tracepoints`.
macro_rules! config {
    (
        kinds { $($_k:tt)* }
        tracepoints { $($category:ident / $stem:ident;)* }
    ) => {
        #[repr(C)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub struct Config {
            pub kernel: KernelOffsets,
            $(
                #[doc = concat!(
                    "Field offsets of `", stringify!($category), ":", stringify!($stem), "`."
                )]
                pub $stem: crate::$stem::Fields,
            )*
            /// Network namespace inode of the host (the agent's own). Connections in it that
            /// touch no container (see `watch`) are counted and dropped in the kernel; 0 passes
            /// everything.
            pub host_netns: u32,
            /// Non-zero: every program returns at once (`--attach-only`, a benchmark floor: what
            /// the hooks cost the kernel before any of the programs' work).
            pub attach_only: u32,
            /// How soon after a cut the same worker's next upstream action counts as its retry
            /// (`sock_length`), in microseconds.
            pub retry_window_us: u32,
            /// Records each packet-path hook may emit per CPU per window of 2^30 ns (1.07 s:
            /// a shift of the clock, where a second would cost a division per record); the
            /// rest is shed and counted (`SHED`). Lifecycle hooks (`EventKind::lifecycle`)
            /// have no budget. 0: no limit. See [`per_window`].
            pub packet_events_per_window: u32,
            /// Non-zero (the agent): records no part of the agent reads are dropped in the
            /// kernel and counted as filtered (`FILTERED`): a loopback connect's steps after
            /// SYN_SENT but its failure (`inet_sock_set_state`), and socket error reports. 0
            /// (capture's tests) keeps them: each hook's whole story.
            pub lean: u32,
            /// Non-zero (`--hold`, on by default): a pod connection's arrival and accept wait in
            /// the kernel (`HOLD`) for its next record to carry them (`inet_sock_set_state::Held`).
            pub hold: u32,
        }

        impl Config {
            /// Nothing resolved: every program emits nothing until the agent overrides this.
            pub const UNSET: Self = Self {
                kernel: KernelOffsets::UNRESOLVED,
                $($stem: crate::$stem::Fields::ABSENT,)*
                host_netns: 0,
                attach_only: 0,
                retry_window_us: 0,
                packet_events_per_window: 0,
                lean: 0,
                hold: 0,
            };
        }
    };
}

crate::for_each_hook!(config);

/// The budget window's length, in nanoseconds.
pub const BUDGET_WINDOW_NS: u64 = 1 << 30;

/// A per-second budget as `Config::packet_events_per_window` (rounded up).
pub fn per_window(per_sec: u32) -> u32 {
    let n = (u64::from(per_sec) * BUDGET_WINDOW_NS).div_ceil(1_000_000_000);
    u32::try_from(n).unwrap_or(u32::MAX)
}

pod!(Config);

// No implicit padding: the agent writes these bytes verbatim into the program's global.
const _: () = assert!(core::mem::size_of::<Config>() == 380);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_per_second_budget_scales_to_the_window() {
        assert_eq!(per_window(0), 0);
        // 200,000 a second for 1.073741824 s, rounded up.
        assert_eq!(per_window(200_000), 214_749);
        assert_eq!(per_window(u32::MAX), u32::MAX);
    }
}
