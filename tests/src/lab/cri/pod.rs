//! One pod as the kubelet runs and deletes it: a sandbox and one app container running
//! `tests/lab/backend.py`, ready when the server answers; deleted in the kubelet's order.

use std::{
    fs,
    net::{Ipv4Addr, SocketAddrV4},
    path::PathBuf,
    time::{Duration, Instant},
};

use k8s_cri::v1::PodSandboxConfig;
use serde_json::Value;

use super::{
    APP_IMAGE, CriLab,
    network::require_bridge_route,
    spec::{Init, PodSpec, container_config, sandbox_config},
};
use crate::lab::container::{http_get, server_child};

/// A running pod.
#[derive(Debug)]
pub struct Pod {
    pub spec: PodSpec,
    pub sandbox_id: String,
    pub app_id: String,
    /// The pod's address on the lab's bridge.
    pub ip: Ipv4Addr,
    /// The network namespace file the runtime made (`/var/run/netns/cni-…`).
    pub netns: PathBuf,
    /// Host pid of the pause process.
    pub sandbox_pid: u32,
    /// Host pid of the app container's PID 1 (catatonit, or the server).
    pub init_pid: u32,
    /// Host pid of the server.
    pub server_pid: u32,
    /// The backend's log directory on the host (`/lab/log` inside).
    pub log_dir: PathBuf,
    /// The kubelet's pod log directory (the container's log under `app/0.log`).
    pub pod_logs: PathBuf,
    sandbox_config: PodSandboxConfig,
}

/// When each step of a deletion was issued and returned.
#[derive(Clone, Copy, Debug)]
pub struct Deletion {
    pub stop_issued: Instant,
    pub container_stopped: Instant,
    pub sandbox_stop_issued: Instant,
    pub sandbox_stopped: Instant,
    pub container_removed: Instant,
    pub sandbox_removed: Instant,
}

/// A step of a deletion just done, for [`Pod::delete_with`]'s caller to act between steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    ContainerStopped,
    SandboxStopped,
}

impl Pod {
    pub(super) fn run(lab: &mut CriLab, spec: PodSpec) -> Pod {
        let dir = lab.containerd.dir.clone();
        let pod_logs = dir
            .join("pods")
            .join(format!("{}_{}_{}", spec.namespace, spec.name, spec.uid));
        let log_dir = dir.join(format!("backend-{}", spec.name));
        fs::create_dir_all(&pod_logs).expect("the pod's log directory");
        fs::create_dir_all(&log_dir).expect("the backend's log directory");
        lab.containerd.owned.cgroup(&spec.cgroup_parent());
        let sandbox_config = sandbox_config(&spec, &pod_logs);
        let k = &mut lab.kubelet;
        let fail = |what: &str, e: String, lab_log: String| -> ! {
            panic!(
                "{what} for {}: {e}\ncontainerd's log:\n{lab_log}",
                spec.name
            )
        };
        let sandbox_id = k
            .run_pod_sandbox(&sandbox_config)
            .unwrap_or_else(|e| fail("RunPodSandbox", e, lab.containerd.log()));
        let status = k
            .pod_sandbox_status(&sandbox_id)
            .unwrap_or_else(|e| fail("PodSandboxStatus", e, lab.containerd.log()));
        let info: Value = status
            .info
            .get("info")
            .and_then(|i| serde_json::from_str(i).ok())
            .unwrap_or_default();
        let netns = netns_path(&info);
        if let Some(n) = &netns {
            lab.containerd.owned.netns(n);
        }
        let ip: Ipv4Addr = status
            .status
            .as_ref()
            .and_then(|s| s.network.as_ref())
            .and_then(|n| n.ip.parse().ok())
            .unwrap_or_else(|| panic!("no pod IPv4 address in {status:?}"));
        let sandbox_pid = info["pid"].as_u64().unwrap_or(0) as u32;
        assert!(
            lab.kubelet.has_image(APP_IMAGE).unwrap_or(false),
            "{APP_IMAGE} is not in the runtime"
        );
        let config = container_config(&spec, &log_dir);
        let app_id = lab
            .kubelet
            .create_container(&sandbox_id, &config, &sandbox_config)
            .unwrap_or_else(|e| fail("CreateContainer", e, lab.containerd.log()));
        lab.kubelet
            .start_container(&app_id)
            .unwrap_or_else(|e| fail("StartContainer", e, lab.containerd.log()));
        let mut pod = Pod {
            spec,
            sandbox_id,
            app_id,
            ip,
            netns: netns.unwrap_or_default(),
            sandbox_pid,
            init_pid: 0,
            server_pid: 0,
            log_dir,
            pod_logs,
            sandbox_config,
        };
        lab.exits.wait_started(&pod.app_id, Duration::from_secs(10));
        pod.await_ready(lab);
        pod
    }

