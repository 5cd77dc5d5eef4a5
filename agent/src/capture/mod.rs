//! Capture: reads what this kernel offers (tracefs formats, BTF), loads the eBPF object with
//! that configuration, works through the attach plan and streams decoded events.

mod attach;
pub mod btf;
pub mod ebpf_log;
pub mod event;
pub mod faults;
pub mod hold;
pub mod hooks;
pub mod jiffies;
mod memlock;
pub mod merge;
mod options;
pub mod plan;
pub mod reader;
pub mod storming;
pub mod tracefs;
pub mod watch;

pub use options::{
    HOLD_ENTRIES, Options, PACKET_EVENTS_PER_CPU, RETRY_WINDOW, lifecycle_ring_bytes,
};

use std::{collections::BTreeMap, path::PathBuf};

use attach::{attach_btf_tracepoints, attach_kprobes, attach_tracepoint, format_provides};
use aya::{Ebpf, EbpfLoader};
use drainwatch_common::{
    EventKind,
    config::Config,
    faults::FaultKind,
    fields::{KernelOffsets, NO_OFFSET},
};
use event::KernelNames;
use plan::{Hook, PLAN, SignalStatus};
use tracefs::{Format, Resolver};

/// The eBPF object agent/build.rs built with aya-build.
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/drainwatch"));

