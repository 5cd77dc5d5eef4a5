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
            /// Records each packet-path hook may emit per CPU per second; the rest is shed and
            /// counted (`SHED`). Lifecycle hooks (`EventKind::lifecycle`) have no budget. 0: no
            /// limit.
            pub packet_events_per_sec: u32,
            /// Non-zero (the agent): records no part of the agent reads are dropped in the
            /// kernel and counted as filtered (`FILTERED`): a loopback connect's steps after
            /// SYN_SENT but its failure (`inet_sock_set_state`), and socket error reports. 0
            /// (capture's tests) keeps them: each hook's whole story.
            pub lean: u32,
            /// Non-zero (`--hold`, experimental): a pod connection's arrival and accept wait in
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
                packet_events_per_sec: 0,
                lean: 0,
                hold: 0,
            };
        }
    };
}

crate::for_each_hook!(config);

pod!(Config);

// No implicit padding: the agent writes these bytes verbatim into the program's global.
const _: () = assert!(core::mem::size_of::<Config>() == 360);
