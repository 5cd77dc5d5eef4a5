//! What the CRI lab made and must take away: containerd's shims and the pods' processes,
//! mounts, network namespaces, the IPAM cache, the bridge, the `kubepods` cgroups and the
//! directories it created. Each is recorded as it is made, in memory and in the lab
//! directory's `owned` file, so that a run killed before its drop is cleaned by the next one.

use std::{
    collections::BTreeSet,
    fs,
    io::Write,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use super::network;
use crate::lab::container::{KEEP_ENV, LAB_DIR, dead_run};

/// containerd 1.6's shim sockets, wherever its state is.
const SHIM_SOCKETS: &str = "/run/containerd/s";
const CNI_STATE: &str = "/var/lib/cni";

/// One thing the lab made.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Item {
    /// A directory that was not there before the lab (removed whole).
    Dir(PathBuf),
    /// A network namespace file CNI's caller made for a pod (unmounted and removed).
    Netns(PathBuf),
    /// A cgroup path below every hierarchy's root (removed leaf first, processes killed).
    Cgroup(String),
    /// The CNI network's name: its host-local leases and cached results.
    CniNetwork(String),
    /// Entries of the shim socket directory present before the lab (left alone).
    KeepSocket(String),
}

impl Item {
    fn line(&self) -> String {
        match self {
            Item::Dir(p) => format!("dir {}", p.display()),
            Item::Netns(p) => format!("netns {}", p.display()),
            Item::Cgroup(c) => format!("cgroup {c}"),
            Item::CniNetwork(n) => format!("cni {n}"),
            Item::KeepSocket(s) => format!("keep-socket {s}"),
        }
    }

    fn parse(line: &str) -> Option<Item> {
        let (kind, rest) = line.split_once(' ')?;
        Some(match kind {
            "dir" => Item::Dir(rest.into()),
            "netns" => Item::Netns(rest.into()),
            "cgroup" => Item::Cgroup(rest.into()),
            "cni" => Item::CniNetwork(rest.into()),
            "keep-socket" => Item::KeepSocket(rest.into()),
            _ => return None,
        })
    }
}

/// The lab's record of what it made.
pub(crate) struct Owned {
    dir: PathBuf,
    items: BTreeSet<Item>,
}

impl Owned {
    pub(super) fn new(dir: &Path) -> Owned {
        let mut o = Owned {
            dir: dir.to_path_buf(),
            items: BTreeSet::new(),
        };
        for e in fs::read_dir(SHIM_SOCKETS).into_iter().flatten().flatten() {
            o.add(Item::KeepSocket(
                e.file_name().to_string_lossy().into_owned(),
            ));
        }
        o
    }

    fn load(dir: &Path) -> Owned {
        let text = fs::read_to_string(dir.join("owned")).unwrap_or_default();
        Owned {
            dir: dir.to_path_buf(),
            items: text.lines().filter_map(Item::parse).collect(),
        }
    }

    fn add(&mut self, item: Item) {
        let line = item.line();
        if self.items.insert(item) {
            let file = fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(self.dir.join("owned"));
            if let Ok(mut f) = file {
                let _ = writeln!(f, "{line}");
            }
        }
    }

    /// `path` is the lab's to remove if it is not there yet (then made), from its topmost
    /// missing ancestor (`/run/k3s` for `/run/k3s/containerd` on a machine without k3s).
    pub(super) fn dir_if_new(&mut self, path: &Path) {
        if let Some(top) = path.ancestors().take_while(|p| !p.exists()).last() {
            self.add(Item::Dir(top.to_path_buf()));
        }
    }

    pub(super) fn netns(&mut self, path: &Path) {
        self.add(Item::Netns(path.to_path_buf()));
    }

    /// A pod's cgroup parent (`kubepods/besteffort/pod<uid>`), and each of its ancestors that
    /// no hierarchy has yet.
    pub(super) fn cgroup(&mut self, rel: &str) {
        let parts: Vec<&str> = rel.trim_matches('/').split('/').collect();
        for n in 1..=parts.len() {
            let path = parts[..n].join("/");
            let exists = hierarchies().any(|h| h.join(&path).exists());
            if n == parts.len() || !exists {
                self.add(Item::Cgroup(path));
            }
        }
    }

