//! Reconnect storms with real containers: a socket service whose connect path is bounded
//! (`backend.py --mode gate`: `workers` concurrent "authorisations" of `auth` each, 10 × 20 ms =
//! 500 connects/s), a fleet of N persistent clients connected to it, the container stopped (a
//! rolling update: the clients come back to a replacement of the same workload) or restarted in
//! place (they come back to it), and each client's own measurements of every connection.
//!
//! What the clients measure, per connection (all on `CLOCK_MONOTONIC`, the clock of eBPF):
//! - `start`: just before `connect()`; `connected`: `connect()` returned (the SYN-ACK arrived:
//!   the server's side of the handshake completes with the ACK sent right then, microseconds
//!   later on the bridge); `greeted`: the greeting line arrived;
//! - the SYN retransmissions the handshake needed (`TCP_INFO`): a SYN the listener dropped
//!   puts seconds into the client's wait that no accept queue holds.
//!
//! The kernel's accept wait runs from handshake completion to `accept()` returning. The server
//! then authorises for `auth` and greets, so the client's measure of the same interval is
//! `greeted - connected - auth` ([`StormRun::client_waits`]): the handshake, which can include
//! SYN retransmissions, is left out on purpose. What remains besides the queue wait is the
//! server's own overhead after `accept()` (the GIL, the sleep's overshoot, the send) and the
//! client's delay noticing two events instead of one: milliseconds, against waits of seconds.
//!
//! Everything is bounded (`StormSpec::bound`); traffic goes only to the lab's own containers.

use std::{
    fs,
    io::Read,
    net::SocketAddrV4,
    os::fd::AsRawFd,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, BufReader},
    net::{TcpSocket, TcpStream},
    sync::{Semaphore, watch},
};

use super::{
    clock::{self, secs_since},
    container::{Backend, BackendOpts, Mode, StopTimes, unique_name},
};

/// The label drainwatch names a workload by outside Kubernetes.
pub const COMPOSE_SERVICE: &str = "com.docker.compose.service";

/// What happens to the server the clients are connected to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Replace {
    /// A second container of the same workload is up; the first is `podman stop`ped and the
    /// clients reconnect to the second.
    Rolling,
    /// The container is `podman restart`ed; the clients reconnect to it (same address).
    InPlace,
}

#[derive(Clone, Debug)]
pub struct StormSpec {
    pub clients: usize,
    /// Each client waits a delay uniform in `[jitter.0, jitter.1)` after losing its connection
    /// (and again after each failed attempt) before reconnecting.
    pub jitter: (Duration, Duration),
    pub replace: Replace,
    /// `com.docker.compose.service` of the containers.
    pub workload: String,
    /// `listen()` backlog: large enough that nothing overflows unless a test wants it to.
    pub backlog: u32,
    pub workers: u32,
    pub auth: Duration,
    pub grace_secs: u32,
    /// Seed of the clients' jitter: every run draws the same delays.
    pub seed: u64,
    /// Bound on each phase (fleet up, fleet back).
    pub bound: Duration,
}

impl StormSpec {
    /// `clients` clients, 10 authorisations of 20 ms (500 connects/s), backlog 4096.
    pub fn new(clients: usize, jitter: (Duration, Duration), replace: Replace) -> StormSpec {
        StormSpec {
            clients,
            jitter,
            replace,
            workload: unique_name("ws"),
            backlog: 4096,
            workers: 10,
            auth: Duration::from_millis(20),
            grace_secs: 10,
            seed: 0x5eed_0005,
            bound: Duration::from_secs(40),
        }
    }

    /// The connect rate the server is built for: workers ÷ auth.
    pub fn capacity(&self) -> f64 {
        self.workers as f64 / self.auth.as_secs_f64()
    }
}

