//! Which container (or systemd service) owns a cgroup path.
//!
//! Pure string parsing of the layouts that container runtimes and the kubelet create; the real
//! samples the tests use, and where each came from, are listed in `agent/fixtures/cgroup/README.md`.
//!
//! The path is read from its deepest segment upwards and the first segment that names a
//! container wins. That one rule covers processes a level below the container's cgroup
//! (`…/libpod-<id>.scope/container`, `…/<id>/kube-proxy`) and nested runtimes (Docker in
//! Docker, kind/minikube nodes whose pods live under `/docker/<node id>/kubepods…`): the
//! innermost container is the one whose processes and sockets these are.

use serde::Serialize;

/// The software that created a cgroup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Runtime {
    /// containerd, through its CRI plugin (Kubernetes) or directly.
    Containerd,
    /// CRI-O.
    CriO,
    /// Docker (dockerd, also under cri-dockerd).
    Docker,
    /// podman (libpod).
    Podman,
    /// A plain systemd service: no container runtime involved.
    Systemd,
}

impl Runtime {
    /// The name used in labels and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Runtime::Containerd => "containerd",
            Runtime::CriO => "cri-o",
            Runtime::Docker => "docker",
            Runtime::Podman => "podman",
            Runtime::Systemd => "systemd",
        }
    }
}

/// The owner of a cgroup path.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CgroupOwner {
    /// Who created the cgroup.
    pub runtime: Runtime,
    /// Container id (64 hex) for container runtimes; the unit name (e.g. "nginx.service") for
    /// plain systemd services.
    pub id: String,
    /// Kubernetes pod UID with dashes (kubepods paths encode it with underscores under systemd)
    /// when the path is a pod's.
    pub pod_uid: Option<String>,
}

/// What one path segment says about its cgroup.
enum Segment<'a> {
    Container(Runtime, &'a str),
    /// The runtime's monitor (conmon) for a container: not the container itself.
    Monitor,
    Other,
}

/// The owner of one cgroup path (as in /proc/<pid>/cgroup or cgroup_rmdir's path), None for
/// host/system paths.
///
/// None is also the answer for conmon, the monitor CRI-O and podman run next to each container
/// (`crio-conmon-<id>.scope`, `libpod-conmon-<id>.scope`, `/libpod_parent/conmon`): it holds
/// no sockets of the container and exits on its own schedule, so attributing it to the
/// container would be wrong. Pod-level cgroups without a container below them, user sessions,
/// `init.scope` and `/` are None too. A `.service` unit that is not inside a container is a
/// [`Runtime::Systemd`] owner, container daemons (`docker.service`, `containerd.service`,
/// `crio.service`) included: they are services like any other.
pub fn parse_cgroup_path(path: &str) -> Option<CgroupOwner> {
    let segments: Vec<&str> = path.trim().split('/').filter(|s| !s.is_empty()).collect();
    for (i, seg) in segments.iter().enumerate().rev() {
        let above = &segments[..i];
        match classify(seg, above) {
            Segment::Monitor => return None,
            Segment::Container(runtime, id) => {
                // The systemd driver's misapplied form `<pod slice>:<prefix>:<id>` carries its
                // pod slice inside the segment itself.
                let own_slice = seg
                    .split_once(':')
                    .and_then(|(slice, _)| pod_uid(slice, above));
                let pod_uid = own_slice.or_else(|| {
                    above
                        .iter()
                        .enumerate()
                        .rev()
                        .find_map(|(j, s)| pod_uid(s, &above[..j]))
                });
                return Some(CgroupOwner {
                    runtime,
                    id: id.to_string(),
                    pod_uid,
                });
            }
            Segment::Other => {}
        }
    }
    service_owner(&segments)
}

