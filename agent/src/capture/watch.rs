//! The maps that say which host-namespace traffic the programs keep (`drainwatch_common::watch`):
//! kept equal to a `WatchSet` the enricher derives from what it knows of containers. A thin
//! wrapper: it applies differences and reports entries the kernel would not take.

use std::{collections::BTreeSet, net::IpAddr};

use aya::maps::{Array, HashMap, MapData, MapError};
use drainwatch_common::{
    AF_INET, AF_INET6,
    sock_length::ReqState,
    watch::{ANY_PORT, Addr, pod_listener},
};

use super::CaptureError;

/// What the host namespace's traffic is kept for: containers' addresses (outside the host
/// namespace) and ports of listeners that host-network containers own or owned.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WatchSet {
    pub addrs: BTreeSet<IpAddr>,
    pub ports: BTreeSet<u16>,
    /// Proxies (thread-group ids): their connects get followed upstream sockets
    /// (`sock_length`).
    pub proxies: BTreeSet<u32>,
    /// Listening ports (open or closed) of pods' namespaces that more than one container
    /// shares, by (namespace inode, port): a loopback connect to one is kept whole and
    /// followed (a sidecar proxying to its app), where other loopback connects are dropped.
    pub pod_listeners: BTreeSet<(u32, u16)>,
}

/// The map key for an address; `None` for those the programs never look up (loopback, unset).
pub fn key(ip: IpAddr) -> Option<Addr> {
    match ip {
        IpAddr::V4(v4) => {
            let mut a = [0; 16];
            a[..4].copy_from_slice(&v4.octets());
            Addr::of(AF_INET, &a)
        }
        IpAddr::V6(v6) => Addr::of(AF_INET6, &v6.octets()),
    }
}

pub struct Watch {
    ports: Array<MapData, u8>,
    addrs: HashMap<MapData, Addr, u8>,
    proxies: HashMap<MapData, u32, u8>,
    /// `POD_PORTS` and `POD_LISTENERS` (`WatchSet::pod_listeners`).
    pod_ports: Array<MapData, u8>,
    pod_listeners: HashMap<MapData, u64, u8>,
    /// `UPSTREAM_SOCKS`.
    upstreams: HashMap<MapData, u64, ReqState>,
    current: WatchSet,
}

/// How applying a set went: what the maps hold now, and addresses the kernel refused (the
/// map is full).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Applied {
    pub addrs: usize,
    pub ports: usize,
    pub refused: u64,
}

impl Watch {
    pub(super) fn take(ebpf: &mut aya::Ebpf) -> Result<Self, CaptureError> {
        let ports = ebpf
            .take_map("WATCH_PORTS")
            .ok_or(CaptureError::NoMap("WATCH_PORTS"))?;
        let addrs = ebpf
            .take_map("WATCH_ADDRS")
            .ok_or(CaptureError::NoMap("WATCH_ADDRS"))?;
        let proxies = ebpf
            .take_map("PROXIES")
            .ok_or(CaptureError::NoMap("PROXIES"))?;
        let upstreams = ebpf
            .take_map("UPSTREAM_SOCKS")
            .ok_or(CaptureError::NoMap("UPSTREAM_SOCKS"))?;
        let pod_ports = ebpf
            .take_map("POD_PORTS")
            .ok_or(CaptureError::NoMap("POD_PORTS"))?;
        let pod_listeners = ebpf
            .take_map("POD_LISTENERS")
            .ok_or(CaptureError::NoMap("POD_LISTENERS"))?;
        Ok(Self {
            ports: Array::try_from(ports)?,
            addrs: HashMap::try_from(addrs)?,
            proxies: HashMap::try_from(proxies)?,
            pod_ports: Array::try_from(pod_ports)?,
            pod_listeners: HashMap::try_from(pod_listeners)?,
            upstreams: HashMap::try_from(upstreams)?,
            current: WatchSet::default(),
        })
    }

    /// Follows upstream sockets the kernel did not (opened before their process was in
    /// `PROXIES`); an entry the kernel made already is left alone. Returns how many the map
    /// had no room for (`--upstream-entries`): those are not followed.
    pub fn follow(&mut self, socks: &[u64]) -> Result<u64, MapError> {
        const BPF_NOEXIST: u64 = 1;
        let mut refused = 0;
        for sk in socks {
            match self.upstreams.insert(sk, ReqState::default(), BPF_NOEXIST) {
                Ok(()) => {}
                Err(MapError::SyscallError(e)) => match e.io_error.raw_os_error() {
                    Some(libc::EEXIST) => {}
                    Some(libc::E2BIG) => refused += 1,
                    _ => return Err(MapError::SyscallError(e)),
                },
                Err(e) => return Err(e),
            }
        }
        Ok(refused)
    }