/// One connection attempt of one client.
#[derive(Clone, Debug)]
pub struct Attempt {
    pub client: usize,
    /// 0: the first connection (to the old server); 1, 2, ...: after losing it.
    pub seq: u32,
    pub target: SocketAddrV4,
    /// The client's own address of the connection (once connected).
    pub local: Option<std::net::SocketAddr>,
    /// When the client meant to start (loss + jitter); `start` is when it did.
    pub scheduled: Instant,
    pub start: Instant,
    pub connected: Option<Instant>,
    /// `connect()` failed: when, and how. `ConnectionReset` means the handshake completed and
    /// the listener reset the connection before `connect()` reported it (a listener closing
    /// with connections in its queue); `ConnectionRefused`, that nothing listened.
    pub connect_failed: Option<(Instant, std::io::ErrorKind)>,
    pub greeted: Option<Instant>,
    /// From the greeting: when the server's `accept()` returned to python, and when it sent the
    /// greeting (`CLOCK_MONOTONIC` ns).
    pub server_accepted_ns: Option<u64>,
    pub server_sent_ns: Option<u64>,
    /// SYN retransmissions of the handshake (`tcpi_total_retrans` right after connecting).
    pub syn_retrans: u32,
    /// When the client saw the connection end (EOF or reset).
    pub lost: Option<Instant>,
    pub error: Option<String>,
}

/// First connections in flight at once while the fleet connects to the old server.
const FILL_IN_FLIGHT: usize = 100;

impl Attempt {
    /// When the handshake had completed at the latest: `connect()` returned it, or reported
    /// the reset that followed it. None when it never completed.
    pub fn handshake_by(&self) -> Option<Instant> {
        self.connected.or(match self.connect_failed {
            Some((at, std::io::ErrorKind::ConnectionReset)) => Some(at),
            _ => None,
        })
    }
}

#[derive(Default)]
struct Counts {
    up: AtomicUsize,
    back: AtomicUsize,
}

/// The clients, running on their own thread (a current-thread tokio runtime).
pub struct Fleet {
    counts: Arc<Counts>,
    stop: watch::Sender<bool>,
    thread: Option<JoinHandle<Vec<Attempt>>>,
}

