//! Lab network safety: no lab packet leaves the machine.
//!
//! The machine's default route leads off it, and podman deletes its bridge and the bridge's
//! route when the last container on the network goes: a connect to a container address after
//! that would follow the default route. So every subnet a lab uses gets a fallback blackhole
//! route (the bridge's own route, metric 0, wins while it exists), each lab keeps its bridge up
//! while it sends (a holder container), and a lab checks the route before it sends and fails
//! instead when it leads anywhere but a local bridge.
//!
//! Plain std: `xtask setup` compiles this file too (`#[path]`), so the list of subnets is here
//! once.

use std::{net::IpAddr, process::Command, sync::OnceLock};

/// podman's default network (`podman network inspect podman`), where every podman lab runs.
pub const PODMAN_SUBNET: &str = "10.88.0.0/16";
/// The CRI lab's CNI bridge network.
pub const CRI_SUBNET: &str = "10.89.0.0/16";
/// The Service lab's client pod (`lab::pod_client`), routed through the host.
pub const POD_CLIENT_SUBNET: &str = "10.90.0.0/16";
/// Every subnet a lab puts containers on: each gets a fallback.
pub const LAB_SUBNETS: [&str; 3] = [PODMAN_SUBNET, CRI_SUBNET, POD_CLIENT_SUBNET];
/// Above any route a bridge or CNI plugin adds (metric 0), so it only catches what they left.
pub const FALLBACK_METRIC: u32 = 4000;

/// Installs `blackhole SUBNET metric 4000` unless it is there already.
pub fn ensure_fallback(subnet: &str) -> Result<(), String> {
    let shown = ip(&["route", "show", "exact", subnet, "table", "main"])?;
    if has_fallback(&shown, subnet) {
        return Ok(());
    }
    let metric = FALLBACK_METRIC.to_string();
    // `replace`: a concurrent run that added it meanwhile is no error.
    ip(&["route", "replace", "blackhole", subnet, "metric", &metric]).map(|_| ())
}

/// [`ensure_fallback`] for every subnet in [`LAB_SUBNETS`].
pub fn ensure_fallbacks() -> Result<(), String> {
    LAB_SUBNETS.iter().try_for_each(|s| ensure_fallback(s))
}

/// The device `ip` is routed through, when that is a local bridge (or other device) and not the
/// default route's, a gateway or a blackhole; why not otherwise. Call it before sending to a
/// container address, and fail rather than send when it errs.
pub fn require_bridge_route(ip: IpAddr) -> Result<String, String> {
    let addr = ip.to_string();
    let out = Command::new("ip")
        .args(["route", "get", &addr])
        .output()
        .map_err(|e| format!("running ip route get {addr}: {e}"))?;
    let route = parse_route_get(
        out.status.success(),
        &String::from_utf8_lossy(&out.stdout),
        &String::from_utf8_lossy(&out.stderr),
    )
    .map_err(|e| format!("{addr}: {e}"))?;
    judge(&route, default_route_dev()?.as_deref()).map_err(|e| format!("{addr}: {e}"))
}

/// The default route's device, read once: it does not move during a run, and the check runs
/// before every one-shot request of a lab.
fn default_route_dev() -> Result<Option<String>, String> {
    static DEFAULT: OnceLock<Option<String>> = OnceLock::new();
    if let Some(d) = DEFAULT.get() {
        return Ok(d.clone());
    }
    let d = default_dev(&ip(&["route", "show", "default"])?);
    Ok(DEFAULT.get_or_init(|| d).clone())
}

/// What `ip route get` said about one address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteGet {
    /// The route's type when `ip` names one (`local`, `blackhole`, `unreachable`, ...).
    pub kind: Option<String>,
    pub via: Option<String>,
    pub dev: Option<String>,
}

/// Parses `ip route get ADDR`'s outcome. A blackhole route makes it fail with EINVAL
/// ("RTNETLINK answers: Invalid argument"): that is an error naming the blackhole.
pub fn parse_route_get(success: bool, stdout: &str, stderr: &str) -> Result<RouteGet, String> {
    if !success {
        let err = stderr.trim();
        return Err(if err.contains("Invalid argument") {
            format!("blackholed (no bridge route, only the fallback): {err}")
        } else {
            format!("no route: {err}")
        });
    }
    let first = stdout.lines().next().unwrap_or_default();
    let words: Vec<&str> = first.split_whitespace().collect();
    let Some(head) = words.first() else {
        return Err(format!("ip route get printed nothing: {stdout:?}"));
    };
    let kind = head.parse::<IpAddr>().is_err().then(|| head.to_string());
    let after = |key: &str| {
        words
            .windows(2)
            .find(|w| w[0] == key)
            .map(|w| w[1].to_string())
    };
    Ok(RouteGet {
        kind,
        via: after("via"),
        dev: after("dev"),
    })
}