    pub(super) fn cni_network(&mut self, name: &str) {
        self.add(Item::CniNetwork(name.to_string()));
    }

    /// Everything recorded goes, in an order that lets each step succeed: processes, mounts,
    /// namespaces, cgroups, CNI state, directories. containerd itself is gone already.
    pub(super) fn clean(&self, socket: &Path, state: &Path) {
        kill_referencing(&self.dir);
        let cgroups: Vec<&str> = self
            .items
            .iter()
            .filter_map(|i| match i {
                Item::Cgroup(c) => Some(c.as_str()),
                _ => None,
            })
            .collect();
        kill_cgroups(&cgroups);
        let mut roots: Vec<PathBuf> = vec![self.dir.clone(), state.to_path_buf()];
        for item in &self.items {
            if let Item::Netns(p) | Item::Dir(p) = item {
                roots.push(p.clone());
            }
        }
        // mountinfo has resolved paths: the runtime names netns files under /var/run, a link
        // to /run on Debian.
        let roots: Vec<PathBuf> = roots
            .into_iter()
            .map(|r| fs::canonicalize(&r).unwrap_or(r))
            .collect();
        unmount_below(&roots);
        for item in &self.items {
            if let Item::Netns(p) = item {
                let _ = fs::remove_file(p);
            }
        }
        // Deepest first: a parent's rmdir needs its children gone.
        let mut by_depth = cgroups.clone();
        by_depth.sort_by_key(|c| std::cmp::Reverse(c.matches('/').count()));
        for c in by_depth {
            remove_cgroup_tree(c);
        }
        for item in &self.items {
            if let Item::CniNetwork(n) = item {
                let _ = fs::remove_dir_all(Path::new(CNI_STATE).join("networks").join(n));
                let prefix = format!("{n}-");
                let results = Path::new(CNI_STATE).join("results");
                for e in fs::read_dir(&results).into_iter().flatten().flatten() {
                    if e.file_name().to_string_lossy().starts_with(&prefix) {
                        let _ = fs::remove_file(e.path());
                    }
                }
            }
        }
        network::remove_bridge();
        self.clean_shim_sockets();
        // containerd's own dirs in a state directory that was there before the lab.
        for e in fs::read_dir(state).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with("io.containerd.") {
                let _ = fs::remove_dir_all(e.path());
            }
        }
        let _ = fs::remove_file(socket);
        // Deepest first (`/run/containerd/s` before `/run/containerd`).
        let mut dirs: Vec<&PathBuf> = self
            .items
            .iter()
            .filter_map(|i| match i {
                Item::Dir(p) => Some(p),
                _ => None,
            })
            .collect();
        dirs.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        for d in dirs {
            let _ = fs::remove_dir_all(d);
        }
        if std::env::var_os(KEEP_ENV).is_none() {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }

    /// Shim sockets the lab's shims left (a SIGKILLed shim does not remove its own).
    fn clean_shim_sockets(&self) {
        for e in fs::read_dir(SHIM_SOCKETS).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !self.items.contains(&Item::KeepSocket(name)) {
                let _ = fs::remove_file(e.path());
            }
        }
    }
}

/// Removes what CRI labs of runs whose process is gone left (their lab directory names the
/// dead pid): their containerd and shims, pods, mounts and the rest, as their drop would have.
pub fn cleanup_leftovers() {
    for e in fs::read_dir(LAB_DIR).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.ends_with("-cri") || !dead_run(&name) {
            continue;
        }
        let owned = Owned::load(&e.path());
        let state = fs::read_to_string(e.path().join("config.toml"))
            .ok()
            .and_then(|c| {
                c.lines()
                    .find_map(|l| l.strip_prefix("state = \""))
                    .map(|s| PathBuf::from(s.trim_end_matches('"')))
            });
        eprintln!(
            "CRI lab: cleaning up after a dead run, {}",
            e.path().display()
        );
        owned.clean(
            &e.path().join("containerd.sock"),
            &state.unwrap_or_else(|| e.path().join("state")),
        );
        let _ = fs::remove_dir_all(e.path());
    }
}