impl Fleet {
    /// Starts `spec.clients` clients connecting to `first`; each reconnects to `then` once its
    /// connection ends, and holds that connection until [`Fleet::finish`].
    pub fn start(spec: &StormSpec, first: SocketAddrV4, then: SocketAddrV4) -> Fleet {
        raise_nofile(spec.clients as u64 * 2 + 512);
        let counts = Arc::new(Counts::default());
        let (stop, stop_rx) = watch::channel(false);
        let (n, jitter, seed, bound) = (spec.clients, spec.jitter, spec.seed, spec.bound * 3);
        let c = counts.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("tokio runtime");
            rt.block_on(async move {
                let deadline = tokio::time::Instant::now() + bound;
                // The first connections are paced: never more than FILL_IN_FLIGHT waiting, so
                // filling the old server queues little and overflows no backlog.
                let fill = Arc::new(Semaphore::new(FILL_IN_FLIGHT));
                let mut set = tokio::task::JoinSet::new();
                for i in 0..n {
                    let rng = fastrand::Rng::with_seed(seed.wrapping_add(i as u64));
                    let plan = Client {
                        i,
                        first,
                        then,
                        jitter,
                        rng,
                    };
                    let (c, stop, fill) = (c.clone(), stop_rx.clone(), fill.clone());
                    set.spawn(async move {
                        let mut out = Vec::new();
                        let run = plan.run(&c, &fill, stop, &mut out);
                        let _ = tokio::time::timeout_at(deadline, run).await;
                        out
                    });
                }
                let mut all = Vec::new();
                while let Some(r) = set.join_next().await {
                    all.extend(r.expect("client task"));
                }
                all
            })
        });
        Fleet {
            counts,
            stop,
            thread: Some(thread),
        }
    }

    /// Clients greeted on their first connection so far.
    pub fn up(&self) -> usize {
        self.counts.up.load(Ordering::Relaxed)
    }

    /// Clients greeted again after losing their first connection so far.
    pub fn back(&self) -> usize {
        self.counts.back.load(Ordering::Relaxed)
    }

    /// Waits (bounded) until `count()` reaches `n`; false on timeout.
    pub fn wait_for(&self, n: usize, count: impl Fn(&Fleet) -> usize, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while count(self) < n {
            if Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        true
    }

    /// Closes every connection and returns every attempt, by client then sequence.
    pub fn finish(mut self) -> Vec<Attempt> {
        let _ = self.stop.send(true);
        let mut all = self
            .thread
            .take()
            .expect("finished once")
            .join()
            .expect("fleet thread");
        all.sort_by_key(|a| (a.client, a.seq));
        all
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct Client {
    i: usize,
    first: SocketAddrV4,
    then: SocketAddrV4,
    jitter: (Duration, Duration),
    rng: fastrand::Rng,
}

impl Client {
    async fn run(
        mut self,
        counts: &Counts,
        fill: &Semaphore,
        mut stop: watch::Receiver<bool>,
        out: &mut Vec<Attempt>,
    ) {
        let Ok(permit) = fill.acquire().await else {
            return;
        };
        let now = Instant::now();
        let (rec, conn) = attempt(self.i, 0, self.first, now).await;
        drop(permit);
        out.push(rec);
        let Some(mut conn) = conn else { return };
        counts.up.fetch_add(1, Ordering::Relaxed);
        let mut lost = tokio::select! {
            at = until_lost(&mut conn) => at,
            _ = stop.changed() => return,
        };
        drop(conn);
        out.last_mut().expect("pushed").lost = Some(lost);
        for seq in 1.. {
            let (lo, hi) = self.jitter;
            let delay = lo + (hi - lo).mul_f64(self.rng.f64());
            let scheduled = lost + delay;
            tokio::select! {
                _ = tokio::time::sleep_until(scheduled.into()) => {}
                _ = stop.changed() => return,
            }
            let (rec, conn) = tokio::select! {
                r = attempt(self.i, seq, self.then, scheduled) => r,
                _ = stop.changed() => return,
            };
            out.push(rec);
            if let Some(conn) = conn {
                counts.back.fetch_add(1, Ordering::Relaxed);
                // Held until the test is done with it.
                let _ = stop.changed().await;
                drop(conn);
                return;
            }
            // Refused (a restart in place, before the server listens again): retry later.
            lost = Instant::now();
        }
    }
}

/// One connection: connect, `TCP_INFO`, the greeting line. The stream on success.
async fn attempt(
    client: usize,
    seq: u32,
    target: SocketAddrV4,
    scheduled: Instant,
) -> (Attempt, Option<BufReader<TcpStream>>) {
    let mut rec = Attempt {
        client,
        seq,
        target,
        local: None,
        scheduled,
        start: Instant::now(),
        connected: None,
        connect_failed: None,
        greeted: None,
        server_accepted_ns: None,
        server_sent_ns: None,
        syn_retrans: 0,
        lost: None,
        error: None,
    };
    let sock = match TcpSocket::new_v4() {
        Ok(s) => s,
        Err(e) => {
            rec.error = Some(format!("socket: {e}"));
            return (rec, None);
        }
    };
    rec.start = Instant::now();
    let stream = match sock.connect(target.into()).await {
        Ok(s) => s,
        Err(e) => {
            rec.connect_failed = Some((Instant::now(), e.kind()));
            rec.error = Some(format!("connect: {e}"));
            return (rec, None);
        }
    };
    rec.connected = Some(Instant::now());
    rec.local = stream.local_addr().ok();
    rec.syn_retrans = total_retrans(&stream);
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    match reader.read_line(&mut line).await {
        Ok(_) if line.starts_with("hello ") && line.ends_with('\n') => {
            rec.greeted = Some(Instant::now());
            let f: Vec<&str> = line.split_whitespace().collect();
            rec.server_accepted_ns = f.get(2).and_then(|v| v.parse().ok());
            rec.server_sent_ns = f.get(3).and_then(|v| v.parse().ok());
            (rec, Some(reader))
        }
        Ok(_) => {
            rec.error = Some(format!("no greeting: {line:?}"));
            rec.lost = Some(Instant::now());
            (rec, None)
        }
        Err(e) => {
            rec.error = Some(format!("read: {e}"));
            rec.lost = Some(Instant::now());
            (rec, None)
        }
    }
}

/// Reads until the server ends the connection (EOF or reset); when it did.
async fn until_lost(conn: &mut BufReader<TcpStream>) -> Instant {
    let mut buf = [0u8; 256];
    loop {
        match conn.read(&mut buf).await {
            Ok(0) | Err(_) => return Instant::now(),
            Ok(_) => {}
        }
    }
}

/// `tcpi_total_retrans` of a just-connected socket: its SYN retransmissions.
fn total_retrans(s: &TcpStream) -> u32 {
    // SAFETY: `info` is a writable tcp_info and `len` its size, as getsockopt(2) expects.
    unsafe {
        let mut info: libc::tcp_info = std::mem::zeroed();
        let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
        let rc = libc::getsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        );
        if rc == 0 { info.tcpi_total_retrans } else { 0 }
    }
}

/// Raises this process's soft `RLIMIT_NOFILE` to at least `want` (within the hard limit).
pub fn raise_nofile(want: u64) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid rlimit for getrlimit/setrlimit.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
        if lim.rlim_cur < want {
            assert!(
                lim.rlim_max >= want,
                "RLIMIT_NOFILE hard limit {} < {want} descriptors the fleet needs",
                lim.rlim_max
            );
            lim.rlim_cur = want;
            assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0);
        }
    }
}

