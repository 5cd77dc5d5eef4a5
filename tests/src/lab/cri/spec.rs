//! A pod's spec and what the kubelet makes of it: the sandbox config (labels, annotations,
//! cgroup parent, DNS, namespaces) and the app container's config (command, mounts, labels).

use std::{collections::HashMap, path::Path};

use k8s_cri::v1::{
    ContainerConfig, ContainerMetadata, DnsConfig, ImageSpec, KeyValue, LinuxContainerConfig,
    LinuxContainerResources, LinuxContainerSecurityContext, LinuxPodSandboxConfig,
    LinuxSandboxSecurityContext, Mount, NamespaceMode, NamespaceOption, PodSandboxConfig,
    PodSandboxMetadata,
};

use super::APP_IMAGE;
use crate::lab::container::{Mode, backend_script, lab_python};

/// What runs as the app container's PID 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Init {
    /// catatonit, forwarding the stop signal to the server (busybox `sh -c` would not).
    Catatonit,
    /// The server itself: without a handler, the kernel drops SIGTERM for a namespace's init.
    None,
}

/// The app container.
#[derive(Clone, Debug)]
pub struct AppSpec {
    pub mode: Mode,
    pub port: u16,
    pub init: Init,
}

/// A pod as a Deployment's ReplicaSet names it: `<workload>-<pod-template-hash>-<suffix>`.
#[derive(Clone, Debug)]
pub struct PodSpec {
    pub namespace: String,
    pub name: String,
    pub workload: String,
    pub template_hash: String,
    /// A random UUID, as the API server assigns.
    pub uid: String,
    /// The container's name.
    pub container: String,
    pub app: AppSpec,
    /// `terminationGracePeriodSeconds`, as the kubelet annotates the container with it.
    pub grace_secs: i64,
}

impl PodSpec {
    /// `namespace/<workload>-<hash>-<suffix>` with one container `app` running `app`.
    pub fn deployment(
        namespace: &str,
        workload: &str,
        hash: &str,
        suffix: &str,
        app: AppSpec,
    ) -> Self {
        PodSpec {
            namespace: namespace.into(),
            name: format!("{workload}-{hash}-{suffix}"),
            workload: workload.into(),
            template_hash: hash.into(),
            uid: random_uid(),
            container: "app".into(),
            app,
            grace_secs: 30,
        }
    }

    /// `labels` and the three the kubelet puts on a sandbox and each of its containers.
    fn labels_with(&self, labels: &[(&str, &str)]) -> HashMap<String, String> {
        let mut all = kv(labels);
        all.extend(kv(&[
            ("io.kubernetes.pod.name", &self.name),
            ("io.kubernetes.pod.namespace", &self.namespace),
            ("io.kubernetes.pod.uid", &self.uid),
        ]));
        all
    }

    /// The kubelet's cgroup parent for a BestEffort pod with the cgroupfs driver.
    pub fn cgroup_parent(&self) -> String {
        format!("/kubepods/besteffort/pod{}", self.uid)
    }
}

