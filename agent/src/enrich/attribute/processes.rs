//! Which of a container's processes is its main one: not the runtime's bootstrap stages, and
//! not an init shim that only forwards signals.

use crate::enrich::host::ProcInfo;

/// Init shims that forward signals to the real main process (`--init`, tini, dumb-init).
const INIT_SHIMS: &[&str] = &[
    "catatonit",
    "podman-init",
    "tini",
    "docker-init",
    "dumb-init",
];

/// The runtime's own processes while it creates a container: `runc init` and its first two
/// stages (`runc:[0:PARENT]`, `runc:[1:CHILD]`) join the container's cgroup and exit within
/// milliseconds, before the container's PID 1 (`runc:[2:INIT]`) execs the entrypoint. Until
/// its first stage names itself, `runc init` is `exe` (runc runs `/proc/self/exe init`), still
/// in the host's PID namespace (its pid there is its own): taken for the main process, its exit
/// made a stop and the real PID 1 a restart (the soak, 1 container in 2,722).
pub(super) fn bootstrapping(p: &ProcInfo) -> bool {
    matches!(p.comm.as_str(), "runc" | "crun")
        || p.comm.starts_with("runc:[0")
        || p.comm.starts_with("runc:[1")
        || (p.comm == "exe" && p.ns_pid == Some(p.pid))
}

pub(super) fn is_shim(p: &ProcInfo) -> bool {
    INIT_SHIMS.contains(&p.comm.as_str())
}

/// The process a container is about: its init, or the init's first child when the init is a
/// shim that only forwards signals. Never one of the runtime's bootstrap stages, which exit
/// within milliseconds (with code 0: taken for the main process, a "crashed" stop).
pub(super) fn main_process(procs: &[ProcInfo]) -> Option<&ProcInfo> {
    let candidates = || procs.iter().filter(|p| !bootstrapping(p));
    let init = candidates().find(|p| p.ns_pid == Some(1));
    match init {
        Some(i) if is_shim(i) => candidates()
            .filter(|p| p.ppid == i.pid)
            .min_by_key(|p| p.pid)
            .or(Some(i)),
        Some(i) => Some(i),
        None => candidates().min_by_key(|p| p.pid),
    }
}