/// The accept-queue depth of the listener on `port` in `pid`'s network namespace, read from
/// `/proc/<pid>/net/tcp` (for a LISTEN socket the rx_queue column is the current backlog).
/// Listening sockets come first in that file, so one 4 KiB read covers them without making
/// the kernel print every established connection.
pub fn accept_queue_depth(pid: u32, port: u16) -> Option<u32> {
    let mut f = fs::File::open(format!("/proc/{pid}/net/tcp")).ok()?;
    let mut buf = vec![0u8; 4096];
    let n = f.read(&mut buf).ok()?;
    let text = String::from_utf8_lossy(&buf[..n]);
    text.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        let local_port = f.get(1)?.rsplit(':').next()?;
        (f.get(3)? == &"0A" && u16::from_str_radix(local_port, 16).ok()? == port).then_some(())?;
        let rx = f.get(4)?.split(':').nth(1)?;
        u32::from_str_radix(rx, 16).ok()
    })
}

/// `TcpExt` counters of `pid`'s network namespace (`/proc/<pid>/net/netstat`), e.g.
/// `ListenOverflows`.
pub fn tcp_ext(pid: u32, name: &str) -> Option<u64> {
    let text = fs::read_to_string(format!("/proc/{pid}/net/netstat")).ok()?;
    let lines: Vec<&str> = text.lines().filter(|l| l.starts_with("TcpExt:")).collect();
    let (names, values) = (lines.first()?, lines.get(1)?);
    let i = names.split_whitespace().position(|n| n == name)?;
    values.split_whitespace().nth(i)?.parse().ok()
}

/// Samples a listener's accept-queue depth every `every` on its own thread.
struct QueueSampler {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Vec<(Instant, u32)>>,
}

impl QueueSampler {
    fn start(pid: u32, port: u16, every: Duration) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut out = Vec::new();
            while !s.load(Ordering::Relaxed) {
                if let Some(d) = accept_queue_depth(pid, port) {
                    out.push((Instant::now(), d));
                }
                std::thread::sleep(every);
            }
            out
        });
        Self { stop, thread }
    }

    fn finish(self) -> Vec<(Instant, u32)> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("sampler")
    }
}

/// The old container and, for a rolling update, its replacement. Dropping it removes both.
pub struct StormLab {
    pub spec: StormSpec,
    pub old: Backend,
    pub new: Option<Backend>,
}

/// The ground truth of one storm.
pub struct StormRun {
    pub spec: StormSpec,
    /// `podman stop` (rolling) or `podman restart` (in place): issued and returned.
    pub stop: StopTimes,
    /// Every attempt of every client, by client then sequence.
    pub attempts: Vec<Attempt>,
    /// The old container's exit code (rolling; a restarted one is running again).
    pub old_exit_code: Option<i32>,
    /// Accept-queue depth of the listener the clients came back to, sampled every 10 ms.
    pub queue: Vec<(Instant, u32)>,
    /// `ListenOverflows` of the namespace the clients came back to, during the storm.
    pub listen_overflows: u64,
    /// The container the clients came back to (name, id).
    pub target_container: String,
    pub target_id: String,
}

fn gate_opts(spec: &StormSpec) -> BackendOpts {
    BackendOpts {
        labels: vec![(COMPOSE_SERVICE.into(), spec.workload.clone())],
        backlog: Some(spec.backlog),
        gate_workers: Some(spec.workers),
        gate_auth: Some(spec.auth),
        ..BackendOpts::default()
    }
}

impl StormLab {
    pub fn setup(spec: StormSpec) -> StormLab {
        let old = Backend::start("old", Mode::Gate, gate_opts(&spec));
        let new = (spec.replace == Replace::Rolling)
            .then(|| Backend::start("new", Mode::Gate, gate_opts(&spec)));
        StormLab { spec, old, new }
    }

