//! The clients of a storm: N persistent connections, each lost when its server goes and
//! re-made after a jitter, with each client's own timing of every attempt.

use std::{
    net::SocketAddrV4,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, BufReader},
    net::{TcpSocket, TcpStream},
    sync::{Semaphore, watch},
};

use super::StormSpec;

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
    /// Reading the greeting failed, and how: `ConnectionReset` after a completed `connect()` is
    /// the same closing listener as a reset `connect()`, met a moment later.
    pub read_failed: Option<std::io::ErrorKind>,
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
    /// An attempt about to start: nothing happened to it yet.
    pub fn new(client: usize, seq: u32, target: SocketAddrV4, scheduled: Instant) -> Self {
        Self {
            client,
            seq,
            target,
            local: None,
            scheduled,
            start: Instant::now(),
            connected: None,
            connect_failed: None,
            greeted: None,
            read_failed: None,
            server_accepted_ns: None,
            server_sent_ns: None,
            syn_retrans: 0,
            lost: None,
            error: None,
        }
    }

    /// The handshake completed and the listener reset the connection before its greeting:
    /// `connect()` reported the reset, or returned and the read met it.
    pub fn reset_before_greeting(&self) -> bool {
        use std::io::ErrorKind::ConnectionReset;
        self.greeted.is_none()
            && (self
                .connect_failed
                .is_some_and(|(_, k)| k == ConnectionReset)
                || (self.connected.is_some() && self.read_failed == Some(ConnectionReset)))
    }

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
    let mut rec = Attempt::new(client, seq, target, scheduled);
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
            rec.read_failed = Some(e.kind());
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
    crate::tcp_info(s).map_or(0, |i| i.tcpi_total_retrans)
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

#[cfg(test)]
mod tests {
    use std::io::ErrorKind::{ConnectionRefused, ConnectionReset};

    use super::*;

    fn attempt() -> Attempt {
        let target = SocketAddrV4::new([127, 0, 0, 1].into(), 8080);
        Attempt::new(0, 1, target, Instant::now())
    }

    /// A closing listener resets a completed handshake before or just after `connect()`
    /// returns: both are arrivals without a greeting. A refusal or a greeted connection is not.
    #[test]
    fn a_reset_before_the_greeting_is_met_in_connect_or_in_the_first_read() {
        let now = Instant::now();
        let in_connect = Attempt {
            connect_failed: Some((now, ConnectionReset)),
            ..attempt()
        };
        let in_read = Attempt {
            connected: Some(now),
            read_failed: Some(ConnectionReset),
            ..attempt()
        };
        for a in [&in_connect, &in_read] {
            assert!(
                a.reset_before_greeting() && a.handshake_by().is_some(),
                "{a:?}"
            );
        }
        let refused = Attempt {
            connect_failed: Some((now, ConnectionRefused)),
            ..attempt()
        };
        let greeted = Attempt {
            connected: Some(now),
            greeted: Some(now),
            ..attempt()
        };
        let no_greeting = Attempt {
            connected: Some(now),
            ..attempt()
        };
        for a in [&refused, &greeted, &no_greeting] {
            assert!(!a.reset_before_greeting(), "{a:?}");
        }
    }
}
