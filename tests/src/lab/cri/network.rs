//! The lab's pod network: a CNI bridge + host-local config with no default route, and the
//! checks that keep the lab's traffic on this machine (see ENVIRONMENT.md, "Lab network
//! safety").

use std::net::IpAddr;

use super::{BRIDGE, NETWORK, SUBNET};
use crate::lab::net;

/// The CNI network: a bridge that is the pods' gateway on the subnet (the host reaches them
/// through it) but not their default gateway, host-local addresses with no routes (a pod can
/// reach its subnet and nothing else), no masquerading.
pub(super) fn conflist() -> String {
    format!(
        r#"{{
  "cniVersion": "0.4.0",
  "name": "{NETWORK}",
  "plugins": [
    {{
      "type": "bridge",
      "bridge": "{BRIDGE}",
      "isGateway": true,
      "isDefaultGateway": false,
      "ipMasq": false,
      "hairpinMode": false,
      "ipam": {{
        "type": "host-local",
        "ranges": [[{{ "subnet": "{SUBNET}" }}]]
      }}
    }}
  ]
}}
"#
    )
}

/// The shared fallback (`lab::net`): a blackhole for the CRI labs' range, under any route a
/// bridge adds; whatever the lab's bridge route no longer covers is dropped there instead of
/// leaving by the default route. Kept after the lab: it drops nothing else.
pub(super) fn ensure_fallback() {
    net::ensure_fallback(net::CRI_SUBNET)
        .unwrap_or_else(|e| panic!("the fallback route for {}: {e}", net::CRI_SUBNET));
}

/// Fails (saying where the route goes) unless `addr` routes via the lab's bridge: the check
/// before every send phase. Stricter than `lab::net`'s (any local device): the pods' addresses
/// are on this bridge and nowhere else.
pub fn require_bridge_route(addr: IpAddr) -> Result<(), String> {
    match net::require_bridge_route(addr)? {
        dev if dev == BRIDGE => Ok(()),
        dev => Err(format!(
            "{addr} routes via {dev}, not {BRIDGE}: refusing to send"
        )),
    }
}

/// Removes the lab's bridge (the CNI bridge plugin never does) if it is there.
pub(super) fn remove_bridge() {
    if net::ip(&["link", "show", "dev", BRIDGE]).is_ok() {
        let _ = net::ip(&["link", "del", "dev", BRIDGE]);
    }
}