/// The cgroup hierarchies' roots (`/sys/fs/cgroup/<controller>` and the unified one on hybrid
/// hosts, `/sys/fs/cgroup` on pure v2 ones).
fn hierarchies() -> impl Iterator<Item = PathBuf> {
    let root = Path::new("/sys/fs/cgroup");
    let pure_v2 = root.join("cgroup.controllers").exists();
    let subdirs: Vec<PathBuf> = if pure_v2 {
        vec![root.to_path_buf()]
    } else {
        fs::read_dir(root)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            // Symlinks (`cpu` → `cpu,cpuacct`) would visit a hierarchy twice.
            .filter(|p| p.is_dir() && !p.is_symlink())
            .collect()
    };
    subdirs.into_iter()
}

/// SIGKILLs every process (containerd, its shims) whose command line names a path in `dir`:
/// the lab's containerd is started with its config there and the shims with its socket.
fn kill_referencing(dir: &Path) {
    let needle = dir.to_string_lossy().into_owned();
    let me = std::process::id();
    for e in fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if pid == me {
            continue;
        }
        let cmdline = fs::read(e.path().join("cmdline")).unwrap_or_default();
        let ours = cmdline
            .split(|b| *b == 0)
            .any(|a| String::from_utf8_lossy(a).contains(&needle));
        if ours {
            // SAFETY: plain kill(2) of a process the lab started (its command line says so).
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
    }
}

/// Every pid in `rel` and below, over all hierarchies.
fn pids_below(rel: &str) -> BTreeSet<i32> {
    let mut pids = BTreeSet::new();
    for h in hierarchies() {
        let mut stack = vec![h.join(rel)];
        while let Some(dir) = stack.pop() {
            let procs = fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
            pids.extend(procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
            for e in fs::read_dir(&dir).into_iter().flatten().flatten() {
                if e.path().is_dir() {
                    stack.push(e.path());
                }
            }
        }
    }
    pids
}

/// SIGKILLs the processes in the lab's cgroups (the pods' pause and app processes a dead shim
/// left) until none are left, 5 s at most.
fn kill_cgroups(cgroups: &[&str]) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let pids: BTreeSet<i32> = cgroups.iter().flat_map(|c| pids_below(c)).collect();
        if pids.is_empty() || Instant::now() > deadline {
            return;
        }
        for pid in pids {
            // SAFETY: plain kill(2) of a process in a cgroup the lab made.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// rmdir of `rel` in every hierarchy, its children first (runc removes a container's own
/// cgroup; what a failed run left below the pod's is taken too).
fn remove_cgroup_tree(rel: &str) {
    for h in hierarchies() {
        let top = h.join(rel);
        if !top.exists() {
            continue;
        }
        let mut dirs = vec![top.clone()];
        let mut i = 0;
        while i < dirs.len() {
            let children: Vec<PathBuf> = fs::read_dir(&dirs[i])
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.is_dir())
                .collect();
            dirs.extend(children);
            i += 1;
        }
        for d in dirs.iter().rev() {
            let _ = fs::remove_dir(d);
        }
    }
}

/// Unmounts (lazily, deepest first) every mount point at or below one of `roots`: the pods'
/// rootfs and shm mounts under the state directory, the netns bind mounts.
fn unmount_below(roots: &[PathBuf]) {
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut points: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(unescape)
        .filter(|p| roots.iter().any(|r| p.starts_with(r)))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    points.dedup();
    for p in points {
        let Ok(c) = std::ffi::CString::new(p.to_string_lossy().as_bytes()) else {
            continue;
        };
        // SAFETY: umount2 with a valid C string; a failure leaves the mount (reported below by
        // the directory removal failing quietly, as every other cleanup step).
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    }
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape(field: &str) -> PathBuf {
    let mut out = String::with_capacity(field.len());
    let mut chars = field.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\\' {
            let code: String = chars.by_ref().take(3).collect();
            match u8::from_str_radix(&code, 8) {
                Ok(b) => out.push(char::from(b)),
                Err(_) => {
                    out.push('\\');
                    out.push_str(&code);
                }
            }
        } else {
            out.push(c);
        }
    }
    PathBuf::from(out)
}
