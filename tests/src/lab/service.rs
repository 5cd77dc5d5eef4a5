//! A Kubernetes Service on the lab's bridge, as kube-proxy builds it: a virtual IP that no
//! interface has, DNATed to its endpoints (podman containers) by kube-proxy's own rule
//! structures, in either mode.
//!
//! - iptables mode (`iptables-nft`, as Debian's `iptables` is): nat `OUTPUT` and `PREROUTING`
//!   → `KUBE-SERVICES` → `KUBE-SVC-…` (one `-m statistic --mode random --probability 1/n` rule
//!   per endpoint but the last) → `KUBE-SEP-…` (`KUBE-MARK-MASQ` for hairpin traffic, then
//!   `DNAT`); a Service with no endpoints is a filter `KUBE-SERVICES` `REJECT --reject-with
//!   icmp-port-unreachable` reached from filter `OUTPUT` and `FORWARD` for new connections.
//!   Written with `iptables-restore --noflush`, whose declared chains are flushed and refilled
//!   in one commit, as kube-proxy syncs.
//! - nftables mode (GA in 1.33): table `ip kube-proxy`, `nat-output` and `nat-prerouting` →
//!   `services` → the `service-ips` verdict map → `service-…` (`numgen random mod n vmap`) →
//!   `endpoint-…` (`dnat to`); no endpoints: `filter-output` and `filter-forward` →
//!   `service-endpoints-check` → the `no-endpoint-services` map → `reject-chain` (`reject`). As
//!   in kube-proxy's own `pkg/proxy/nftables/proxier_test.go`, plus a `counter` on each
//!   endpoint's `dnat` rule and on the `reject` for the lab's ground truth (kube-proxy's rules
//!   carry none).
//!
//! Node-local clients take the OUTPUT hooks; a client pod's connects (`lab::pod_client`) are
//! DNATed in PREROUTING and rejected in FORWARD.
//!
//! Safety first (see `lab::net` and ENVIRONMENT.md): a blackhole route for the virtual range,
//! a /32 route for the virtual IP onto the lab's bridge (a blackhole alone makes `connect()`
//! fail with EINVAL before NAT runs), and a table of the lab's own dropping whatever is still
//! addressed to the range after NAT, hooked after kube-proxy's filters. All of it is removed on
//! drop, on failure too, and by the next run after a killed one.

use std::{
    net::{Ipv4Addr, SocketAddrV4},
    process::Command,
};

use crate::lab::net::ip;

/// The virtual range (kubeadm's default Service CIDR); no machine route uses it.
pub const VIP_RANGE: &str = "10.96.0.0/16";
/// Above any route a bridge adds: it only catches what nothing else routes.
const FALLBACK_METRIC: &str = "4000";
/// The lab's own safety table (nft), hooked after kube-proxy's filters (priority 0).
const SAFETY_TABLE: &str = "drainwatch-lab-vip";
/// The Service's name as kube-proxy comments its rules with.
const SERVICE: &str = "lab/web:http";
const SVC_CHAIN: &str = "KUBE-SVC-DWLABWEB7Q2ZQ4XH";
/// nftables mode's chain names: `service-<hash>-<ns>/<name>/<proto>/<port name>`.
const NFT_SERVICE: &str = "service-DWLABWEB-lab/web/tcp/http";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyMode {
    Iptables,
    Nftables,
}

impl ProxyMode {
    pub fn name(self) -> &'static str {
        match self {
            Self::Iptables => "iptables",
            Self::Nftables => "nftables",
        }
    }
}

/// The Service: installed by [`Service::install`], removed (with the safety net) on drop.
#[derive(Debug)]
pub struct Service {
    pub mode: ProxyMode,
    pub vip: SocketAddrV4,
    /// Its endpoints as kube-proxy last synced them.
    endpoints: Vec<SocketAddrV4>,
}

