//! The ground floor every stage may import: time, who a container is, the domain words (TCP
//! states, loss kinds, reset directions) as closed types, and the observations enrich hands to
//! correlate. Nothing here does I/O or knows a kernel layout.

pub mod activity;
pub mod deploy;
pub mod emitted;
pub mod identity;
pub mod loss;
pub mod nat;
pub mod netns;
pub mod observation;
pub mod start;
pub mod state;
pub mod stop;
pub mod storm;
pub mod streams;
pub mod tcp;

pub use emitted::{Emitted, RetryOutcome};
pub use identity::{
    ContainerIdentity, ExitInfo, PROBERS, Proxy, SANDBOX_NAME, Sender, StopPolicy, Workload,
};
pub use loss::{Loss, LossKind, ProbeLoss, ResetDirection};
pub use netns::Netns;
pub use observation::{Fact, ListenCounters, ListenSample, Observation, UpstreamStep};
pub use tcp::TcpState;

/// The maps and sets of the event path. Their keys are container ids, socket addresses and
/// tuples, hashed once or more per event: aHash with a per-map random seed instead of std's
/// SipHash, still resistant to a remote peer choosing colliding ports.
pub type HashMap<K, V> = std::collections::HashMap<K, V, ahash::RandomState>;
pub type HashSet<K> = std::collections::HashSet<K, ahash::RandomState>;

/// Kernel monotonic time, nanoseconds (`bpf_ktime_get_ns`).
pub type Mono = u64;

pub const SECOND: Mono = 1_000_000_000;

/// CLOCK_MONOTONIC now, the clock `bpf_ktime_get_ns` reads.
pub fn monotonic_now() -> Mono {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid pointer to a timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