/// From the text of /proc/<pid>/cgroup (v2 line `0::/path`, hybrid v1 lines
/// `N:ctrl,ctrl:/path`, pure v1): the path to use: the v2 one when it names a container, else
/// the first v1 path that does (hybrid hosts often leave the v2 path at "/" for
/// cgroupfs-driver containers), else the v2 path.
///
/// A container beats a service on any line: with a cgroupfs-driver runtime on a hybrid host
/// the unified hierarchy keeps the daemon's unit (`0::/system.slice/docker.service` next to
/// `N:…:/docker/<id>`), which is not who owns the process. Without a v2 line the
/// `name=systemd` path, then the first v1 path, is the answer; None only for text with no
/// cgroup line at all.
pub fn container_path_from_proc_cgroup(text: &str) -> Option<String> {
    let mut v2 = None;
    let mut v1_container = None;
    let mut v1_service = None;
    let mut v1_systemd = None;
    let mut v1_first = None;
    for line in text.lines() {
        // `hierarchy:controllers:path`; the path itself may hold ':' (see the `:cri-containerd:`
        // form), so split twice only.
        let mut fields = line.trim().splitn(3, ':');
        let (Some(hierarchy), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        if hierarchy == "0" && controllers.is_empty() {
            v2 = Some(path);
            continue;
        }
        match parse_cgroup_path(path).map(|o| o.runtime) {
            Some(Runtime::Systemd) => {
                v1_service.get_or_insert(path);
            }
            Some(_) => {
                v1_container.get_or_insert(path);
            }
            None => {}
        }
        if controllers == "name=systemd" {
            v1_systemd.get_or_insert(path);
        }
        v1_first.get_or_insert(path);
    }
    let chosen = match v2.and_then(parse_cgroup_path).map(|o| o.runtime) {
        Some(Runtime::Systemd) => v1_container.or(v2),
        Some(_) => v2,
        None => v1_container
            .or(v1_service)
            .or(v2)
            .or(v1_systemd)
            .or(v1_first),
    };
    chosen.map(str::to_string)
}

/// Classifies one segment; `above` are the segments between the root and it.
fn classify<'a>(seg: &'a str, above: &[&str]) -> Segment<'a> {
    // containerd/runc with the systemd driver configured only halfway write the literal
    // `<slice>:<prefix>:<id>` as a directory name (seen on containerd 1.4, cgroup v1).
    if let Some((_, rest)) = seg.split_once(':') {
        return match rest.split_once(':') {
            Some((prefix, id)) if is_container_id(id) => match runtime_of_prefix(prefix) {
                Some(runtime) => Segment::Container(runtime, id),
                None => Segment::Other,
            },
            _ => Segment::Other,
        };
    }
    let stem = seg.strip_suffix(".scope").unwrap_or(seg);
    for monitor in ["crio-conmon-", "libpod-conmon-"] {
        if stem.strip_prefix(monitor).is_some_and(is_container_id) {
            return Segment::Monitor;
        }
    }
    let parent = above.last().copied();
    // podman with the cgroupfs manager: `/libpod_parent/conmon`, and a pod's conmons in the
    // pod's own cgroup, `/libpod_parent/<pod id>/conmon` (the pod id is no container's).
    if stem == "conmon" && above.first() == Some(&"libpod_parent") {
        return Segment::Monitor;
    }
    if let Some((prefix, id)) = stem.rsplit_once('-')
        && is_container_id(id)
    {
        return match runtime_of_prefix(prefix) {
            Some(runtime) => Segment::Container(runtime, id),
            None => Segment::Other,
        };
    }
    if is_container_id(stem) {
        return Segment::Container(bare_id_runtime(parent, above), stem);
    }
    Segment::Other
}

/// The runtime of a bare 64-hex segment, which only its surroundings tell.
fn bare_id_runtime(parent: Option<&str>, above: &[&str]) -> Runtime {
    match parent {
        Some("docker") => Runtime::Docker,
        // Early podman nested the container under its conmon cgroup.
        Some(p) if p == "libpod_parent" || p.starts_with("libpod-conmon-") => Runtime::Podman,
        // The kubelet's cgroupfs layout: CRI-O prefixes its ids (`crio-<id>`) and dockershim is
        // gone since Kubernetes 1.24, so a bare id in a pod is containerd's.
        _ if above
            .iter()
            .enumerate()
            .any(|(j, s)| pod_uid(s, &above[..j]).is_some()) =>
        {
            Runtime::Containerd
        }
        // `/docker/<id>`-like layouts (ECS's `/ecs/<task>/<id>`, `--cgroup-parent`) are Docker's.
        _ => Runtime::Docker,
    }
}

fn runtime_of_prefix(prefix: &str) -> Option<Runtime> {
    match prefix {
        "cri-containerd" => Some(Runtime::Containerd),
        "crio" => Some(Runtime::CriO),
        "docker" => Some(Runtime::Docker),
        "libpod" => Some(Runtime::Podman),
        _ => None,
    }
}