    /// Connects the fleet to the old server, stops (or restarts) it, waits until every client
    /// is back and greeted, and collects the ground truth. Once per lab.
    pub fn run(&mut self) -> StormRun {
        let spec = self.spec.clone();
        let target = self.new.as_ref().unwrap_or(&self.old);
        let (then, port) = (target.addr(), target.port);
        let (target_container, target_id) = (target.container.clone(), target.id.clone());
        let ns_pid = target.netns_pid();
        let fleet = Fleet::start(&spec, self.old.addr(), then);
        let n = spec.clients;
        assert!(
            fleet.wait_for(n, Fleet::up, spec.bound),
            "only {} of {n} clients connected to the old server within {:?}",
            fleet.up(),
            spec.bound
        );
        let overflows_before = tcp_ext(ns_pid, "ListenOverflows").expect("ListenOverflows");
        let sampler = QueueSampler::start(ns_pid, port, Duration::from_millis(10));
        let (stop, old_exit_code) = match spec.replace {
            Replace::Rolling => {
                let st = self.old.stop(spec.grace_secs);
                (st, Some(self.old.exit_code()))
            }
            Replace::InPlace => (self.old.restart(spec.grace_secs, spec.bound), None),
        };
        let all_back = fleet.wait_for(n, Fleet::back, spec.bound);
        let back = fleet.back();
        let queue = sampler.finish();
        let overflows_after = tcp_ext(ns_pid, "ListenOverflows").expect("ListenOverflows");
        let attempts = fleet.finish();
        let run = StormRun {
            spec,
            stop,
            attempts,
            old_exit_code,
            queue,
            listen_overflows: overflows_after - overflows_before,
            target_container,
            target_id,
        };
        assert!(
            all_back,
            "only {back} of {n} clients came back within {:?}\n{}",
            run.spec.bound,
            run.report()
        );
        run
    }
}

/// Nearest-rank quantile of sorted values (the agent's definition).
pub fn quantile(sorted: &[f64], q: f64) -> Option<f64> {
    let n = sorted.len();
    (n > 0).then(|| sorted[((q * n as f64).ceil() as usize).clamp(1, n) - 1])
}

fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(f64::total_cmp);
    v
}

impl StormRun {
    /// Attempts after the stop (the reconnects), in order of `start`.
    pub fn reconnects(&self) -> Vec<&Attempt> {
        let mut v: Vec<&Attempt> = self.attempts.iter().filter(|a| a.seq > 0).collect();
        v.sort_by_key(|a| a.start);
        v
    }

    /// Reconnects whose handshake completed: the arrivals the listener saw, in order of
    /// [`Attempt::handshake_by`].
    pub fn arrivals(&self) -> Vec<&Attempt> {
        let mut v: Vec<&Attempt> = self
            .reconnects()
            .into_iter()
            .filter(|a| a.handshake_by().is_some())
            .collect();
        v.sort_by_key(|a| a.handshake_by());
        v
    }

    /// Clients that came back and were greeted.
    pub fn clients_back(&self) -> usize {
        self.reconnects()
            .iter()
            .filter(|a| a.greeted.is_some())
            .count()
    }

    /// Reconnects whose `connect()` failed with `kind`.
    pub fn connects_failed(&self, kind: std::io::ErrorKind) -> usize {
        self.reconnects()
            .iter()
            .filter(|a| a.connect_failed.is_some_and(|(_, k)| k == kind))
            .count()
    }

    /// Reconnects refused: nothing listened.
    pub fn refused(&self) -> usize {
        self.connects_failed(std::io::ErrorKind::ConnectionRefused)
    }

    /// Reconnects whose handshake completed with a listener that then closed, resetting them
    /// before `connect()` returned: arrivals no client counts as a connection.
    pub fn reset_in_handshake(&self) -> usize {
        self.connects_failed(std::io::ErrorKind::ConnectionReset)
    }

    /// The client's measure of the accept wait, per greeted reconnect, sorted (seconds):
    /// `greeted - connected - auth` (see the module docs).
    pub fn client_waits(&self) -> Vec<f64> {
        let auth = self.spec.auth.as_secs_f64();
        sorted(
            self.reconnects()
                .iter()
                .filter_map(|a| Some((a.greeted? - a.connected?).as_secs_f64() - auth))
                .collect(),
        )
    }