/// The device of the default route (`ip route show default`), if there is one.
pub fn default_dev(shown: &str) -> Option<String> {
    shown
        .lines()
        .filter(|l| l.starts_with("default"))
        .find_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            w.windows(2)
                .find(|p| p[0] == "dev")
                .map(|p| p[1].to_string())
        })
}

/// The device when `route` stays on the machine: a direct route on a device other than the
/// default route's (a lab's bridge, or `lo` for a local address).
pub fn judge(route: &RouteGet, default_dev: Option<&str>) -> Result<String, String> {
    if let Some(k) = route.kind.as_deref().filter(|k| *k != "local") {
        return Err(format!("routed as {k}, not through a bridge"));
    }
    if let Some(via) = &route.via {
        return Err(format!("routed via the gateway {via}: off the machine"));
    }
    let dev = route.dev.clone().ok_or("the route names no device")?;
    if default_dev == Some(dev.as_str()) {
        return Err(format!(
            "routed through {dev}, the default route's device: off the machine"
        ));
    }
    Ok(dev)
}

/// Whether `ip route show exact SUBNET` lists our blackhole.
fn has_fallback(shown: &str, subnet: &str) -> bool {
    let metric = FALLBACK_METRIC.to_string();
    shown.lines().any(|l| {
        let w: Vec<&str> = l.split_whitespace().collect();
        w.starts_with(&["blackhole", subnet]) && w.windows(2).any(|p| p == ["metric", &metric])
    })
}

/// `ip <args>`: stdout, or why it failed.
pub fn ip(args: &[&str]) -> Result<String, String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("running ip {args:?}: {e} (iproute2)"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "ip {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Captured on the test machine (default via 192.0.2.1 dev eth0, podman0 on 10.88.0.1/16).
    const BRIDGE: &str = "10.88.0.5 dev podman0 src 10.88.0.1 uid 0 \n    cache \n";
    const DEFAULT: &str = "10.88.0.5 via 192.0.2.1 dev eth0 src 192.0.2.2 uid 0 \n    cache \n";
    // With the fallback and podman0 gone: exit 2, nothing on stdout.
    const BLACKHOLE_ERR: &str = "RTNETLINK answers: Invalid argument\n";
    const GATEWAY: &str = "local 10.88.0.1 dev lo src 10.88.0.1 uid 0 \n    cache <local> \n";
    const SHOW_DEFAULT: &str = "default via 192.0.2.1 dev eth0 \n";

    fn judged(success: bool, out: &str, err: &str) -> Result<String, String> {
        judge(
            &parse_route_get(success, out, err)?,
            default_dev(SHOW_DEFAULT).as_deref(),
        )
    }

    #[test]
    fn a_bridge_route_names_the_bridge() {
        assert_eq!(judged(true, BRIDGE, ""), Ok("podman0".into()));
    }

    #[test]
    fn the_default_route_is_refused() {
        let e = judged(true, DEFAULT, "").unwrap_err();
        assert!(e.contains("via the gateway 192.0.2.1"), "{e}");
        let no_via = "10.88.0.5 dev eth0 src 192.0.2.2 uid 0 \n";
        let e = judged(true, no_via, "").unwrap_err();
        assert!(e.contains("default route's device"), "{e}");
    }

    #[test]
    fn the_blackhole_is_refused() {
        let e = judged(false, "", BLACKHOLE_ERR).unwrap_err();
        assert!(e.contains("blackholed"), "{e}");
        let e = judged(true, "blackhole 10.88.0.5 uid 0 \n", "").unwrap_err();
        assert!(e.contains("routed as blackhole"), "{e}");
    }

    #[test]
    fn a_local_address_stays_on_the_machine() {
        assert_eq!(judged(true, GATEWAY, ""), Ok("lo".into()));
    }

    #[test]
    fn the_default_device_and_the_fallback_are_read_from_ip_route_show() {
        assert_eq!(default_dev(SHOW_DEFAULT).as_deref(), Some("eth0"));
        assert_eq!(default_dev(""), None);
        let shown = "10.88.0.0/16 dev podman0 proto kernel scope link src 10.88.0.1 \n\
                     blackhole 10.88.0.0/16 metric 4000 \n";
        assert!(has_fallback(shown, "10.88.0.0/16"));
        assert!(!has_fallback(shown, "10.89.0.0/16"));
        assert!(!has_fallback(
            "10.88.0.0/16 dev podman0 proto kernel scope link src 10.88.0.1 \n",
            "10.88.0.0/16"
        ));
    }
}
