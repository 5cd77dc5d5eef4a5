//! The deploy lab: real backend containers behind a real HAProxy, a scheduled load, and the
//! exact client-side ground truth of what a container stop did to the requests.
//!
//! - [`container`]: backend containers (podman + runc) running `tests/lab/backend.py` in one of
//!   five SIGTERM behaviours ([`Mode`]); stop, crash, exit code, the server's own logs.
//! - [`haproxy`]: HAProxy with active health checks in front of them; its per-request log.
//! - [`nginx`]: nginx (master and one worker) with passive health and `proxy_next_upstream`
//!   retries in front of them; its per-request access log.
//! - [`client`]: the load, as waves of slow requests on a fixed schedule; one record per request.
//! - [`scenario`]: all of it put together with a planned timeline, so the counts are known in
//!   advance (see its docs for why they are exact).
//! - [`retry`]: the same with nginx: a backend stopped mid-request, and which requests nginx
//!   ran twice (retry duplicates) or gave up on (502), exactly.
//! - [`steady`]: the same under a steady stream of same-size requests, the ground truth of
//!   each cut (duplicate, retried unexecuted, abort) read from nginx's and the backends' logs.
//! - [`steady_haproxy`]: the same behind HAProxy, with `retries 0` or L7 retries and
//!   redispatch; the ground truth from HAProxy's log (termination state, retries) and the
//!   backends' logs.
//! - [`storm`]: reconnect storms: a socket service with a bounded connect path (`Mode::Gate`),
//!   N persistent clients, the container stopped (rolling update) or restarted in place, and
//!   each client's own timing of every reconnect.
//! - [`sse`]: long-lived streams: a server-sent-events backend whose streams rotate
//!   (`Mode::Stream`), N clients that tell a clean rotation from a cut, the server stopped with
//!   a grace period above or below its rotation.
//! - [`socketio`]: a Socket.IO fleet with the real libraries (socket.io and socket.io-client
//!   from npm, run by the host's Node in podman containers): the server stopped and replaced
//!   at the same address, the clients' own logs of every session lost and reconnect.
//! - [`keepalive`]: keep-alive clients of two kinds (reuse without a check; Node's
//!   `http.Agent` pool, which drops an idle connection the server closed) against a server
//!   closing idle connections at SIGTERM, a draining one and one that never closes them.
//! - [`cri`]: a pod as Kubernetes makes it: containerd's CRI driven in the kubelet's order by
//!   a Rust client, a CNI bridge, containerd's own task exits as ground truth.
//! - [`late`]: a client in a namespace of its own whose connects to a stopped container's
//!   vanished address fail tens of seconds later (its kernel's SYN retries, or ARP giving up).
//! - [`service`]: a Kubernetes Service's virtual IP with kube-proxy's own rules (both modes),
//!   and [`pod_client`]: a client pod whose connects to it are forwarded by the host.
//! - [`sidecar`]: a pod with a mesh-like sidecar (nginx over loopback behind a pilot-agent-like
//!   wrapper), stopped in classic or native sidecar order; the sidecar's logs as ground truth.
//! - [`clock`]: `CLOCK_MONOTONIC` conversions shared with the backend's logs (and eBPF).
//! - [`net`]: lab network safety: the fallback blackhole routes of the lab subnets and the
//!   route check before sending to a container address.
//!
//! Traffic goes only to 127.0.0.1 (HAProxy, nginx) and to the containers the lab created, and
//! only while a container keeps their bridge up (see [`net`]).
//! Everything is bounded in count and time, and removed on drop (set `DRAINWATCH_LAB_KEEP` to
//! keep logs).

pub mod client;
pub mod clock;
pub mod connect;
pub mod container;
pub mod cri;
pub mod haproxy;
pub mod keepalive;
pub mod late;
pub mod net;
pub mod nginx;
pub mod pod_client;
mod proxy;
pub mod retry;
pub mod scenario;
pub mod schedule;
pub mod service;
pub mod sidecar;
pub mod socketio;
pub mod sse;
pub mod steady;
pub mod steady_haproxy;
pub mod storm;

pub use client::{Load, Method, Outcome, RequestRecord, Schedule, Summary, Wave};
pub use container::{Backend, BackendOpts, Mode, StopTimes, StreamDrain, StreamOpts};
pub use haproxy::{ConnMode, Haproxy, HaproxyOpts, HttpLog};
pub use nginx::{AccessEntry, Nginx, NginxOpts};
pub use retry::{RetryLab, RetryPlan, RetryRequest, RetryRun, RetrySpec};
pub use scenario::{Lab, Plan, ScenarioRun, ScenarioSpec, Trigger};
pub use sse::{Lifetimes, SseLab, SseRun, SseSpec, StopAt, StreamRecord};
pub use steady::{Gone, SteadyRequest, SteadyRun, Stream};
pub use steady_haproxy::{HaproxyRetry, HaproxySteadyLab, HaproxySteadyRun};
pub use storm::{Replace, StormLab, StormRun, StormSpec};
