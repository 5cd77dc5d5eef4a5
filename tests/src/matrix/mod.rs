//! The kernel matrix (`cargo xtask kernels`): the kernel-facing checks run inside each kernel of
//! the matrix (booted in QEMU from an initramfs holding the `kernel-matrix` binary, the agent
//! and busybox) and on this machine's own kernel. No podman, no proxy: every check causes its
//! own traffic on loopback, its own processes, cgroups and network namespace.
//!
//! The programs are loaded four times at once, as four plans ([`VARIANTS`]): the plan as the
//! kernel decides it, the same as the agent loads it (lean, holding clean connections where the
//! kernel can hand them over), the classic tracepoints (every tp_btf hook and kprobe skipped),
//! and the kprobe reset hooks (everything before them skipped). Each action is done once and every
//! loaded plan's events are checked against it, exact, by what the plan says it offers
//! (a reset hook without reasons must report none, a pre-6.10 tracepoint must miss the
//! socket-less reset it is documented to miss).
//!
//! Output is line-based for the serial console: `DWK-PLAN <json>` per signal and plan,
//! `DWK-INSNS <json>` per plan (its programs' instructions), `DWK-TEST ok|FAIL <name> <detail>`
//! per check, `DWK-DONE <json>` at the end; xtask parses it.

pub mod container;
mod ebpf_log;
pub mod expect;
pub mod memlock;
mod processes;
mod queues;
pub mod scenarios;

use std::panic::{AssertUnwindSafe, catch_unwind};

use drainwatch::capture::{self, event::Event, plan::SignalStatus};
use serde_json::json;

use crate::Harness;

pub const PREFIX_PLAN: &str = "DWK-PLAN ";
pub const PREFIX_TEST: &str = "DWK-TEST ";
pub const PREFIX_DONE: &str = "DWK-DONE ";
/// Each loaded program's instructions, per plan (`Capture::program_sizes`).
pub const PREFIX_INSNS: &str = "DWK-INSNS ";

/// One way of loading the programs.
pub struct Variant {
    pub name: &'static str,
    /// Signals loaded (all when `None`).
    pub only: Option<&'static [&'static str]>,
    /// Hook labels not tried (a prefix ending in `:` skips every hook of that kind).
    pub skip: &'static [&'static str],
    /// Loaded as the agent does: lean, holding clean connections (`capture::Options::hold`).
    pub held: bool,
}

pub const VARIANTS: [Variant; 4] = [
    Variant {
        name: "natural",
        only: None,
        skip: &[],
        held: false,
    },
    Variant {
        name: "held",
        only: Some(&["socket_states", "accept_wait", "resets_received"]),
        skip: &[],
        held: true,
    },
    Variant {
        name: "classic",
        only: None,
        skip: &[
            "tp_btf:",
            "kretprobe:",
            "kprobe:",
            // The pre-6.10 tracepoint is the one to test where the kernel has no reasons.
        ],
        held: false,
    },
    Variant {
        name: "kprobes",
        only: Some(&["resets_sent", "listen_overflows"]),
        skip: &["tp_btf:", "tracepoint:"],
        held: false,
    },
];

/// The hook labels of the plan that `skip` names.
fn skipped(skip: &[&str]) -> Vec<String> {
    capture::plan::PLAN
        .iter()
        .flat_map(|p| p.hooks.iter().map(capture::plan::Hook::label))
        .filter(|l| {
            skip.iter().any(|s| {
                if s.ends_with(':') {
                    l.starts_with(s)
                } else {
                    l == s
                }
            })
        })
        .collect()
}

/// A variant's programs, loaded.
pub struct Loaded {
    pub variant: &'static Variant,
    pub h: Harness,
    /// Events drained but not yet claimed by a check.
    pending: Vec<Event>,
}

impl Loaded {
    pub fn load(variant: &'static Variant) -> Result<Self, String> {
        let skip = skipped(variant.skip);
        let opts = capture::Options {
            ring_buffer_bytes: 1 << 22,
            only: variant.only.map(<[_]>::to_vec),
            skip_hooks: skip,
            lean: variant.held,
            hold: variant.held,
            ..Default::default()
        };
        let h = Harness::try_start(&opts, 1 << 20)
            .map_err(|e| format!("{}: loading the programs: {e}", variant.name))?;
        Ok(Self {
            variant,
            h,
            pending: Vec::new(),
        })
    }

    pub fn status(&self, signal: &str) -> Option<&SignalStatus> {
        self.h.capture.statuses.iter().find(|s| s.signal == signal)
    }

    /// The hook `signal` uses, if any.
    pub fn chosen(&self, signal: &str) -> Option<&str> {
        self.status(signal).and_then(SignalStatus::chosen)
    }

    /// Drains the ring buffers into `pending`.
    pub fn drain(&mut self) {
        let evs = self.h.events();
        self.pending.extend(evs);
    }

    /// Everything drained since the last take.
    pub fn take(&mut self) -> Vec<Event> {
        self.drain();
        std::mem::take(&mut self.pending)
    }
}

