//! The matrix's initramfs: busybox, the agent, the `kernel-matrix` runner and the shared
//! libraries `ldd` names for them, and an `/init` that mounts what the agent reads (proc,
//! sysfs, tracefs, cgroup v2, bpffs), brings up loopback, runs the runner and powers off. One
//! archive serves every kernel: nothing in it is kernel-specific and no module is loaded
//! (serial console, initramfs, loopback, network namespaces and cgroups are built into the
//! Debian cloud kernels).

use std::{
    collections::BTreeSet,
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

use super::cpio::{Entry, Writer};

/// What `/init` runs. The runner's filter comes from the kernel command line (`dwk.filter=`).
const INIT: &str = r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null || mount -t debugfs debugfs /sys/kernel/debug
mount -t cgroup2 cgroup2 /sys/fs/cgroup
mount -t bpf bpf /sys/fs/bpf
mount -t tmpfs tmpfs /tmp
ip link set lo up
filter=$(sed -n 's/.*dwk\.filter=\([^ ]*\).*/\1/p' /proc/cmdline)
echo "DWK-BOOT $(uname -r) $(cut -d' ' -f1 /proc/uptime)"
DRAINWATCH_BIN=/bin/drainwatch /bin/kernel-matrix $filter
echo "DWK-EXIT $? $(cut -d' ' -f1 /proc/uptime)"
poweroff -f
"#;

/// The libraries `ldd` lists for `bin` (the dynamic loader included).
fn libraries(bin: &Path) -> Result<Vec<PathBuf>> {
    let out = Command::new("ldd")
        .arg(bin)
        .output()
        .with_context(|| format!("ldd {}", bin.display()))?;
    if !out.status.success() {
        bail!("ldd {} failed", bin.display());
    }
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text
        .lines()
        .filter_map(|l| {
            // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)", "/lib64/ld-linux-x86-64.so.2 (0x…)"
            let path = match l.split_once("=>") {
                Some((_, rest)) => rest.split_whitespace().next()?,
                None => l.split_whitespace().next()?,
            };
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect())
}

/// Every directory above `path`, outermost first.
fn parents(path: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    for part in &parts[..parts.len().saturating_sub(1)] {
        cur.push('/');
        cur.push_str(part);
        out.push(cur.clone());
    }
    out
}

/// Writes the initramfs for the agent `agent` and the runner `runner` to `out`.
pub fn build(agent: &Path, runner: &Path, busybox: &Path, out: &Path) -> Result<u64> {
    let mut files: Vec<(String, PathBuf)> = vec![
        ("/bin/busybox".into(), busybox.to_path_buf()),
        ("/bin/drainwatch".into(), agent.to_path_buf()),
        ("/bin/kernel-matrix".into(), runner.to_path_buf()),
    ];
    let mut libs = BTreeSet::new();
    for bin in [agent, runner] {
        libs.extend(libraries(bin)?);
    }
    for lib in libs {
        // Copied under the path the loader looks for (a symlink's target read through).
        files.push((lib.to_string_lossy().into_owned(), lib));
    }
    let mut dirs: BTreeSet<String> = [
        "/bin", "/dev", "/proc", "/sys", "/tmp", "/run", "/etc", "/root",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    for (path, _) in &files {
        dirs.extend(parents(path));
    }
    let tmp = out.with_extension("partial");
    let mut w = Writer::new(std::io::BufWriter::new(
        fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?,
    ));
    for d in &dirs {
        w.add(&Entry::Dir { path: d })?;
    }
    // The kernel opens /dev/console for init's stdio before /init can mount devtmpfs.
    w.add(&Entry::CharDev {
        path: "/dev/console",
        major: 5,
        minor: 1,
    })?;
    w.add(&Entry::File {
        path: "/init",
        mode: 0o755,
        data: INIT.as_bytes(),
    })?;
    w.add(&Entry::Symlink {
        path: "/bin/sh",
        target: "busybox",
    })?;
    for (path, src) in &files {
        let data = fs::read(src).with_context(|| format!("reading {}", src.display()))?;
        w.add(&Entry::File {
            path,
            mode: 0o755,
            data: &data,
        })?;
    }
    w.finish()?;
    fs::rename(&tmp, out)?;
    Ok(fs::metadata(out)?.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parents_are_listed_outermost_first() {
        assert_eq!(
            parents("/lib/x86_64-linux-gnu/libc.so.6"),
            ["/lib", "/lib/x86_64-linux-gnu"]
        );
        assert_eq!(parents("/init"), Vec::<String>::new());
    }

    #[test]
    fn ldd_names_the_loader_and_libc() {
        let libs = libraries(Path::new("/bin/ls")).unwrap();
        assert!(
            libs.iter()
                .any(|l| l.to_string_lossy().contains("ld-linux")),
            "{libs:?}"
        );
        assert!(
            libs.iter().any(|l| l.to_string_lossy().contains("libc.so")),
            "{libs:?}"
        );
    }
}