    /// Connect latency as a client experiences it: `connect()` start to greeting (seconds).
    pub fn connect_latencies(&self) -> Vec<f64> {
        sorted(
            self.reconnects()
                .iter()
                .filter_map(|a| Some((a.greeted? - a.start).as_secs_f64()))
                .collect(),
        )
    }

    /// `connect()` start to `connect()` returned: the handshake (seconds).
    pub fn handshakes(&self) -> Vec<f64> {
        sorted(
            self.reconnects()
                .iter()
                .filter_map(|a| Some((a.connected? - a.start).as_secs_f64()))
                .collect(),
        )
    }

    /// The server's view of the wait: its python `accept()` returned (from the greeting) minus
    /// the client's `connect()` returned (seconds).
    pub fn server_waits(&self) -> Vec<f64> {
        sorted(
            self.reconnects()
                .iter()
                .filter_map(|a| {
                    let acc = a.server_accepted_ns? as f64 / 1e9;
                    Some(acc - clock::mono_ns_of(a.connected?) as f64 / 1e9)
                })
                .collect(),
        )
    }

    /// Connects per second the server sustained while it had a backlog: greetings' accept
    /// times, first to last.
    pub fn server_accept_rate(&self) -> Option<f64> {
        let mut acc: Vec<u64> = self
            .reconnects()
            .iter()
            .filter_map(|a| a.server_accepted_ns)
            .collect();
        acc.sort_unstable();
        let (first, last) = (*acc.first()?, *acc.last()?);
        (last > first).then(|| (acc.len() - 1) as f64 / ((last - first) as f64 / 1e9))
    }

    /// Reconnects whose handshake needed SYN retransmissions.
    pub fn syn_retransmitted(&self) -> usize {
        self.reconnects()
            .iter()
            .filter(|a| a.syn_retrans > 0)
            .count()
    }

    /// First arrival to the arrival that completes 95% (client-side), seconds.
    pub fn seconds_to_95(&self) -> Option<f64> {
        let a = self.arrivals();
        let i = ((a.len() as f64 * 0.95).ceil() as usize).clamp(1, a.len().max(1)) - 1;
        Some((a.get(i)?.handshake_by()? - a.first()?.handshake_by()?).as_secs_f64())
    }

    /// Bounds on the listener's first-arrival-to-95% time: each handshake completed between
    /// its `start` and `connected`, so the i-th completion lies between the i-th start and the
    /// i-th `connected` (sorted separately).
    pub fn seconds_to_95_bounds(&self) -> Option<(f64, f64)> {
        let a = self.arrivals();
        let mut starts: Vec<Instant> = a.iter().map(|a| a.start).collect();
        let mut conns: Vec<Instant> = a.iter().filter_map(|a| a.handshake_by()).collect();
        starts.sort_unstable();
        conns.sort_unstable();
        let i = ((a.len() as f64 * 0.95).ceil() as usize).clamp(1, a.len().max(1)) - 1;
        let lo = starts.get(i)?.saturating_duration_since(*conns.first()?);
        let hi = conns.get(i)?.saturating_duration_since(*starts.first()?);
        Some((lo.as_secs_f64(), hi.as_secs_f64()))
    }

    pub fn max_queue(&self) -> (u32, Option<Instant>) {
        self.queue
            .iter()
            .max_by_key(|(_, d)| *d)
            .map_or((0, None), |(t, d)| (*d, Some(*t)))
    }