/// The pod UID a kubepods segment names, dashed: `kubepods-<qos>-pod<uid_>.slice` (systemd
/// driver, also `kubelet-kubepods-…` under kind) or `pod<uid>` below `kubepods` (cgroupfs).
fn pod_uid(seg: &str, above: &[&str]) -> Option<String> {
    let raw = if let Some(stem) = seg.strip_suffix(".slice") {
        if !stem.contains("kubepods") {
            return None;
        }
        stem.rsplit_once("-pod")?.1
    } else {
        let in_kubepods = above.iter().any(|s| s.starts_with("kubepods"));
        seg.strip_prefix("pod").filter(|_| in_kubepods)?
    };
    let uid = raw.replace('_', "-");
    // A UUID, or the 32-hex config hash the kubelet gives static pods.
    let plausible = (uid.len() == 36 || uid.len() == 32)
        && uid.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-');
    plausible.then_some(uid)
}

/// Runtimes use 64 lower-case hex digits (a SHA-256) as container id.
fn is_container_id(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// A path with no container in it: the deepest `.service` unit, unless it is a user's.
fn service_owner(segments: &[&str]) -> Option<CgroupOwner> {
    // User sessions (`/user.slice/…`, legacy `/user/1000.user/…`) are people, not workloads;
    // their `user@1000.service` managers would otherwise look like services.
    if matches!(segments.first(), Some(&"user.slice") | Some(&"user")) {
        return None;
    }
    let unit = segments
        .iter()
        .rev()
        .find(|s| s.len() > ".service".len() && s.ends_with(".service"))?;
    Some(CgroupOwner {
        runtime: Runtime::Systemd,
        id: (*unit).to_string(),
        pod_uid: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> String {
        let path = format!("{}/fixtures/cgroup/{name}", env!("CARGO_MANIFEST_DIR"));
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    fn owner(runtime: Runtime, id: &str, pod_uid: Option<&str>) -> Option<CgroupOwner> {
        Some(CgroupOwner {
            runtime,
            id: id.to_string(),
            pod_uid: pod_uid.map(str::to_string),
        })
    }

    // Every path below is a real one; the README beside the fixtures names each source.

    #[test]
    fn containerd_systemd_driver_all_qos_classes() {
        // burstable: netdata/netdata#4868 (systemd-cgls of a containerd node)
        assert_eq!(
            parse_cgroup_path(
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod55c6c714_b240_4dec_9a45_57b61696ab6e.slice/cri-containerd-2032491dcae31e6746f47daa0ac74564f2843a1bd847c5e6c4eb501ca132ac36.scope"
            ),
            owner(
                Runtime::Containerd,
                "2032491dcae31e6746f47daa0ac74564f2843a1bd847c5e6c4eb501ca132ac36",
                Some("55c6c714-b240-4dec-9a45-57b61696ab6e")
            )
        );
        // besteffort: neuvector share/system/cgroup_test.go TestK8sBottleRocket
        assert_eq!(
            parse_cgroup_path(
                "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-poddd1bf9d1_241d_47f5_8e25_12de83135812.slice/cri-containerd-f45298cd514d1930c4fe3afc4412e59547f7e3148fddd22ca33cefce046eb830.scope"
            ),
            owner(
                Runtime::Containerd,
                "f45298cd514d1930c4fe3afc4412e59547f7e3148fddd22ca33cefce046eb830",
                Some("dd1bf9d1-241d-47f5-8e25-12de83135812")
            )
        );
        // guaranteed (no QoS slice): DataDog/datadog-agent suffix-trie test
        assert_eq!(
            parse_cgroup_path(
                "/kubepods.slice/kubepods-podea2e69b4_0bd4_48f0_b75f_cc7c79111027.slice/cri-containerd-7ee34913fbefa6a0dbbdf1bbc302cc29a1bde3b83b8b9f2252a4d4360c373848.scope"
            ),
            owner(
                Runtime::Containerd,
                "7ee34913fbefa6a0dbbdf1bbc302cc29a1bde3b83b8b9f2252a4d4360c373848",
                Some("ea2e69b4-0bd4-48f0-b75f-cc7c79111027")
            )
        );
        // kind nests the kubelet's tree under kubelet.slice: containerd/nri#227
        assert_eq!(
            parse_cgroup_path(
                "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod1e597579_417e_482f_bf65_5fe170c3aebd.slice/cri-containerd-a09bc17f5aa29b0dbdec9ede5f46cf1396d2405917ab02e6f1eb1019f388396e.scope"
            ),
            owner(
                Runtime::Containerd,
                "a09bc17f5aa29b0dbdec9ede5f46cf1396d2405917ab02e6f1eb1019f388396e",
                Some("1e597579-417e-482f-bf65-5fe170c3aebd")
            )
        );
    }

    #[test]
    fn containerd_cgroupfs_driver() {
        // burstable: elastic/apm-agent-nodejs container-info test fixture (as in DataDog
        // libdatadog's entity-id test)
        assert_eq!(
            parse_cgroup_path(
                "/kubepods/burstable/podfd52ef25-a87d-11e9-9423-0800271a638e/8c046cb0b72cd4c99f51b5591cd5b095967f58ee003710a45280c28ee1a9c7fa"
            ),
            owner(
                Runtime::Containerd,
                "8c046cb0b72cd4c99f51b5591cd5b095967f58ee003710a45280c28ee1a9c7fa",
                Some("fd52ef25-a87d-11e9-9423-0800271a638e")
            )
        );
        // besteffort, containerd 1.2.13: neuvector TestK8sContainerd_v1_2_13
        assert_eq!(
            parse_cgroup_path(
                "/kubepods/besteffort/poda36d0c1d-0b26-4451-8d80-9c195e004afa/5dd96d5394ca930a854a390ea46f7515a8bc930123eb3251ba20f2708a38fc61"
            ),
            owner(
                Runtime::Containerd,
                "5dd96d5394ca930a854a390ea46f7515a8bc930123eb3251ba20f2708a38fc61",
                Some("a36d0c1d-0b26-4451-8d80-9c195e004afa")
            )
        );
        // guaranteed (no QoS level): kube03a containerd write-up (see README)
        assert_eq!(
            parse_cgroup_path(
                "/kubepods/pod7d5e31f8-8797-457d-aaf2-f55464d338c6/eb2c3ad61742de7ed7a8758cc563a1470b969632f857429787668e1f354e357a"
            ),
            owner(
                Runtime::Containerd,
                "eb2c3ad61742de7ed7a8758cc563a1470b969632f857429787668e1f354e357a",
                Some("7d5e31f8-8797-457d-aaf2-f55464d338c6")
            )
        );
    }

    #[test]
    fn containerd_half_configured_systemd_driver_literal_segment() {
        // containerd 1.4.4 on cgroup v1: neuvector TestK8sContainerd_v1_4_4 (full file fixture)
        let text = fixture("containerd-1.4.4-systemd-literal-v1.txt");
        let path = container_path_from_proc_cgroup(&text);
        assert_eq!(
            path.as_deref(),
            Some(
                "/system.slice/containerd.service/kubepods-besteffort-pod2105e389_7471_476e_a50f_6074cef29bbd.slice:cri-containerd:d3d8ccf5cca91931c6285c1d7472c413dd5a7700fddc0aa9f89a9ac7008b003e"
            )
        );
        let want = owner(
            Runtime::Containerd,
            "d3d8ccf5cca91931c6285c1d7472c413dd5a7700fddc0aa9f89a9ac7008b003e",
            Some("2105e389-7471-476e-a50f-6074cef29bbd"),
        );
        assert_eq!(path.as_deref().and_then(parse_cgroup_path), want);
        // The same file's other controllers name the bare `<slice>:…` segment at the root.
        assert_eq!(
            parse_cgroup_path(
                "/kubepods-besteffort-pod2105e389_7471_476e_a50f_6074cef29bbd.slice:cri-containerd:d3d8ccf5cca91931c6285c1d7472c413dd5a7700fddc0aa9f89a9ac7008b003e"
            ),
            want
        );
    }

    #[test]
    fn crio_containers_and_their_conmon() {
        // CRI-O 1.19 (OpenShift 4.6), besteffort, whole file: neuvector TestK8sCrio_v1_19
        let text = fixture("crio-1.19-systemd-v1.txt");
        let path = container_path_from_proc_cgroup(&text);
        assert_eq!(
            path.as_deref().and_then(parse_cgroup_path),
            owner(
                Runtime::CriO,
                "d6d725b909f37c3e232aadfbafa950a58bfe7baa579ba8c47a12be88bb921607",
                Some("8ca306fa-3c03-47fa-97dd-19979c345572")
            )
        );
        // burstable: opencontainers/runc#4620
        assert_eq!(
            parse_cgroup_path(
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-poda5c1f8d5_1919_434d_add7_4afaafdaef89.slice/crio-5eed917563583925ffdbd40a64efb2aaffe58638e57add8becaf460fe74f5b1c.scope"
            ),
            owner(
                Runtime::CriO,
                "5eed917563583925ffdbd40a64efb2aaffe58638e57add8becaf460fe74f5b1c",
                Some("a5c1f8d5-1919-434d-add7-4afaafdaef89")
            )
        );
        // static pod: the kubelet's UID is a 32-hex config hash (neuvector TestK8sCrio_v1_17)
        assert_eq!(
            parse_cgroup_path(
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod487a0dc6dccaeefbcfedba7a7ce1ca18.slice/crio-7a1fd6fe8cdfbd44dc78c4cc85dad7031eaab4365801684cad0aabdeaf863f9e.scope"
            ),
            owner(
                Runtime::CriO,
                "7a1fd6fe8cdfbd44dc78c4cc85dad7031eaab4365801684cad0aabdeaf863f9e",
                Some("487a0dc6dccaeefbcfedba7a7ce1ca18")
            )
        );
        // With crun, CRI-O runs the payload one level deeper, in `…/crio-<id>.scope/container`
        // (layout from a public cgroup table; ids from runc#4620).
        assert_eq!(
            parse_cgroup_path(
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-poda5c1f8d5_1919_434d_add7_4afaafdaef89.slice/crio-5eed917563583925ffdbd40a64efb2aaffe58638e57add8becaf460fe74f5b1c.scope/container"
            )
            .map(|o| o.id),
            Some("5eed917563583925ffdbd40a64efb2aaffe58638e57add8becaf460fe74f5b1c".to_string())
        );
        // conmon in the pod slice (runc#4620) and in system.slice (istio/istio#55139)
        assert_eq!(
            parse_cgroup_path(
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod207aaad1_659f_4db8_88e0_46e0cdcc3004.slice/crio-conmon-32da98c8522068be05a7510a3eddb09cad6ed2f03286180d0e931d0d0b6224a6.scope"
            ),
            None
        );
        assert_eq!(
            parse_cgroup_path(
                "/system.slice/crio-conmon-c055fa05e5c1c20cc4ef3e2ebd180ab360b5369538c9b7cd536b3e6c58311b39.scope"
            ),
            None
        );
    }

    #[test]
    fn crio_inside_a_minikube_docker_node_is_the_inner_container() {
        // kubernetes/minikube#11280: the node is itself a Docker container.
        assert_eq!(
            parse_cgroup_path(
                "/docker/d6701ec289c56e4391acb11d07474b3139466857a305490575508a8b7a9fcf22/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod2ca4a155_3599_498d_bb9d_4446693fa3ea.slice/crio-358607a37e7ada357032e7f5729c9ae6a3efdb7962acbcbe47ff6a3c5506cb1c.scope"
            ),
            owner(
                Runtime::CriO,
                "358607a37e7ada357032e7f5729c9ae6a3efdb7962acbcbe47ff6a3c5506cb1c",
                Some("2ca4a155-3599-498d-bb9d-4446693fa3ea")
            )
        );
    }

    #[test]
    fn docker_layouts() {
        // systemd driver: neuvector TestDockerIDCentOS
        assert_eq!(
            parse_cgroup_path(
                "/system.slice/docker-9ec39b91f3d70e1beff50a308f77067065ea6be0d91a3378375056cd4422cf3d.scope"
            ),
            owner(
                Runtime::Docker,
                "9ec39b91f3d70e1beff50a308f77067065ea6be0d91a3378375056cd4422cf3d",
                None
            )
        );
        // cgroupfs driver: neuvector TestDockerIDUbuntu
        assert_eq!(
            parse_cgroup_path(
                "/docker/31cb02944da7a12196a193cf0e0f6c226d7c453a1db62e65ba98287593a2ee30"
            ),
            owner(
                Runtime::Docker,
                "31cb02944da7a12196a193cf0e0f6c226d7c453a1db62e65ba98287593a2ee30",
                None
            )
        );
        // Docker in Docker: the inner one (neuvector TestDockerIDRancherOS)
        assert_eq!(
            parse_cgroup_path(
                "/docker/a9a5ad238e59234193ee7ec3fcff5e735b3708ea1068826952255b69e3cfa413/docker/ec08435e04266c5ba381fccbb829f626d11d8ddf5f8f547263c7a2d79ab4787a"
            ),
            owner(
                Runtime::Docker,
                "ec08435e04266c5ba381fccbb829f626d11d8ddf5f8f547263c7a2d79ab4787a",
                None
            )
        );
        // ECS: elastic/apm-agent-nodejs container-info test
        assert_eq!(
            parse_cgroup_path(
                "/ecs/eb9d3d0c-8936-42d7-80d8-f82b2f1a629e/7e9139716d9e5d762d22f9f877b87d1be8b1449ac912c025a984750c5dbff157"
            ),
            owner(
                Runtime::Docker,
                "7e9139716d9e5d762d22f9f877b87d1be8b1449ac912c025a984750c5dbff157",
                None
            )
        );
        // dockershim pods, systemd driver (neuvector TestDockerIDKubepods2)
        assert_eq!(
            parse_cgroup_path(
                "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod045b1e35_7f13_11e7_ac42_0050568ffca0.slice/docker-b5b6f2da8008be266864f896f93789762b2ce50792114a5c5f2cc3315af0bc70.scope"
            ),
            owner(
                Runtime::Docker,
                "b5b6f2da8008be266864f896f93789762b2ce50792114a5c5f2cc3315af0bc70",
                Some("045b1e35-7f13-11e7-ac42-0050568ffca0")
            )
        );
    }

    #[test]
    fn a_process_one_level_below_the_container() {
        // kube-proxy moved itself into a child cgroup: neuvector TestK8sProxyProcess
        let text = fixture("k8s-cgroupfs-nested-kube-proxy-v1.txt");
        let path = container_path_from_proc_cgroup(&text);
        assert_eq!(
            path.as_deref().and_then(parse_cgroup_path),
            owner(
                Runtime::Containerd,
                "c04e0a88a1de067f25bece337d4dbb897396e0b623c2a65330850fc9823f1903",
                Some("f8a694f2-7c08-11e9-98da-000c29077430")
            )
        );
    }

    #[test]
    fn podman_systemd_layouts_and_conmon() {
        // falcosecurity/libs#1613 (systemd-cgls of podman with crun)
        let id = "a2bc7b153f034b17f358cde43a7f8c7475147e8a0d1b2573c26473244ec44ce4";
        assert_eq!(
            parse_cgroup_path(&format!("/machine.slice/libpod-{id}.scope/container")),
            owner(Runtime::Podman, id, None)
        );
        assert_eq!(
            parse_cgroup_path(&format!("/machine.slice/libpod-{id}.scope")),
            owner(Runtime::Podman, id, None)
        );
        assert_eq!(
            parse_cgroup_path(&format!("/machine.slice/libpod-conmon-{id}.scope")),
            None
        );
        // cgroup v2, cgroupns=host: DataDog libdatadog entity-id test
        assert_eq!(
            parse_cgroup_path(
                "/machine.slice/libpod-93afc7bc3ce42ad052d2926ffacfba941803bfae080941d1e1375d9d46b6a281.scope/container"
            )
            .map(|o| o.runtime),
            Some(Runtime::Podman)
        );
    }

    #[test]
    fn podman_runc_cgroupfs_on_this_machine() {
        // Captured here: podman 4.3.1 + runc, --cgroup-manager=cgroupfs, hybrid cgroups.
        let id = "4f4e9086b29e13bebb381f9754f31b75ecb96335aa4d3e86d39a3fd2262b2a44";
        let text = fixture("podman-runc-cgroupfs-hybrid.txt");
        let path = container_path_from_proc_cgroup(&text);
        assert_eq!(path, Some(format!("/libpod_parent/libpod-{id}")));
        assert_eq!(
            path.as_deref().and_then(parse_cgroup_path),
            owner(Runtime::Podman, id, None)
        );
        // Its conmon: v1 controllers at /libpod_parent/conmon, v2 and name=systemd at "/".
        let text = fixture("podman-runc-cgroupfs-hybrid-conmon.txt");
        let path = container_path_from_proc_cgroup(&text);
        assert_eq!(path.as_deref(), Some("/"));
        assert_eq!(parse_cgroup_path("/libpod_parent/conmon"), None);
        // A pod's (podman 4.3 here, `podman pod create` with cgroupfs): its conmons in the
        // pod's cgroup, its containers (the infra one too) below it.
        let pod = "9b047e38e0f824b3870d1a2cc4b276bdf0db60892d695ea4ca2e5c5b11da4f12";
        let infra = "e8e1434f50d469a709774ba92e28ab999f21c32054be24fda91698a30fa0b1cd";
        assert_eq!(
            parse_cgroup_path(&format!("/libpod_parent/{pod}/conmon")),
            None
        );
        let owner = parse_cgroup_path(&format!("/libpod_parent/{pod}/libpod-{infra}"));
        assert_eq!(
            owner.map(|o| (o.runtime, o.id)),
            Some((Runtime::Podman, infra.to_string()))
        );
    }

    #[test]
    fn hybrid_host_cgroupfs_docker_prefers_the_v1_container_over_the_v2_daemon() {
        // elastic/apm-agent-nodejs container-info test: v2 stays at docker.service.
        let text = fixture("docker-cgroupfs-hybrid.txt");
        let path = container_path_from_proc_cgroup(&text);
        assert_eq!(
            path.as_deref(),
            Some("/docker/051e2ee0bce99116029a13df4a9e943137f19f957f38ac02d6bad96f9b700f76")
        );
    }

    #[test]
    fn services_and_host_paths() {
        // Unit paths as /proc/<pid>/cgroup shows them for services, daemons, sessions, init.
        assert_eq!(
            parse_cgroup_path("/system.slice/nginx.service"),
            owner(Runtime::Systemd, "nginx.service", None)
        );
        for daemon in ["docker.service", "containerd.service", "crio.service"] {
            assert_eq!(
                parse_cgroup_path(&format!("/system.slice/{daemon}")),
                owner(Runtime::Systemd, daemon, None)
            );
        }
        assert_eq!(
            parse_cgroup_path("/system.slice/system-getty.slice/getty@tty1.service"),
            owner(Runtime::Systemd, "getty@tty1.service", None)
        );
        for none in [
            "/",
            "",
            "/init.scope",
            "/system.slice",
            "/user.slice/user-1000.slice/session-2.scope",
            "/user.slice/user-1000.slice/user@1000.service/app.slice/snap.code.code.service",
            "/user/1000.user/c2.session",
            // pod level without a container below it (cgroup_rmdir of the pod slice)
            "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-poddd1bf9d1_241d_47f5_8e25_12de83135812.slice",
            // not a container id: too short, upper case, not hex
            "/system.slice/docker-short.scope",
            "/docker/051e2ee0bce99116029a13df4a9e943137f19f957f38ac02d6bad96f9b700f7",
            "/docker/051E2EE0BCE99116029A13DF4A9E943137F19F957F38AC02D6BAD96F9B700F76",
        ] {
            assert_eq!(parse_cgroup_path(none), None, "{none:?}");
        }
        // A unit whose name merely starts like a container scope.
        assert_eq!(
            parse_cgroup_path("/system.slice/docker-cleanup.service"),
            owner(Runtime::Systemd, "docker-cleanup.service", None)
        );
    }

    #[test]
    fn proc_cgroup_text_edge_cases() {
        // neuvector TestHostProcess: pure v1, all at the root.
        let text = fixture("host-process-v1.txt");
        assert_eq!(container_path_from_proc_cgroup(&text).as_deref(), Some("/"));
        // elastic/apm-agent-nodejs: a user session on a hybrid host.
        let session = "12:devices:/user.slice\n6:pids:/user.slice/user-1000.slice/session-2.scope\n1:name=systemd:/user.slice/user-1000.slice/session-2.scope\n0::/user.slice/user-1000.slice/session-2.scope\n";
        assert_eq!(
            container_path_from_proc_cgroup(session).as_deref(),
            Some("/user.slice/user-1000.slice/session-2.scope")
        );
        // A v2 service beats nothing, a v1 container beats a v2 service.
        assert_eq!(
            container_path_from_proc_cgroup("0::/system.slice/nginx.service\n").as_deref(),
            Some("/system.slice/nginx.service")
        );
        assert_eq!(container_path_from_proc_cgroup(""), None);
        assert_eq!(container_path_from_proc_cgroup("garbage\n\u{0}\n"), None);
    }

    #[test]
    fn runtime_names() {
        for (r, s) in [
            (Runtime::Containerd, "containerd"),
            (Runtime::CriO, "cri-o"),
            (Runtime::Docker, "docker"),
            (Runtime::Podman, "podman"),
            (Runtime::Systemd, "systemd"),
        ] {
            assert_eq!(r.as_str(), s);
            assert_eq!(serde_json::to_string(&r).ok(), Some(format!("\"{s}\"")));
        }
    }
}