/// The plan's outcome for one signal, as a `DWK-PLAN` JSON object.
pub fn plan_json(variant: &str, st: &SignalStatus) -> serde_json::Value {
    json!({
        "variant": variant,
        "signal": st.signal,
        "chosen": st.chosen(),
        "degraded": st.degraded,
        "tried": st.tried.iter().map(|(h, r)| json!({
            "hook": h,
            "error": r.as_ref().err(),
        })).collect::<Vec<_>>(),
        "summary": st.summary(),
        "unavailable": st.unavailable,
    })
}

/// Runs checks, each caught on its own, and keeps the tally.
#[derive(Default)]
pub struct Runner {
    filter: Option<String>,
    pub passed: usize,
    pub failed: Vec<String>,
}

/// A panic's message.
fn message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "panicked".into())
}

impl Runner {
    pub fn new(filter: Option<String>) -> Self {
        // Panic messages go into the check's FAIL line, with their location: not to stderr.
        std::panic::set_hook(Box::new(|info| {
            if let Some(l) = info.location() {
                LOCATION.with(|c| *c.borrow_mut() = format!("{}:{}", l.file(), l.line()));
            }
        }));
        Self {
            filter,
            ..Self::default()
        }
    }

    pub fn wanted(&self, name: &str) -> bool {
        self.filter.as_deref().is_none_or(|f| name.contains(f))
    }

    /// Runs `f` as the check `name`: its return value is the detail of an `ok` line, a panic
    /// a `FAIL` line.
    pub fn check(&mut self, name: &str, f: impl FnOnce() -> String) {
        if !self.wanted(name) {
            return;
        }
        let t = std::time::Instant::now();
        let r = catch_unwind(AssertUnwindSafe(f));
        let took = t.elapsed().as_secs_f64();
        match r {
            Ok(detail) => {
                self.passed += 1;
                println!("{PREFIX_TEST}ok {name} ({took:.1}s) {}", one_line(&detail));
            }
            Err(p) => {
                let at = LOCATION.with(|c| c.borrow().clone());
                let msg = format!("{} [{at}]", message(&*p));
                println!("{PREFIX_TEST}FAIL {name} ({took:.1}s) {}", one_line(&msg));
                self.failed.push(name.to_string());
            }
        }
    }

    pub fn total(&self) -> usize {
        self.passed + self.failed.len()
    }
}

thread_local! {
    static LOCATION: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
}

/// Newlines escaped, so a result is one console line, and long texts cut.
fn one_line(s: &str) -> String {
    let s = s.replace('\n', "\\n");
    if s.len() > 3000 {
        let mut cut = 3000;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        format!("{}…", &s[..cut])
    } else {
        s
    }
}

/// The running kernel's release.
pub fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

/// How this machine mounts cgroups, from its mount table: v2 alone (as systemd-driven nodes
/// run) or v2 beside v1 hierarchies (hybrid).
fn cgroup_mode() -> &'static str {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let fs = |t: &str| {
        mounts
            .lines()
            .any(|l| l.split_whitespace().nth(2) == Some(t))
    };
    match (fs("cgroup2"), fs("cgroup")) {
        (true, false) => "v2 only",
        (true, true) => "hybrid (v1 and v2)",
        (false, true) => "v1 only",
        (false, false) => "none mounted",
    }
}

/// Runs the whole matrix on the running kernel with the agent binary at `agent`; prints every
/// line as it goes; returns (passed, total).
pub fn run(filter: Option<String>) -> (usize, usize) {
    let mut r = Runner::new(filter);
    let release = kernel_release();
    let facts = expect::Facts::read();
    println!("DWK-KERNEL {release} {}", json!(facts));
    println!("DWK-CGROUPS {}", cgroup_mode());
    let t = std::time::Instant::now();
    let mut loaded = Vec::new();
    // DWK_VARIANTS=a,b loads only those plans (for a quick look at one of them).
    let only = std::env::var("DWK_VARIANTS").ok();
    let only: Option<Vec<&str>> = only.as_deref().map(|o| o.split(',').collect());
    for v in VARIANTS
        .iter()
        .filter(|v| only.as_ref().is_none_or(|o| o.contains(&v.name)))
    {
        let t = std::time::Instant::now();
        match Loaded::load(v) {
            Ok(l) => {
                println!("DWK-LOAD {} {:.1}s", v.name, t.elapsed().as_secs_f64());
                for st in &l.h.capture.statuses {
                    println!("{PREFIX_PLAN}{}", plan_json(v.name, st));
                }
                println!(
                    "{PREFIX_INSNS}{}",
                    json!({"variant": v.name, "programs": l.h.capture.program_sizes()})
                );
                loaded.push(l);
            }
            Err(e) => r.check(&format!("load[{}]", v.name), || panic!("{e}")),
        }
    }
    println!("DWK-LOAD all {:.1}s", t.elapsed().as_secs_f64());
    for l in &loaded {
        r.check(&format!("plan[{}]", l.variant.name), || {
            expect::check_plan(&facts, l)
        });
    }
    // First: the plans' fault counts are still zero, so the fault is each one's first.
    r.check("ebpf_log", || ebpf_log::check(&mut loaded));
    scenarios::run(&mut r, &mut loaded);
    drop(loaded);
    container::run(&mut r, &facts);
    r.check("memlock", memlock::check);
    println!(
        "{PREFIX_DONE}{}",
        json!({"kernel": release, "passed": r.passed, "total": r.total(), "failed": r.failed})
    );
    (r.passed, r.total())
}