    /// The ground truth as text: timeline (seconds from the stop command), distributions.
    pub fn report(&self) -> String {
        let base = self.stop.issued;
        let t = |i: Instant| format!("{:+.3}s", secs_since(base, i));
        let opt = |i: Option<Instant>| i.map_or("-".to_string(), t);
        let q = |v: &[f64]| {
            format!(
                "p50 {} p95 {} max {} (n {})",
                fmt_s(quantile(v, 0.5)),
                fmt_s(quantile(v, 0.95)),
                fmt_s(v.last().copied()),
                v.len()
            )
        };
        let mut s = String::new();
        s += &format!(
            "storm lab: {} clients, jitter {:.3}..{:.3}s, {:?}, {} workers x {:?} = {:.0} connects/s, backlog {}, workload {}, target {}\n",
            self.spec.clients,
            self.spec.jitter.0.as_secs_f64(),
            self.spec.jitter.1.as_secs_f64(),
            self.spec.replace,
            self.spec.workers,
            self.spec.auth,
            self.spec.capacity(),
            self.spec.backlog,
            self.spec.workload,
            self.target_container
        );
        let lost: Vec<Instant> = self
            .attempts
            .iter()
            .filter(|a| a.seq == 0)
            .filter_map(|a| a.lost)
            .collect();
        let re = self.reconnects();
        let arrivals = self.arrivals();
        let late = re
            .iter()
            .map(|a| a.start.saturating_duration_since(a.scheduled))
            .max()
            .unwrap_or_default();
        s += &format!(
            "timeline (0 = stop command): returned {}; connections lost {} .. {}; reconnects scheduled {} .. {} (start lateness max {:.1} ms); arrivals {} .. {} (95% after {}); greeted last {}\n",
            t(self.stop.returned),
            opt(lost.iter().min().copied()),
            opt(lost.iter().max().copied()),
            opt(re.iter().map(|a| a.scheduled).min()),
            opt(re.iter().map(|a| a.scheduled).max()),
            late.as_secs_f64() * 1e3,
            opt(arrivals.first().and_then(|a| a.handshake_by())),
            opt(arrivals.last().and_then(|a| a.handshake_by())),
            fmt_s(self.seconds_to_95()),
            opt(re.iter().filter_map(|a| a.greeted).max()),
        );
        let (max_q, max_at) = self.max_queue();
        s += &format!(
            "clients: {} back, {} reconnects refused, {} reset during the handshake, {} with SYN retransmissions; old exit code {:?}\n",
            self.clients_back(),
            self.refused(),
            self.reset_in_handshake(),
            self.syn_retransmitted(),
            self.old_exit_code
        );
        s += &format!(
            "listener: accept queue max {max_q} at {} ({} samples); ListenOverflows +{}; server accept rate {:.1}/s\n",
            opt(max_at),
            self.queue.len(),
            self.listen_overflows,
            self.server_accept_rate().unwrap_or(0.0)
        );
        s += &format!(
            "client wait (greeted - connected - auth): {}\n",
            q(&self.client_waits())
        );
        s += &format!(
            "connect latency (start - greeted):        {}\n",
            q(&self.connect_latencies())
        );
        s += &format!(
            "handshake (start - connected):            {}\n",
            q(&self.handshakes())
        );
        s += &format!(
            "server wait (python accept - connected):  {}\n",
            q(&self.server_waits())
        );
        // Queue depth and arrivals per 500 ms after the first arrival.
        if let Some(first) = arrivals.first().and_then(|a| a.handshake_by()) {
            s += "per 500 ms from the first arrival (arrivals/queue max):";
            let mut k = 0;
            loop {
                let (lo, hi) = (
                    first + Duration::from_millis(500 * k),
                    first + Duration::from_millis(500 * (k + 1)),
                );
                let n = arrivals
                    .iter()
                    .filter(|a| a.handshake_by().is_some_and(|c| c >= lo && c < hi))
                    .count();
                let qmax = self
                    .queue
                    .iter()
                    .filter(|(at, _)| *at >= lo && *at < hi)
                    .map(|(_, d)| *d)
                    .max();
                if n == 0
                    && qmax.unwrap_or(0) == 0
                    && hi
                        > arrivals
                            .last()
                            .and_then(|a| a.handshake_by())
                            .unwrap_or(first)
                {
                    break;
                }
                s += &format!(" {n}/{}", qmax.map_or("-".into(), |d| d.to_string()));
                k += 1;
            }
            s += "\n";
        }
        for a in re.iter().filter(|a| a.syn_retrans > 0).take(5) {
            s += &format!(
                "  SYN retransmitted x{}: client {} attempt {} start {} connected {} greeted {}\n",
                a.syn_retrans,
                a.client,
                a.seq,
                t(a.start),
                opt(a.connected),
                opt(a.greeted)
            );
        }
        let errors: Vec<String> = re.iter().filter_map(|a| a.error.clone()).take(5).collect();
        if !errors.is_empty() {
            s += &format!("first errors: {errors:?}\n");
        }
        s
    }
}

fn fmt_s(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.3}s"))
}
