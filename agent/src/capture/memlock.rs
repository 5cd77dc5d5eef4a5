//! RLIMIT_MEMLOCK. Kernels before 5.11 charge eBPF map memory to the locked-memory limit of
//! the process that creates the map (later ones charge the memory cgroup). aya lifts the limit
//! to unlimited itself when a map creation fails with EPERM on such a kernel, which takes
//! CAP_SYS_RESOURCE; without it (a DaemonSet that drops it) the 1 MiB ring buffer alone is
//! past the common default of 64 KiB. The agent first raises its soft limit to the hard one
//! (no privilege needed), and when creating the maps still fails with EPERM under a finite
//! limit, says so instead of naming capabilities the preflight has already checked.

/// The soft limit, raised to the hard one if lower; `None` when unlimited.
pub fn raise_soft_to_hard() -> Option<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a valid rlimit pointer; RLIMIT_MEMLOCK is a valid resource.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) != 0 {
            return None;
        }
        if lim.rlim_cur < lim.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: lim.rlim_max,
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_MEMLOCK, &raised) == 0 {
                lim.rlim_cur = lim.rlim_max;
            }
        }
    }
    (lim.rlim_cur != libc::RLIM_INFINITY).then_some(lim.rlim_cur)
}

/// Whether this kernel charges map memory to RLIMIT_MEMLOCK (before 5.11; assumed when the
/// version cannot be read).
pub fn charged() -> bool {
    use aya::util::KernelVersion;
    KernelVersion::current().map_or(true, |v| v < KernelVersion::new(5, 11, 0))
}

/// Whether `e`, or an error it was caused by, is EPERM from the kernel.
pub fn is_eperm(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if err
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.raw_os_error() == Some(libc::EPERM))
        {
            return true;
        }
        cur = err.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eperm_is_found_under_aya_s_map_error() {
        let map = |errno| {
            aya::EbpfError::MapError(aya::maps::MapError::CreateError {
                name: "EVENTS".into(),
                io_error: std::io::Error::from_raw_os_error(errno),
            })
        };
        assert!(is_eperm(&map(libc::EPERM)));
        assert!(!is_eperm(&map(libc::EINVAL)));
        assert!(!is_eperm(&std::fmt::Error));
    }
}