fn run(cmd: &str, args: &[&str], stdin: Option<&str>) -> Result<String, String> {
    use std::io::Write;
    let mut c = Command::new(cmd);
    c.args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = c.spawn().map_err(|e| format!("running {cmd}: {e}"))?;
    if let Some(text) = stdin {
        child
            .stdin
            .take()
            .expect("piped stdin")
            .write_all(text.as_bytes())
            .map_err(|e| format!("{cmd}: writing its input: {e}"))?;
    }
    drop(child.stdin.take());
    let out = child
        .wait_with_output()
        .map_err(|e| format!("{cmd}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{cmd} {} failed ({}): {}{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim(),
            stdin.map(|s| format!("\ninput:\n{s}")).unwrap_or_default()
        ))
    }
}

/// `KUBE-SEP-…` of an endpoint, stable per address.
fn sep_chain(ep: SocketAddrV4) -> String {
    let [a, b, c, d] = ep.ip().octets();
    format!(
        "KUBE-SEP-DWLAB{a:02X}{b:02X}{c:02X}{d:02X}{:04X}",
        ep.port()
    )
}

fn nft_endpoint(ep: SocketAddrV4) -> String {
    format!(
        "endpoint-DWLAB{:08X}-lab/web/tcp/http__{}/{}",
        u32::from(*ep.ip()),
        ep.ip(),
        ep.port()
    )
}

/// The iptables-restore input of one sync: the Service's chains declared (so flushed) and
/// refilled, the endpoints' DNAT; no endpoints: the filter REJECT.
pub fn iptables_rules(vip: SocketAddrV4, endpoints: &[SocketAddrV4]) -> String {
    let (v, p) = (vip.ip(), vip.port());
    let mut nat = String::from("*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n");
    let mut filter = String::from("*filter\n:KUBE-SERVICES - [0:0]\n");
    nat.push_str("-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000\n");
    if endpoints.is_empty() {
        filter.push_str(&format!(
            "-A KUBE-SERVICES -d {v}/32 -p tcp -m comment --comment \"{SERVICE} has no endpoints\" -m tcp --dport {p} -j REJECT --reject-with icmp-port-unreachable\n"
        ));
    } else {
        nat.push_str(&format!(":{SVC_CHAIN} - [0:0]\n"));
        for ep in endpoints {
            nat.push_str(&format!(":{} - [0:0]\n", sep_chain(*ep)));
        }
        nat.push_str(&format!(
            "-A KUBE-SERVICES -d {v}/32 -p tcp -m comment --comment \"{SERVICE} cluster IP\" -m tcp --dport {p} -j {SVC_CHAIN}\n"
        ));
        let n = endpoints.len();
        for (i, ep) in endpoints.iter().enumerate() {
            let pick = if i + 1 < n {
                format!(
                    " -m statistic --mode random --probability {:.11}",
                    1.0 / (n - i) as f64
                )
            } else {
                String::new()
            };
            nat.push_str(&format!(
                "-A {SVC_CHAIN} -m comment --comment \"{SERVICE} -> {ep}\"{pick} -j {}\n",
                sep_chain(*ep)
            ));
            let sep = sep_chain(*ep);
            nat.push_str(&format!(
                "-A {sep} -s {}/32 -m comment --comment \"{SERVICE}\" -j KUBE-MARK-MASQ\n-A {sep} -p tcp -m comment --comment \"{SERVICE}\" -m tcp -j DNAT --to-destination {ep}\n",
                ep.ip()
            ));
        }
    }
    format!("{filter}COMMIT\n{nat}COMMIT\n")
}

