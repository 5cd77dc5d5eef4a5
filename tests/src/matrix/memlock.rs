//! The agent under a 64 KiB RLIMIT_MEMLOCK without CAP_SYS_RESOURCE (a container runtime's
//! default limit, a DaemonSet that drops every capability it was not proven to need). Where
//! the kernel charges eBPF map memory to that limit (before 5.11) the agent cannot create its
//! maps and must say why (exit 2, the limit named); elsewhere it must start as usual. Which
//! kernel charges is the kernel's own answer: a 1 MiB map created under the same limits.

use std::{
    os::unix::process::CommandExt,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use crate::agent::{binary, free_port, get};

const LIMIT: u64 = 64 * 1024;
const CAP_SYS_RESOURCE: libc::c_ulong = 24;

/// `cmd` to run with RLIMIT_MEMLOCK at 64 KiB and CAP_SYS_RESOURCE out of its bounding set
/// (so root's exec does not get it back).
fn limited(cmd: &mut Command) -> &mut Command {
    // SAFETY: between fork and exec only async-signal-safe calls: setrlimit, prctl.
    unsafe {
        cmd.pre_exec(|| {
            let lim = libc::rlimit {
                rlim_cur: LIMIT,
                rlim_max: LIMIT,
            };
            if libc::setrlimit(libc::RLIMIT_MEMLOCK, &lim) != 0
                || libc::prctl(libc::PR_CAPBSET_DROP, CAP_SYS_RESOURCE, 0, 0, 0) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    }
}

/// `kernel-matrix memlock-probe`: creates a 1 MiB array map; exit 0 if it could, 1 on EPERM,
/// 2 on anything else.
pub fn probe() -> ! {
    // bpf_attr for BPF_MAP_CREATE: map_type, key_size, value_size, max_entries, the rest 0.
    let mut attr = [0u32; 12];
    attr[..4].copy_from_slice(&[2, 4, 4096, 256]); // BPF_MAP_TYPE_ARRAY, 256 × 4 KiB
    // SAFETY: bpf(2) with a zero-padded attribute block of the size passed.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            0, // BPF_MAP_CREATE
            attr.as_ptr(),
            std::mem::size_of_val(&attr),
        )
    };
    let code = match fd {
        fd if fd >= 0 => 0,
        _ if std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM) => 1,
        _ => 2,
    };
    std::process::exit(code)
}

pub fn check() -> String {
    let me = std::env::current_exe().expect("own path");
    let status = limited(Command::new(me).arg("memlock-probe"))
        .status()
        .expect("run the memlock probe");
    let charged = match status.code() {
        Some(0) => false,
        Some(1) => true,
        other => panic!("the memlock probe failed: {other:?}"),
    };
    let port = free_port();
    let log = std::env::temp_dir().join(format!("dw-matrix-memlock-{}.log", std::process::id()));
    let mut agent = limited(
        Command::new(binary())
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file")),
    )
    .spawn()
    .expect("spawn drainwatch");
    let t = Instant::now();
    let outcome = loop {
        if let Some(s) = agent.try_wait().expect("wait") {
            break Err(s);
        }
        if let Ok((200, _, _)) = get(port, "/readyz", "*/*") {
            break Ok(());
        }
        assert!(
            t.elapsed() < Duration::from_secs(180),
            "neither ready nor exited in 180 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let _ = agent.kill();
    let _ = agent.wait();
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    match (charged, outcome) {
        (true, Err(s)) => {
            assert_eq!(s.code(), Some(2), "{text}");
            assert!(
                text.contains("RLIMIT_MEMLOCK")
                    && text.contains("64 KiB")
                    && text.contains("CAP_SYS_RESOURCE"),
                "the agent must name the limit: {text}"
            );
            "kernel charges maps to RLIMIT_MEMLOCK: the agent exits 2 naming the 64 KiB limit and CAP_SYS_RESOURCE".into()
        }
        (false, Ok(())) => {
            "maps are charged to the memory cgroup: the agent runs under a 64 KiB limit".into()
        }
        (true, Ok(())) => {
            panic!("a 1 MiB map failed under the limit, but the agent started: {text}")
        }
        (false, Err(s)) => panic!(
            "the agent failed under a 64 KiB memlock limit the kernel does not charge: {s}: {text}"
        ),
    }
}
