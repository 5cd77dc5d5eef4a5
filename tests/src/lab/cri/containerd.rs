//! containerd as the lab runs it: its own config, root and socket in a lab directory, the task
//! state where the caller says, started by its own PID and waited for; the images imported.

use std::{
    fs,
    os::unix::{net::UnixStream, process::CommandExt},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use super::{NETWORK, PAUSE_IMAGE, cleanup::Owned, image, kubelet::Kubelet, network};
use crate::lab::container::{LAB_DIR, unique_name};

const CONTAINERD: &str = "/usr/bin/containerd";
const CTR: &str = "/usr/bin/ctr";
const RUNC: &str = "/usr/sbin/runc";
pub(super) const CNI_BIN: &str = "/usr/lib/cni";
/// containerd's CRI namespace: where the kubelet's pods live.
pub(super) const K8S_NS: &str = "k8s.io";

/// A containerd the lab started. Dropping it kills it and its shims and removes what it left.
pub struct Containerd {
    child: Option<Child>,
    pub pid: u32,
    /// The lab's directory: config, root, CNI config, log, socket, images, pod logs.
    pub dir: PathBuf,
    /// Where containerd keeps task state (`<state>/io.containerd.runtime.v2.task/k8s.io/<id>`).
    pub state: PathBuf,
    /// The gRPC socket (CRI and containerd's own API).
    pub socket: PathBuf,
    /// What to remove at the end (also written to the lab directory for a later run).
    pub(super) owned: Owned,
}

impl Containerd {
    /// Starts containerd with the lab's config and its task state at `state`, waits (30 s at
    /// most) for its socket to answer, and imports the images. Panics with its log if it does
    /// not come up.
    pub fn start(state: PathBuf) -> Containerd {
        for (path, what) in [
            (CONTAINERD, "containerd"),
            (CTR, "containerd (ctr)"),
            (RUNC, "runc"),
            ("/usr/lib/cni/bridge", "containernetworking-plugins"),
            ("/usr/lib/cni/host-local", "containernetworking-plugins"),
        ] {
            assert!(
                Path::new(path).exists(),
                "{path} is missing: the CRI lab needs {what} (cargo xtask setup installs it)"
            );
        }
        super::cleanup_leftovers();
        if let Ok(s) = UnixStream::connect(state.join("containerd.sock")) {
            drop(s);
            panic!(
                "a containerd already serves {}: the lab starts its own",
                state.display()
            );
        }
        let dir = PathBuf::from(LAB_DIR).join(unique_name("cri"));
        fs::create_dir_all(dir.join("cni")).expect("the CRI lab's directory");
        let mut owned = Owned::new(&dir);
        owned.dir_if_new(&state);
        // containerd 1.6 puts its shims' sockets under /run/containerd/s whatever `state` says
        // (a compiled-in path): on a k3s layout that directory is the lab's too.
        owned.dir_if_new(Path::new("/run/containerd/s"));
        owned.dir_if_new(Path::new("/run/containerd"));
        // host-local's leases and libcni's cached results live here.
        owned.dir_if_new(Path::new("/var/lib/cni"));
        owned.cni_network(NETWORK);
        let socket = dir.join("containerd.sock");
        fs::write(dir.join("config.toml"), config(&dir, &state, &socket))
            .expect("write containerd's config");
        fs::write(dir.join("cni/10-dwcri.conflist"), network::conflist())
            .expect("write the CNI config");
        let log = fs::File::create(dir.join("containerd.log")).expect("containerd's log file");
        let mut cmd = Command::new(CONTAINERD);
        cmd.arg("--config")
            .arg(dir.join("config.toml"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log file"))
            .stderr(log);
        // SAFETY: prctl in the child before exec, no allocation: containerd dies with the test
        // process even if that is SIGKILLed (its shims and pods are for the next run's sweep).
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = cmd.spawn().expect("spawn containerd");
        let mut c = Containerd {
            pid: child.id(),
            child: Some(child),
            dir,
            state,
            socket,
            owned,
        };
        c.await_socket(Duration::from_secs(30));
        image::import(&c);
        network::ensure_fallback();
        c
    }

    fn await_socket(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            if UnixStream::connect(&self.socket).is_ok() {
                return;
            }
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                panic!(
                    "containerd exited during start-up ({status}); its log:\n{}",
                    self.log()
                );
            }
            assert!(
                Instant::now() < deadline,
                "containerd's socket {} did not answer within {timeout:?}; its log:\n{}",
                self.socket.display(),
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// containerd's own log so far.
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.join("containerd.log")).unwrap_or_else(|e| e.to_string())
    }

    /// `ctr -a <socket> -n k8s.io <args>`: stdout, or why it failed.
    pub fn ctr(&self, args: &[&str]) -> Result<String, String> {
        let out = Command::new(CTR)
            .arg("-a")
            .arg(&self.socket)
            .args(["-n", K8S_NS])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("running ctr {args:?}: {e}"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(format!(
                "ctr {args:?} failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }

    /// Stops and removes, through the CRI, every pod sandbox still there (a test that failed
    /// half-way): the kubelet's way of taking them down, before the processes are killed.
    pub(super) fn remove_pods(&mut self, kubelet: &mut Kubelet) {
        let Ok(ids) = kubelet.sandbox_ids() else {
            return;
        };
        for id in ids {
            let _ = kubelet.stop_pod_sandbox(&id);
            let _ = kubelet.remove_pod_sandbox(&id);
        }
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.owned.clean(&self.socket, &self.state);
    }
}

/// containerd's config: its own root and socket in `dir`, the task state at `state`, runc with
/// the cgroupfs driver (this host's cgroups are hybrid), the CRI with `restrict_oom_score_adj`
/// (root here lacks CAP_SYS_RESOURCE: runc fails on oom_score_adj otherwise), the local pause
/// image and the lab's CNI config.
fn config(dir: &Path, state: &Path, socket: &Path) -> String {
    let d = dir.display();
    let cri = "plugins.\"io.containerd.grpc.v1.cri\"";
    format!(
        r#"version = 2
root = "{d}/root"
state = "{state}"
[grpc]
  address = "{socket}"
[ttrpc]
  address = "{socket}.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/opt"
[{cri}]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  enable_selinux = false
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"
[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = false
  BinaryName = "{RUNC}"
[{cri}.cni]
  bin_dir = "{CNI_BIN}"
  conf_dir = "{d}/cni"
  max_conf_num = 1
"#,
        state = state.display(),
        socket = socket.display(),
    )
}