/// The nft input of one sync (the table's whole content, replaced in one transaction).
pub fn nft_rules(vip: SocketAddrV4, endpoints: &[SocketAddrV4]) -> String {
    let (v, p) = (vip.ip(), vip.port());
    let mut r = String::from(
        "add table ip kube-proxy { comment \"rules for kube-proxy\" ; }\n\
         delete table ip kube-proxy\n\
         add table ip kube-proxy { comment \"rules for kube-proxy\" ; }\n\
         add set ip kube-proxy cluster-ips { type ipv4_addr ; comment \"Active ClusterIPs\" ; }\n\
         add map ip kube-proxy no-endpoint-services { type ipv4_addr . inet_proto . inet_service : verdict ; comment \"vmap to drop or reject packets to services with no endpoints\" ; }\n\
         add map ip kube-proxy service-ips { type ipv4_addr . inet_proto . inet_service : verdict ; comment \"ClusterIP, ExternalIP and LoadBalancer IP traffic\" ; }\n\
         add chain ip kube-proxy filter-output { type filter hook output priority 0 ; }\n\
         add chain ip kube-proxy filter-forward { type filter hook forward priority -110 ; }\n\
         add chain ip kube-proxy mark-for-masquerade\n\
         add chain ip kube-proxy nat-output { type nat hook output priority -100 ; }\n\
         add chain ip kube-proxy nat-prerouting { type nat hook prerouting priority -100 ; }\n\
         add chain ip kube-proxy reject-chain { comment \"helper for @no-endpoint-services / @no-endpoint-nodeports\" ; }\n\
         add chain ip kube-proxy services\n\
         add chain ip kube-proxy service-endpoints-check\n\
         add rule ip kube-proxy filter-output ct state new jump service-endpoints-check\n\
         add rule ip kube-proxy filter-forward ct state new jump service-endpoints-check\n\
         add rule ip kube-proxy mark-for-masquerade mark set mark or 0x4000\n\
         add rule ip kube-proxy nat-output jump services\n\
         add rule ip kube-proxy nat-prerouting jump services\n\
         add rule ip kube-proxy reject-chain counter reject\n\
         add rule ip kube-proxy services ip daddr . meta l4proto . th dport vmap @service-ips\n\
         add rule ip kube-proxy service-endpoints-check ip daddr . meta l4proto . th dport vmap @no-endpoint-services\n",
    );
    r.push_str(&format!(
        "add element ip kube-proxy cluster-ips {{ {v} }}\n"
    ));
    if endpoints.is_empty() {
        r.push_str(&format!(
            "add element ip kube-proxy no-endpoint-services {{ {v} . tcp . {p} comment \"{SERVICE}\" : goto reject-chain }}\n"
        ));
        return r;
    }
    // The endpoints' chains first: the service chain's verdict map names them.
    for ep in endpoints {
        let chain = nft_endpoint(*ep);
        r.push_str(&format!(
            "add chain ip kube-proxy {chain}\n\
             add rule ip kube-proxy {chain} ip saddr {} jump mark-for-masquerade\n\
             add rule ip kube-proxy {chain} meta l4proto tcp counter dnat to {ep}\n",
            ep.ip()
        ));
    }
    r.push_str(&format!("add chain ip kube-proxy {NFT_SERVICE}\n"));
    let picks: Vec<String> = endpoints
        .iter()
        .enumerate()
        .map(|(i, ep)| format!("{i} : goto {}", nft_endpoint(*ep)))
        .collect();
    r.push_str(&format!(
        "add rule ip kube-proxy {NFT_SERVICE} numgen random mod {} vmap {{ {} }}\n",
        endpoints.len(),
        picks.join(" , ")
    ));
    r.push_str(&format!(
        "add element ip kube-proxy service-ips {{ {v} . tcp . {p} : goto {NFT_SERVICE} }}\n"
    ));
    r
}

impl Service {
    /// The safety net, then the Service's rules for `endpoints` on `bridge` (the device the
    /// endpoints' addresses route through).
    pub fn install(
        mode: ProxyMode,
        vip: SocketAddrV4,
        bridge: &str,
        endpoints: &[SocketAddrV4],
    ) -> Result<Service, String> {
        // A killed run's leftovers first.
        remove_all(*vip.ip());
        let s = Service {
            mode,
            vip,
            endpoints: Vec::new(),
        };
        ip(&[
            "route",
            "replace",
            "blackhole",
            VIP_RANGE,
            "metric",
            FALLBACK_METRIC,
        ])?;
        run(
            "nft",
            &["-f", "-"],
            Some(&format!(
                "add table ip {SAFETY_TABLE}\n\
                 add chain ip {SAFETY_TABLE} output {{ type filter hook output priority 10 ; }}\n\
                 add rule ip {SAFETY_TABLE} output ip daddr {VIP_RANGE} counter drop\n\
                 add chain ip {SAFETY_TABLE} forward {{ type filter hook forward priority 10 ; }}\n\
                 add rule ip {SAFETY_TABLE} forward ip daddr {VIP_RANGE} counter drop\n"
            )),
        )?;
        ip(&[
            "route",
            "replace",
            &format!("{}/32", vip.ip()),
            "dev",
            bridge,
        ])?;
        if mode == ProxyMode::Iptables {
            for table in ["nat", "filter"] {
                run("iptables", &["-t", table, "-N", "KUBE-SERVICES"], None).ok();
            }
            for (table, chain) in PORTALS {
                run("iptables", &portals_jump(table, chain, "-I"), None)?;
            }
        }
        let mut s = s;
        s.sync(endpoints)?;
        Ok(s)
    }