    /// Makes the maps say `want`. An address the kernel refuses is left out (and retried on
    /// the next call); other errors are returned after the rest is applied.
    pub fn apply(&mut self, want: &WatchSet) -> Result<Applied, MapError> {
        let mut applied = Applied::default();
        let mut first_err = None;
        let mut note = |r: Result<(), MapError>| {
            if let Err(e) = r {
                first_err.get_or_insert(e);
            }
        };
        for gone in self.current.addrs.difference(&want.addrs) {
            if let Some(k) = key(*gone) {
                note(self.addrs.remove(&k));
            }
        }
        let mut addrs = BTreeSet::new();
        for ip in &want.addrs {
            let Some(k) = key(*ip) else { continue };
            if self.current.addrs.contains(ip) {
                addrs.insert(*ip);
                continue;
            }
            match self.addrs.insert(k, 1, 0) {
                Ok(()) => {
                    addrs.insert(*ip);
                }
                // E2BIG: full. Counted, not fatal: that container's host-side traffic is missed.
                Err(MapError::SyscallError(e))
                    if e.io_error.raw_os_error() == Some(libc::E2BIG) =>
                {
                    applied.refused += 1;
                }
                Err(e) => note(Err(e)),
            }
        }
        for gone in self.current.ports.difference(&want.ports) {
            note(self.ports.set(u32::from(*gone), 0, 0));
        }
        for new in want.ports.difference(&self.current.ports) {
            note(self.ports.set(u32::from(*new), 1, 0));
        }
        note(
            self.ports
                .set(ANY_PORT, u8::from(!want.ports.is_empty()), 0),
        );
        for gone in self.current.proxies.difference(&want.proxies) {
            note(self.proxies.remove(gone));
        }
        for new in want.proxies.difference(&self.current.proxies) {
            note(self.proxies.insert(new, 1, 0));
        }
        let pod_listeners = self.apply_pod_listeners(&want.pod_listeners, &mut applied, &mut note);
        applied.addrs = addrs.len();
        applied.ports = want.ports.len();
        self.current = WatchSet {
            addrs,
            ports: want.ports.clone(),
            proxies: want.proxies.clone(),
            pod_listeners,
        };
        first_err.map_or(Ok(applied), Err)
    }

    /// `POD_LISTENERS` and its ports' bytes in `POD_PORTS`: entries first, so a port's byte is
    /// never set before its entries are there to look up (a byte set early only costs a
    /// lookup). Returns what the map holds now (an entry refused, full, is retried next time).
    fn apply_pod_listeners(
        &mut self,
        want: &BTreeSet<(u32, u16)>,
        applied: &mut Applied,
        note: &mut impl FnMut(Result<(), MapError>),
    ) -> BTreeSet<(u32, u16)> {
        let current = &self.current.pod_listeners;
        for (ns, port) in current.difference(want) {
            note(self.pod_listeners.remove(&pod_listener(*ns, *port)));
        }
        let mut now: BTreeSet<(u32, u16)> = current.intersection(want).copied().collect();
        for (ns, port) in want.difference(current) {
            match self.pod_listeners.insert(pod_listener(*ns, *port), 1, 0) {
                Ok(()) => {
                    now.insert((*ns, *port));
                }
                Err(MapError::SyscallError(e))
                    if e.io_error.raw_os_error() == Some(libc::E2BIG) =>
                {
                    applied.refused += 1;
                }
                Err(e) => note(Err(e)),
            }
        }
        let ports = |s: &BTreeSet<(u32, u16)>| s.iter().map(|(_, p)| *p).collect::<BTreeSet<_>>();
        let (before, after) = (ports(current), ports(&now));
        for gone in before.difference(&after) {
            note(self.pod_ports.set(u32::from(*gone), 0, 0));
        }
        for new in after.difference(&before) {
            note(self.pod_ports.set(u32::from(*new), 1, 0));
        }
        now
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_match_what_the_programs_look_up() {
        let v4: IpAddr = "10.88.0.2".parse().unwrap();
        let k = key(v4).unwrap();
        assert_eq!(
            (k.family, &k.addr[..4], &k.addr[4..]),
            (AF_INET, &[10, 88, 0, 2][..], &[0; 12][..])
        );
        // A dual-stack socket reports the mapped form: the same key.
        let mut mapped = [0u8; 16];
        mapped[10..12].copy_from_slice(&[0xff, 0xff]);
        mapped[12..].copy_from_slice(&[10, 88, 0, 2]);
        assert_eq!(Addr::of(AF_INET6, &mapped), Some(k));
        let v6: IpAddr = "fd00::5".parse().unwrap();
        assert_eq!(key(v6).unwrap().family, AF_INET6);
        for never in ["127.0.0.1", "0.0.0.0", "::1", "::", "::ffff:127.0.0.1"] {
            assert_eq!(key(never.parse().unwrap()), None, "{never}");
        }
    }
}