    /// Waits for the server's `listening` line and one `/health` answered 200, and takes the
    /// pids; panics with the container's log if it does not come up within 15 s.
    fn await_ready(&mut self, lab: &mut CriLab) {
        let deadline = Instant::now() + Duration::from_secs(15);
        let events = self.log_dir.join("events.log");
        loop {
            let text = fs::read_to_string(&events).unwrap_or_default();
            if text.lines().any(|l| l.starts_with("listening ")) {
                break;
            }
            let state = lab
                .kubelet
                .container_status(&self.app_id)
                .map(|s| s.0.state);
            assert!(
                Instant::now() < deadline && state == Ok(1),
                "the app of {} did not listen (state {state:?}); its log:\n{}\ncontainerd's log:\n{}",
                self.spec.name,
                fs::read_to_string(self.pod_logs.join("app/0.log")).unwrap_or_default(),
                lab.containerd.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let (_, info) = lab
            .kubelet
            .container_status(&self.app_id)
            .unwrap_or_else(|e| panic!("{e}"));
        let info: Value = info
            .get("info")
            .and_then(|i| serde_json::from_str(i).ok())
            .unwrap_or_default();
        self.init_pid = info["pid"].as_u64().unwrap_or(0) as u32;
        assert!(self.init_pid > 0, "no task pid in the container's info");
        self.server_pid = match self.spec.app.init {
            Init::None => self.init_pid,
            Init::Catatonit => server_child(self.init_pid, deadline),
        };
        self.assert_contained();
        require_bridge_route(self.ip.into()).unwrap_or_else(|e| panic!("{e}"));
        loop {
            match http_get(self.addr(), "/health", Duration::from_secs(2)) {
                Ok((200, _)) => break,
                r => assert!(
                    Instant::now() < deadline,
                    "/health of {}: {r:?}",
                    self.spec.name
                ),
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The pod can reach nothing off the machine: no default route in its network namespace
    /// (read through the server's `/proc`), and the loopback resolver only.
    fn assert_contained(&self) {
        let routes = fs::read_to_string(format!("/proc/{}/net/route", self.server_pid))
            .expect("the pod's routes");
        let default = routes
            .lines()
            .skip(1)
            .any(|l| l.split_whitespace().nth(1) == Some("00000000"));
        assert!(!default, "the pod has a default route:\n{routes}");
        let resolv = fs::read_to_string(format!("/proc/{}/root/etc/resolv.conf", self.server_pid))
            .expect("the pod's resolv.conf");
        let servers: Vec<&str> = resolv
            .lines()
            .filter_map(|l| l.strip_prefix("nameserver"))
            .map(str::trim)
            .collect();
        assert_eq!(servers, ["127.0.0.1"], "the pod's resolvers:\n{resolv}");
    }

    /// The server's address.
    pub fn addr(&self) -> SocketAddrV4 {
        SocketAddrV4::new(self.ip, self.spec.app.port)
    }

    /// Deletes the pod in the kubelet's order: `StopContainer(grace_secs)`, `StopPodSandbox`,
    /// `RemoveContainer`, `RemovePodSandbox`, calling `between` after each stop (for the
    /// caller's clients to see the pod in that state).
    pub fn delete_with(
        &self,
        lab: &mut CriLab,
        grace_secs: i64,
        mut between: impl FnMut(Step),
    ) -> Deletion {
        let k = &mut lab.kubelet;
        let stop_issued = Instant::now();
        k.stop_container(&self.app_id, grace_secs)
            .unwrap_or_else(|e| panic!("{e}"));
        let container_stopped = Instant::now();
        between(Step::ContainerStopped);
        let sandbox_stop_issued = Instant::now();
        k.stop_pod_sandbox(&self.sandbox_id)
            .unwrap_or_else(|e| panic!("{e}"));
        let sandbox_stopped = Instant::now();
        between(Step::SandboxStopped);
        k.remove_container(&self.app_id)
            .unwrap_or_else(|e| panic!("{e}"));
        let container_removed = Instant::now();
        k.remove_pod_sandbox(&self.sandbox_id)
            .unwrap_or_else(|e| panic!("{e}"));
        Deletion {
            stop_issued,
            container_stopped,
            sandbox_stop_issued,
            sandbox_stopped,
            container_removed,
            sandbox_removed: Instant::now(),
        }
    }

    /// The sandbox config the pod was run with (the kubelet sends it again with every
    /// container it creates).
    pub fn sandbox_config(&self) -> &PodSandboxConfig {
        &self.sandbox_config
    }
}

/// The network namespace path in containerd's verbose sandbox info (its runtime spec).
fn netns_path(info: &Value) -> Option<PathBuf> {
    info["runtimeSpec"]["linux"]["namespaces"]
        .as_array()?
        .iter()
        .find(|n| n["type"] == "network")?["path"]
        .as_str()
        .map(PathBuf::from)
}