    /// kube-proxy's sync after an EndpointSlice change: the Service's rules for `endpoints`.
    pub fn sync(&mut self, endpoints: &[SocketAddrV4]) -> Result<(), String> {
        match self.mode {
            ProxyMode::Iptables => {
                // Chains of endpoints gone are deleted after the refill, as kube-proxy does.
                run(
                    "iptables-restore",
                    &["--noflush"],
                    Some(&iptables_rules(self.vip, endpoints)),
                )?;
                for gone in self.endpoints.iter().filter(|e| !endpoints.contains(e)) {
                    let chain = sep_chain(*gone);
                    run("iptables", &["-t", "nat", "-F", &chain], None).ok();
                    run("iptables", &["-t", "nat", "-X", &chain], None).ok();
                }
                if endpoints.is_empty() {
                    run("iptables", &["-t", "nat", "-F", SVC_CHAIN], None).ok();
                    run("iptables", &["-t", "nat", "-X", SVC_CHAIN], None).ok();
                }
            }
            ProxyMode::Nftables => {
                run("nft", &["-f", "-"], Some(&nft_rules(self.vip, endpoints)))?;
            }
        }
        self.endpoints = endpoints.to_vec();
        Ok(())
    }

    /// Connections DNATed to `ep` so far: the endpoint's DNAT rule's packet counter (only a
    /// connection's first packet goes through NAT).
    pub fn dnat_count(&self, ep: SocketAddrV4) -> Result<u64, String> {
        match self.mode {
            ProxyMode::Iptables => {
                let out = run(
                    "iptables",
                    &["-t", "nat", "-L", &sep_chain(ep), "-v", "-x", "-n"],
                    None,
                )?;
                out.lines()
                    .find(|l| l.contains("DNAT"))
                    .and_then(|l| l.split_whitespace().next()?.parse().ok())
                    .ok_or_else(|| format!("no DNAT rule counter for {ep}:\n{out}"))
            }
            ProxyMode::Nftables => nft_packets(&["ip", "kube-proxy", &nft_endpoint(ep)], "dnat to"),
        }
    }

    /// SYNs the Service's no-endpoint reject answered (retransmissions too): its rule's packet
    /// counter.
    pub fn rejected_syns(&self) -> Result<u64, String> {
        match self.mode {
            ProxyMode::Iptables => {
                let out = run(
                    "iptables",
                    &["-t", "filter", "-L", "KUBE-SERVICES", "-v", "-x", "-n"],
                    None,
                )?;
                Ok(out
                    .lines()
                    .filter(|l| l.contains("REJECT"))
                    .filter_map(|l| l.split_whitespace().next()?.parse::<u64>().ok())
                    .sum())
            }
            // Its one rule.
            ProxyMode::Nftables => nft_packets(&["ip", "kube-proxy", "reject-chain"], "counter"),
        }
    }

    /// Packets the safety table dropped (still addressed to the virtual range after NAT, sent
    /// or forwarded): 0 unless the lab is broken.
    pub fn escaped(&self) -> Result<u64, String> {
        Ok(nft_packets(&["ip", SAFETY_TABLE, "output"], "drop")?
            + nft_packets(&["ip", SAFETY_TABLE, "forward"], "drop")?)
    }
}