#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    #[error(
        "tracefs is not mounted (looked in /sys/kernel/tracing and /sys/kernel/debug/tracing); mount it with `mount -t tracefs nodev /sys/kernel/tracing`"
    )]
    NoTracefs,
    #[error(transparent)]
    Btf(#[from] btf::BtfError),
    #[error(
        "loading the eBPF programs failed: {0} (drainwatch needs root, or CAP_BPF and CAP_PERFMON, and a seccomp profile that allows bpf() and perf_event_open(): deploy/seccomp/)"
    )]
    Load(#[source] aya::EbpfError),
    #[error(
        "creating the eBPF maps failed with EPERM under a locked-memory limit of {kib} KiB: this kernel charges eBPF map memory to RLIMIT_MEMLOCK (kernels before 5.11); give the agent CAP_SYS_RESOURCE (it then lifts the limit itself) or run it with an unlimited memlock limit (`ulimit -l unlimited`, systemd LimitMEMLOCK=infinity): {source}"
    )]
    Memlock {
        kib: u64,
        #[source]
        source: aya::EbpfError,
    },
    #[error("the eBPF object has no map {0}")]
    NoMap(&'static str),
    #[error("ring buffer: {0}")]
    Map(#[from] aya::maps::MapError),
    #[error("ring buffer: {0}")]
    Io(#[from] std::io::Error),
    #[error("--ring-buffer-bytes must be a power of two of at least 4096, got {0}")]
    RingSize(u32),
}

/// What one tracepoint's format file told us.
struct TracepointInfo {
    format: Result<Format, String>,
}

fn tracefs_events_dir() -> Result<PathBuf, CaptureError> {
    [
        "/sys/kernel/tracing/events",
        "/sys/kernel/debug/tracing/events",
    ]
    .into_iter()
    .map(PathBuf::from)
    .find(|p| p.is_dir())
    .ok_or(CaptureError::NoTracefs)
}

fn read_format(dir: &std::path::Path, category: &str, name: &str) -> Result<Format, String> {
    let path = dir.join(category).join(name).join("format");
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("no tracepoint ({}: {e})", path.display()))?;
    Format::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// Per-hook results of resolving format fields into the config.
#[derive(Default)]
struct Resolution {
    missing_required: BTreeMap<&'static str, Vec<String>>,
    missing_optional: BTreeMap<&'static str, Vec<String>>,
}

/// Reads every format file the programs use and fills the config's field offsets.
fn resolve_tracepoints(
    dir: &std::path::Path,
    config: &mut Config,
    names: &mut KernelNames,
) -> (BTreeMap<&'static str, TracepointInfo>, Resolution) {
    let mut infos = BTreeMap::new();
    let mut res = Resolution::default();
    // Every tracepoint of the common table: its format fills `config.<stem>`.
    macro_rules! resolve {
        (
            kinds { $($_k:tt)* }
            tracepoints { $($category:ident / $stem:ident;)* }
        ) => {$({
            let name = stringify!($stem);
            let format = read_format(dir, stringify!($category), name);
            if let Ok(fmt) = &format {
                let mut r = Resolver::new(fmt);
                config.$stem = hooks::$stem::fields(&mut r);
                res.missing_required.insert(name, r.missing_required);
                res.missing_optional.insert(name, r.missing_optional);
            }
            infos.insert(name, TracepointInfo { format });
        })*};
    }
    drainwatch_common::for_each_hook!(resolve);
    let table = |hook: &str, field: &str| {
        infos
            .get(hook)
            .and_then(|i: &TracepointInfo| i.format.as_ref().ok())
            .map(|f| f.symbols(field))
            .unwrap_or_default()
    };
    names.rst_reasons = table("tcp_send_reset", "reason");
    names.drop_reasons = table("kfree_skb", "reason");
    names.tcp_states = table("inet_sock_set_state", "newstate");
    (infos, res)
}

/// The kernel's names for the numbers events carry (reset and drop reasons, TCP states), from
/// this machine's tracefs formats: what the reader decodes with.
pub fn kernel_names() -> Result<KernelNames, CaptureError> {
    let mut names = KernelNames::default();
    let mut config = Config::UNSET;
    resolve_tracepoints(&tracefs_events_dir()?, &mut config, &mut names);
    Ok(names)
}

/// BTF members whose absence degrades a hook, and what is lost. `cookies`: namespaces have
/// their cookie from creation (`btf::net_cookie_at_creation`); without, the state-change hook
/// (listeners, connections) says so.
fn btf_degradations(k: &KernelOffsets, hook: &str, cookies: bool) -> Vec<String> {
    let mut out = Vec::new();
    if !cookies && hook == "inet_sock_set_state" {
        out.push(
            "network namespaces by inode only (net.net_cookie not set at creation before 5.12): \
             a replacement whose namespace reuses a stopped container's inode is taken for it"
                .to_string(),
        );
    }
    let mut need = |off: u32, what: &str| {
        if off == NO_OFFSET {
            out.push(what.to_string());
        }
    };
    match hook {
        "sched_process_exit" => need(
            k.task_exit_code,
            "no exit code (task_struct.exit_code not in BTF)",
        ),
        "signal_generate" | "cgroup_rmdir" | "inet_sk_error_report" => need(
            k.task_nsproxy.min(k.nsproxy_net_ns),
            "no network namespace (task_struct.nsproxy not in BTF)",
        ),
        _ => need(
            k.sock_net.min(k.net_inum),
            "no network namespace (sock.skc_net not in BTF)",
        ),
    }
    out
}

/// One loaded program's size (`Capture::program_sizes`).
#[derive(Clone, Debug, serde::Serialize)]
pub struct ProgramSize {
    pub name: String,
    /// Instructions after the kernel's rewrites.
    pub xlated: Option<u32>,
    /// Instructions the verifier processed (5.16+).
    pub verified: Option<u32>,
}

/// Loaded programs and the outcome of the attach plan. Dropping it detaches everything.
pub struct Capture {
    /// Attachments, owned here so they can be dropped in parallel: each detach waits for an
    /// RCU grace period in the kernel (about 60 ms), which one after another would take most
    /// of the one second the agent has to exit.
    links: Vec<Box<dyn Send>>,
    ebpf: Ebpf,
    /// The lifecycle programs' log, or why it could not be set up; `None` once taken.
    log: Option<Result<ebpf_log::EbpfLog, String>>,
    pub statuses: Vec<SignalStatus>,
    pub names: KernelNames,
    pub kernel_offsets: KernelOffsets,
    /// Whether the programs hold clean connections (`Options::hold`, where the kernel can hand
    /// one over: `hold::kernel_can_hand_over`).
    holds: bool,
}

impl Capture {
    /// Loads the programs and works through the attach plan. Hooks that fail are reported in
    /// `statuses`, not as errors: only a kernel where nothing can load is an error.
    pub fn load(opts: &Options) -> Result<Self, CaptureError> {
        let size = opts.ring_buffer_bytes;
        if size < 4096 || !size.is_power_of_two() {
            return Err(CaptureError::RingSize(size));
        }
        let events_dir = tracefs_events_dir()?;
        let btf = btf::load(&opts.btf_path)?;
        let (kernel, missing_members) = btf::kernel_offsets(&btf);
        let cookies = btf::net_cookie_at_creation(&btf);
        // The parsed vmlinux BTF is several MiB and only needed for the offsets: free it
        // before aya parses its own copy in `EbpfLoader::new`, so the two never coexist.
        drop(btf);
        let mut config = Config::UNSET;
        config.kernel = kernel;
        config.host_netns = opts.host_netns.unwrap_or(0);
        config.attach_only = u32::from(opts.attach_only);
        config.retry_window_us = u32::try_from(opts.retry_window.as_micros()).unwrap_or(u32::MAX);
        config.packet_events_per_window =
            drainwatch_common::config::per_window(opts.packet_events_per_cpu);
        config.lean = u32::from(opts.lean);
        let holds = opts.hold && hold::kernel_can_hand_over();
        config.hold = u32::from(holds);
        let mut names = KernelNames::default();
        let (infos, res) = resolve_tracepoints(&events_dir, &mut config, &mut names);

        let memlock = memlock::raise_soft_to_hard();
        let mut ebpf = EbpfLoader::new()
            .override_global("CONFIG", &config, true)
            .map_max_entries("EVENTS", size)
            .map_max_entries("LIFECYCLE", lifecycle_ring_bytes(size))
            .map_max_entries("HOLD", opts.hold_entries.max(1))
            .map_max_entries("UPSTREAM_SOCKS", opts.upstream_entries.max(1))
            .map_max_entries("AYA_LOGS", ebpf_log::LOG_RING_BYTES)
            .load(EBPF_OBJECT)
            .map_err(|e| match memlock {
                // aya lifts the limit on EPERM where it can; still EPERM under a finite
                // limit is the limit where the kernel charges it (the preflight checked the
                // capabilities). Elsewhere EPERM is a seccomp filter or an LSM.
                Some(bytes) if memlock::is_eperm(&e) && memlock::charged() => {
                    CaptureError::Memlock {
                        kib: bytes / 1024,
                        source: e,
                    }
                }
                _ => CaptureError::Load(e),
            })?;

        // Before any program loads: they reference the log map (see `ebpf_log::EbpfLog`).
        let log = Some(if opts.ebpf_log {
            ebpf_log::EbpfLog::take(&mut ebpf).map_err(|e| e.to_string())
        } else {
            Err("not set up (--test-no-ebpf-log)".into())
        });
        let mut statuses = Vec::new();
        let mut links = Vec::new();
        // aya's parse of the kernel BTF, for tp_btf programs: made once, when first needed.
        let mut aya_btf = None;
        for p in PLAN {
            if opts
                .only
                .as_ref()
                .is_some_and(|only| !only.contains(&p.signal))
            {
                continue;
            }
            let mut st = SignalStatus {
                signal: p.signal,
                title: p.title,
                tried: Vec::new(),
                degraded: Vec::new(),
                unavailable: p.unavailable,
            };
            for hook in p.hooks {
                if opts.skip_hooks.contains(&hook.label()) {
                    continue;
                }
                let result = match hook {
                    Hook::Tracepoint { name, degraded, .. } => attach_tracepoint(
                        &mut ebpf, &mut links, &infos, &res, hook,
                    )
                    .map(|optional| {
                        st.degraded
                            .extend(optional.into_iter().map(|f| format!("no field {f}")));
                        st.degraded.extend(degraded.map(String::from));
                        st.degraded.extend(btf_degradations(&kernel, name, cookies));
                    }),
                    Hook::BtfTracepoint {
                        name,
                        program,
                        also,
                        offsets,
                        needs,
                    } => format_provides(&infos, &res, name, needs).and_then(|()| {
                        attach_btf_tracepoints(
                            &mut ebpf,
                            &mut links,
                            (&opts.btf_path, &mut aya_btf),
                            std::iter::once((*name, *program)).chain(also.iter().copied()),
                            offsets,
                            &missing_members,
                        )
                        .map(|()| st.degraded.extend(btf_degradations(&kernel, name, cookies)))
                    }),
                    Hook::Kprobe { functions, ret: _ } => {
                        attach_kprobes(&mut ebpf, &mut links, functions)
                    }
                };
                let ok = result.is_ok();
                st.tried.push((hook.label(), result));
                if ok {
                    break;
                }
            }
            statuses.push(st);
        }
        Ok(Self {
            links,
            ebpf,
            log,
            statuses,
            names,
            kernel_offsets: kernel,
            holds,
        })
    }

    /// Takes the ring buffer and loss counters for the reader; call once.
    pub fn take_reader_maps(&mut self) -> Result<reader::Maps, CaptureError> {
        reader::Maps::take(&mut self.ebpf)
    }

    /// Whether the programs hold clean connections (see `Options::hold`).
    pub fn holds(&self) -> bool {
        self.holds
    }

    /// Takes `--hold`'s maps (hot namespaces, held connections); call once.
    pub fn take_hold(&mut self) -> Result<hold::Hold, CaptureError> {
        hold::Hold::take(&mut self.ebpf)
    }

    /// Takes the maps that say which namespaces' accepted connections are followed through
    /// their opening exchanges; `None` where the send and receive hooks did not attach (the
    /// entries would never be read, nor removed at their close). Call once.
    pub fn take_storming(&mut self) -> Result<Option<storming::Storming>, CaptureError> {
        let attached = self
            .statuses
            .iter()
            .any(|st| st.signal == "upstream_requests" && st.tried.iter().any(|(_, r)| r.is_ok()));
        if !attached {
            return Ok(None);
        }
        storming::Storming::take(&mut self.ebpf).map(Some)
    }

    /// Takes the maps that say which host-namespace traffic to keep; call once.
    pub fn take_watch(&mut self) -> Result<watch::Watch, CaptureError> {
        watch::Watch::take(&mut self.ebpf)
    }

    /// Takes the lifecycle programs' log (`ebpf_log`), or why it could not be set up; call
    /// once (then it says it was taken).
    pub fn take_log(&mut self) -> Result<ebpf_log::EbpfLog, String> {
        self.log
            .take()
            .unwrap_or_else(|| Err("the eBPF log was taken already".into()))
    }

    /// Takes the fault counters (for a thread other than the one holding `Capture`); after
    /// this, `faults()` is empty. Call once.
    pub fn take_faults(&mut self) -> Result<faults::Faults, CaptureError> {
        faults::Faults::take(&mut self.ebpf)
    }

    /// How often each (kind, fault) pair happened since load, summed over CPUs, every pair
    /// included (zeros too): see `drainwatch_common::faults`. Empty once `take_faults` ran.
    pub fn faults(&self) -> Vec<(EventKind, FaultKind, u64)> {
        self.ebpf
            .map("FAULTS")
            .and_then(|m| aya::maps::PerCpuArray::try_from(m).ok())
            .map(|a| faults::read(&a))
            .unwrap_or_default()
    }

    /// Every loaded program's size as this kernel holds it, by name: its translated
    /// instructions (`bpftool prog show`'s xlated bytes / 8) and the instructions its verifier
    /// processed (5.16+; the limit is a million). For the kernel matrix's figures.
    pub fn program_sizes(&self) -> Vec<ProgramSize> {
        self.ebpf
            .programs()
            .filter_map(|(name, p)| {
                let info = p.info().ok()?;
                Some(ProgramSize {
                    name: name.to_string(),
                    xlated: info.size_translated().map(|b| b / 8),
                    verified: info.verified_instruction_count(),
                })
            })
            .collect()
    }

    pub fn all_attached(&self) -> bool {
        self.statuses.iter().any(|s| s.chosen().is_some())
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        std::thread::scope(|s| {
            for link in self.links.drain(..) {
                s.spawn(move || drop(link));
            }
        });
    }
}
