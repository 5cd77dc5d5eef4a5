//! The listener's side, read from the kernel: its accept-queue depth (sampled on a thread
//! during the storm) and its namespace's `TcpExt` counters.

use std::{
    fs,
    io::Read,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

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
pub(super) struct QueueSampler {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Vec<(Instant, u32)>>,
}

impl QueueSampler {
    pub(super) fn start(pid: u32, port: u16, every: Duration) -> Self {
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

    pub(super) fn finish(self) -> Vec<(Instant, u32)> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("sampler")
    }
}