/// The packet counter of the rule containing `needle` in an nft chain (`family table chain`).
fn nft_packets(chain: &[&str], needle: &str) -> Result<u64, String> {
    let mut args = vec!["list", "chain"];
    args.extend(chain);
    let out = run("nft", &args, None)?;
    out.lines()
        .find(|l| l.contains(needle))
        .and_then(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            let i = w.iter().position(|x| *x == "packets")?;
            w.get(i + 1)?.parse().ok()
        })
        .ok_or_else(|| format!("no counter on `{needle}` in {chain:?}:\n{out}"))
}

/// Where kube-proxy jumps to its KUBE-SERVICES: the nat table's for node-local clients and
/// forwarded ones, the filter table's for new connections, both ways.
const PORTALS: [(&str, &str); 4] = [
    ("nat", "OUTPUT"),
    ("nat", "PREROUTING"),
    ("filter", "OUTPUT"),
    ("filter", "FORWARD"),
];

/// kube-proxy's jump from `table`'s `chain` to its KUBE-SERVICES, inserted (`-I`) or deleted
/// (`-D`).
fn portals_jump<'a>(table: &'a str, chain: &'a str, op: &'a str) -> Vec<&'a str> {
    let mut rule = vec!["-t", table, op, chain];
    if table == "filter" {
        rule.extend(["-m", "conntrack", "--ctstate", "NEW"]);
    }
    rule.extend([
        "-m",
        "comment",
        "--comment",
        "kubernetes service portals",
        "-j",
        "KUBE-SERVICES",
    ]);
    rule
}

/// Removes every rule, chain, table and route the lab may have left for `vip`.
fn remove_all(vip: Ipv4Addr) {
    for (table, chain) in PORTALS {
        while run("iptables", &portals_jump(table, chain, "-D"), None).is_ok() {}
    }
    if let Ok(rules) = run("iptables-save", &[], None) {
        let chains: Vec<(String, String)> = {
            let mut table = String::new();
            let mut out = Vec::new();
            for l in rules.lines() {
                if let Some(t) = l.strip_prefix('*') {
                    table = t.to_string();
                } else if let Some(c) = l.strip_prefix(':')
                    && let Some(name) = c.split_whitespace().next()
                    && (name.starts_with("KUBE-") || name == "KUBE-SERVICES")
                {
                    out.push((table.clone(), name.to_string()));
                }
            }
            out
        };
        for (t, c) in &chains {
            run("iptables", &["-t", t, "-F", c], None).ok();
        }
        for (t, c) in &chains {
            run("iptables", &["-t", t, "-X", c], None).ok();
        }
    }
    run("nft", &["delete", "table", "ip", "kube-proxy"], None).ok();
    run("nft", &["delete", "table", "ip", SAFETY_TABLE], None).ok();
    ip(&["route", "del", &format!("{vip}/32")]).ok();
    ip(&[
        "route",
        "del",
        "blackhole",
        VIP_RANGE,
        "metric",
        FALLBACK_METRIC,
    ])
    .ok();
}

impl Drop for Service {
    fn drop(&mut self) {
        remove_all(*self.vip.ip());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iptables_rules_have_kube_proxys_shape() {
        let vip: SocketAddrV4 = "10.96.0.10:80".parse().unwrap();
        let eps: Vec<SocketAddrV4> = vec![
            "10.88.0.5:8080".parse().unwrap(),
            "10.88.0.6:8080".parse().unwrap(),
        ];
        let r = iptables_rules(vip, &eps);
        assert!(r.contains("-m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-"));
        assert!(r.contains("-j DNAT --to-destination 10.88.0.6:8080"));
        assert!(!r.contains("REJECT"));
        let none = iptables_rules(vip, &[]);
        assert!(none.contains(
            "has no endpoints\" -m tcp --dport 80 -j REJECT --reject-with icmp-port-unreachable"
        ));
        let n = nft_rules(vip, &eps);
        assert!(n.contains("numgen random mod 2 vmap { 0 : goto endpoint-"));
        assert!(nft_rules(vip, &[]).contains(": goto reject-chain"));
    }
}