/// A UUID v4 from `fastrand`, in the API server's form.
fn random_uid() -> String {
    let b: [u8; 16] = std::array::from_fn(|i| match i {
        6 => 0x40 | (fastrand::u8(..) & 0x0f),
        8 => 0x80 | (fastrand::u8(..) & 0x3f),
        _ => fastrand::u8(..),
    });
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

fn kv(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The kubelet's sandbox config: the pod's labels plus its own three, annotations, the
/// cgroup parent, a loopback resolver (a lab pod must not leak DNS queries off the machine).
pub(super) fn sandbox_config(spec: &PodSpec, pod_logs: &Path) -> PodSandboxConfig {
    PodSandboxConfig {
        metadata: Some(PodSandboxMetadata {
            name: spec.name.clone(),
            uid: spec.uid.clone(),
            namespace: spec.namespace.clone(),
            attempt: 0,
        }),
        hostname: spec.name.clone(),
        log_directory: pod_logs.to_string_lossy().into_owned(),
        dns_config: Some(DnsConfig {
            servers: vec!["127.0.0.1".into()],
            searches: vec![],
            options: vec![],
        }),
        port_mappings: vec![],
        labels: spec.labels_with(&[
            ("app", &spec.workload),
            ("pod-template-hash", &spec.template_hash),
        ]),
        annotations: kv(&[
            ("kubernetes.io/config.source", "api"),
            (
                "kubernetes.io/config.seen",
                "2026-01-01T00:00:00.000000000Z",
            ),
        ]),
        linux: Some(LinuxPodSandboxConfig {
            cgroup_parent: spec.cgroup_parent(),
            security_context: Some(LinuxSandboxSecurityContext {
                namespace_options: Some(namespaces()),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The app container: backend.py under the host's python (read-only mounts of the host's
/// /usr and libraries, as the podman labs run it), behind catatonit or as PID 1.
pub(super) fn container_config(spec: &PodSpec, log_dir: &Path) -> ContainerConfig {
    let python = lab_python();
    let mut mounts: Vec<Mount> = ["/usr", "/lib", "/lib64"]
        .into_iter()
        .filter(|p| Path::new(p).exists())
        .map(|p| ro_mount(p, p))
        .collect();
    if python.starts_with("/root/.pyenv") {
        mounts.push(ro_mount("/root/.pyenv", "/root/.pyenv"));
    }
    mounts.push(ro_mount(
        &backend_script().to_string_lossy(),
        "/lab/backend.py",
    ));
    mounts.push(Mount {
        host_path: log_dir.to_string_lossy().into_owned(),
        container_path: "/lab/log".into(),
        ..Default::default()
    });
    let mut command = match spec.app.init {
        Init::Catatonit => vec![catatonit(), "--".into()],
        Init::None => vec![],
    };
    command.push(python);
    let port = spec.app.port.to_string();
    let args: Vec<String> = [
        "/lab/backend.py",
        "--mode",
        spec.app.mode.as_str(),
        "--port",
        &port,
        "--name",
        &spec.name,
        "--log-dir",
        "/lab/log",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    let grace = spec.grace_secs.to_string();
    ContainerConfig {
        metadata: Some(ContainerMetadata {
            name: spec.container.clone(),
            attempt: 0,
        }),
        image: Some(ImageSpec {
            image: APP_IMAGE.into(),
            ..Default::default()
        }),
        command,
        args,
        envs: vec![KeyValue {
            key: "PYTHONDONTWRITEBYTECODE".into(),
            value: "1".into(),
        }],
        mounts,
        labels: spec.labels_with(&[("io.kubernetes.container.name", &spec.container)]),
        annotations: kv(&[
            ("io.kubernetes.container.hash", "5d2f1a3b"),
            ("io.kubernetes.container.restartCount", "0"),
            (
                "io.kubernetes.container.terminationMessagePath",
                "/dev/termination-log",
            ),
            ("io.kubernetes.container.terminationMessagePolicy", "File"),
            ("io.kubernetes.pod.terminationGracePeriod", &grace),
        ]),
        log_path: format!("{}/0.log", spec.container),
        linux: Some(LinuxContainerConfig {
            // BestEffort, as the kubelet sets it: the least CPU weight, the first to be
            // OOM-killed (containerd clamps the score to its own: restrict_oom_score_adj).
            resources: Some(LinuxContainerResources {
                cpu_shares: 2,
                oom_score_adj: 1000,
                ..Default::default()
            }),
            security_context: Some(LinuxContainerSecurityContext {
                namespace_options: Some(namespaces()),
                ..Default::default()
            }),
        }),
        ..Default::default()
    }
}

/// The kubelet's namespaces for a pod without `shareProcessNamespace` or host namespaces: the
/// network and IPC of the sandbox, a PID namespace per container. (The CRI's zero value is
/// POD for all three: the app would not be its namespace's init, and a handler-less server
/// as PID 1 would die of SIGTERM instead of ignoring it.)
fn namespaces() -> NamespaceOption {
    NamespaceOption {
        network: NamespaceMode::Pod as i32,
        pid: NamespaceMode::Container as i32,
        ipc: NamespaceMode::Pod as i32,
        ..Default::default()
    }
}

fn ro_mount(host: &str, container: &str) -> Mount {
    Mount {
        host_path: host.into(),
        container_path: container.into(),
        readonly: true,
        ..Default::default()
    }
}

/// catatonit on the host, under /usr (mounted into the container at the same path).
fn catatonit() -> String {
    ["/usr/bin/catatonit", "/usr/libexec/podman/catatonit"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("catatonit is needed for the CRI lab's init (apt-get install catatonit)")
        .into()
}
