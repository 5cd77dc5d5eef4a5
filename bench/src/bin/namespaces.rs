//! Containers made of real kernel objects, for the benchmark's scale phase: one process per
//! network namespace (made beforehand with `ip netns add <prefix>-<i>`), in a cgroup the agent
//! takes for a Docker container's (`<cgroup parent>/docker-<64 hex>.scope` on the unified
//! hierarchy), with `lo` up, a listener on 127.0.0.1:8080 and `<conns>` connections to it,
//! both ends held open. What the agent needs to adopt a container, and nothing else: it finds
//! containers by their processes' cgroups, and their listeners and connections through the
//! main process's namespace and descriptors.
//!
//! namespaces <prefix> <count> <conns per namespace> <cgroup parent dir>
//!
//! Prints one JSON line once every process holds its sockets, then waits until its stdin
//! closes (or it is killed): each process dies with it (`PR_SET_PDEATHSIG`).

use std::{
    io::{Read as _, Write as _},
    net::{Ipv4Addr, SocketAddr, TcpStream},
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    path::Path,
};

const PORT: u16 = 8080;

/// The id of container `i`: its first 12 hex digits (what names a container without runtime
/// state) differ between containers, the rest keeps runs apart.
fn container_id(i: usize, run: u32) -> String {
    format!("{i:06x}{run:08x}{:050x}", 0xd7a1u32)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let parsed = (|| {
        let prefix = args.get(1)?.clone();
        let count: usize = args.get(2)?.parse().ok()?;
        let conns: usize = args.get(3)?.parse().ok()?;
        let parent = args.get(4)?.clone();
        Some((prefix, count, conns, parent))
    })();
    let Some((prefix, count, conns, parent)) = parsed else {
        eprintln!("usage: namespaces <prefix> <count> <conns per namespace> <cgroup parent dir>");
        std::process::exit(2);
    };
    match run(&prefix, count, conns, Path::new(&parent)) {
        Ok(()) => {}
        Err(e) => {
            eprintln!("namespaces: {e}");
            std::process::exit(1);
        }
    }
}

fn run(prefix: &str, count: usize, conns: usize, parent: &Path) -> Result<(), String> {
    raise_nofile();
    let mut fds = [0; 2];
    // SAFETY: pipe(2) fills the two descriptors.
    if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
        return Err(format!("pipe: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: both descriptors were just created and are owned here.
    let (ready_r, ready_w) =
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let run_id = std::process::id();
    for i in 0..count {
        let cgroup = parent.join(format!("docker-{}.scope", container_id(i, run_id)));
        std::fs::create_dir_all(&cgroup).map_err(|e| format!("{}: {e}", cgroup.display()))?;
        let netns = format!("/run/netns/{prefix}-{i}");
        // SAFETY: this process is single-threaded, so the child may run ordinary code.
        match unsafe { libc::fork() } {
            -1 => return Err(format!("fork: {}", std::io::Error::last_os_error())),
            0 => {
                drop(ready_r);
                let code = match hold(&netns, &cgroup, conns, ready_w) {
                    Ok(()) => 0,
                    Err(e) => {
                        eprintln!("namespaces: {netns}: {e}");
                        1
                    }
                };
                // SAFETY: leaves the child without running the parent's exit handlers.
                unsafe { libc::_exit(code) };
            }
            _ => {}
        }
    }
    drop(ready_w);
    // Each process writes one byte once it holds its sockets; end of file when every process
    // has written or died.
    let mut ready = Vec::new();
    std::fs::File::from(ready_r)
        .read_to_end(&mut ready)
        .map_err(|e| format!("reading readiness: {e}"))?;
    if ready.len() != count {
        return Err(format!("{} of {count} namespaces ready", ready.len()));
    }
    println!(
        "{{\"namespaces\":{count},\"connections\":{},\"cgroup_parent\":\"{}\"}}",
        count * conns,
        parent.display()
    );
    let _ = std::io::stdout().flush();
    // Until the benchmark closes our stdin: then every holder dies with us.
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    Ok(())
}

/// One container's process: into the namespace and the cgroup, then a listener and `conns`
/// connections to it, held until the parent dies.
fn hold(netns: &str, cgroup: &Path, conns: usize, ready: OwnedFd) -> Result<(), String> {
    // SAFETY: prctl with integer arguments.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
    let ns = std::fs::File::open(netns).map_err(|e| format!("open: {e}"))?;
    // SAFETY: setns(2) on a namespace descriptor we hold.
    if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(format!("setns: {}", std::io::Error::last_os_error()));
    }
    loopback_up()?;
    std::fs::write(cgroup.join("cgroup.procs"), std::process::id().to_string())
        .map_err(|e| format!("joining {}: {e}", cgroup.display()))?;
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, PORT));
    let listener = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
        .map_err(|e| e.to_string())?;
    listener
        .bind(&addr.into())
        .and_then(|()| listener.listen(1024))
        .map_err(|e| format!("listen: {e}"))?;
    let mut held = Vec::with_capacity(2 * conns);
    for _ in 0..conns {
        let client = TcpStream::connect(addr).map_err(|e| format!("connect: {e}"))?;
        let (server, _) = listener.accept().map_err(|e| format!("accept: {e}"))?;
        held.push((client, server));
    }
    std::fs::File::from(ready)
        .write_all(b"r")
        .map_err(|e| e.to_string())?;
    loop {
        // SAFETY: pause(2) has no preconditions; only a signal ends it (and us).
        unsafe { libc::pause() };
    }
}

/// `ip link set lo up` in the current namespace, without a process per namespace.
fn loopback_up() -> Result<(), String> {
    // SAFETY: a datagram socket only for the interface ioctls, closed by OwnedFd.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(format!("socket: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: fd was just created.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ifreq is plain data; zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS/SIOCSIFFLAGS read and write the flags member of a named ifreq.
    unsafe {
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) != 0 {
            return Err(format!("SIOCGIFFLAGS: {}", std::io::Error::last_os_error()));
        }
        req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) != 0 {
            return Err(format!("SIOCSIFFLAGS: {}", std::io::Error::last_os_error()));
        }
    }
    Ok(())
}

/// Each process holds two descriptors per connection.
fn raise_nofile() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit fill and read a plain struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}
