//! The agent process's own CPU, memory, descriptors and start time, under the standard names
//! every Prometheus client exports (`process_cpu_seconds_total`, `process_resident_memory_bytes`,
//! …), read from `/proc/self` at scrape time. prometheus-client has no process collector, and
//! the one made for it (kubert-prometheus-process) is built against prometheus-client 0.23,
//! whose `Collector` is another trait than 0.26's: so this small one, on procfs.

use procfs::process::{LimitValue, Process};
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{counter::ConstCounter, gauge::ConstGauge},
};

/// One reading of the process, in the units the metrics carry.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reading {
    pub cpu_seconds: f64,
    pub resident_bytes: u64,
    pub virtual_bytes: u64,
    pub open_fds: u64,
    /// None when unlimited.
    pub max_fds: Option<u64>,
    /// Seconds since the epoch.
    pub start_time_seconds: f64,
    pub threads: u64,
}

/// What `/proc/<pid>/stat` and friends say, with the system's constants, as a reading (pure).
pub fn reading(
    stat: &procfs::process::Stat,
    open_fds: u64,
    max_fds: LimitValue,
    ticks_per_second: u64,
    page_size: u64,
    boot_time_secs: u64,
) -> Reading {
    let tps = ticks_per_second.max(1) as f64;
    Reading {
        cpu_seconds: (stat.utime + stat.stime) as f64 / tps,
        resident_bytes: stat.rss.saturating_mul(page_size),
        virtual_bytes: stat.vsize,
        open_fds,
        max_fds: match max_fds {
            LimitValue::Value(v) => Some(v),
            LimitValue::Unlimited => None,
        },
        start_time_seconds: boot_time_secs as f64 + stat.starttime as f64 / tps,
        threads: u64::try_from(stat.num_threads).unwrap_or(0),
    }
}

/// This process, now.
pub fn read_self() -> procfs::ProcResult<Reading> {
    let me = Process::myself()?;
    let stat = me.stat()?;
    let fds = me.fd_count()? as u64;
    let limits = me.limits()?;
    Ok(reading(
        &stat,
        fds,
        limits.max_open_files.soft_limit,
        procfs::ticks_per_second(),
        procfs::page_size(),
        procfs::boot_time_secs()?,
    ))
}

/// Registered with `Registry::register_collector`: reads `/proc/self` on every scrape.
#[derive(Debug, Default)]
pub struct ProcessCollector;

fn gauge(e: &mut DescriptorEncoder, name: &str, help: &str, v: f64) -> std::fmt::Result {
    let g = ConstGauge::new(v);
    g.encode(e.encode_descriptor(name, help, None, g.metric_type())?)
}

impl Collector for ProcessCollector {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        // /proc/self of a running process: a failure here is a kernel without procfs, where
        // the scrape still answers, without these series.
        let Ok(r) = read_self() else {
            return Ok(());
        };
        let cpu = ConstCounter::new(r.cpu_seconds);
        cpu.encode(e.encode_descriptor(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds.",
            None,
            cpu.metric_type(),
        )?)?;
        gauge(
            &mut e,
            "process_resident_memory_bytes",
            "Resident memory size in bytes.",
            r.resident_bytes as f64,
        )?;
        gauge(
            &mut e,
            "process_virtual_memory_bytes",
            "Virtual memory size in bytes.",
            r.virtual_bytes as f64,
        )?;
        gauge(
            &mut e,
            "process_open_fds",
            "Number of open file descriptors.",
            r.open_fds as f64,
        )?;
        if let Some(max) = r.max_fds {
            gauge(
                &mut e,
                "process_max_fds",
                "Maximum number of open file descriptors.",
                max as f64,
            )?;
        }
        gauge(
            &mut e,
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds.",
            r.start_time_seconds,
        )?;
        gauge(
            &mut e,
            "process_threads",
            "Number of OS threads in the process.",
            r.threads as f64,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process_from_the_real_proc() {
        let before = read_self().unwrap();
        // Work the CPU and hold descriptors and memory, then read again.
        let files: Vec<std::fs::File> = (0..20)
            .map(|_| std::fs::File::open("/proc/self/stat").unwrap())
            .collect();
        let block = vec![1u8; 32 << 20];
        let t = std::time::Instant::now();
        let mut x = 0u64;
        while t.elapsed() < std::time::Duration::from_millis(300) {
            x = x.wrapping_mul(31).wrapping_add(std::hint::black_box(7));
        }
        std::hint::black_box(x);
        // The test harness runs other tests on other threads of this process meanwhile: each
        // check holds whatever they do (their descriptors and memory come and go, their CPU
        // time adds up).
        let cpu_of = || {
            let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
            // SAFETY: a valid out-pointer for the call.
            assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) }, 0);
            let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
            tv(usage.ru_utime) + tv(usage.ru_stime)
        };
        let earlier = cpu_of();
        let after = read_self().unwrap();
        let later = cpu_of();
        // The CPU time grew, and lies between the kernel's other account of it (getrusage)
        // just before and just after, to the clock tick /proc/self/stat counts in.
        assert!(
            after.cpu_seconds > before.cpu_seconds,
            "{before:?} {after:?}"
        );
        assert!(
            earlier - 0.02 <= after.cpu_seconds && after.cpu_seconds <= later + 0.02,
            "getrusage {earlier}..{later} vs {after:?}"
        );
        assert!(after.open_fds >= 20, "the 20 files held: {after:?}");
        assert!(
            after.resident_bytes >= 30 << 20,
            "the 32 MiB block held: {after:?}"
        );
        assert!(after.virtual_bytes >= after.resident_bytes);
        assert!(after.max_fds.is_some_and(|m| m >= after.open_fds));
        assert!(after.threads >= 1);
        // Started before now and after the boot.
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let boot = procfs::boot_time_secs().unwrap() as f64;
        assert!(after.start_time_seconds <= now + 1.0, "{after:?} now {now}");
        assert!(after.start_time_seconds >= boot, "{after:?} boot {boot}");
        assert_eq!(after.start_time_seconds, before.start_time_seconds);
        drop((files, block));
    }

    #[test]
    fn scraped_under_the_standard_names() {
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(ProcessCollector));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for name in [
            "# TYPE process_cpu_seconds counter",
            "\nprocess_cpu_seconds_total ",
            "\nprocess_resident_memory_bytes ",
            "\nprocess_virtual_memory_bytes ",
            "\nprocess_open_fds ",
            "\nprocess_max_fds ",
            "\nprocess_start_time_seconds ",
            "\nprocess_threads ",
        ] {
            assert!(text.contains(name), "{name} in {text}");
        }
    }
}
