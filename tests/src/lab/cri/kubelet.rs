//! The kubelet's side of the CRI: gRPC (`runtime.v1.RuntimeService`, `ImageService`) over
//! containerd's unix socket, one blocking call at a time.

use std::{collections::HashMap, future::Future, path::Path, time::Duration};

use hyper_util::rt::TokioIo;
use k8s_cri::v1::{
    ContainerConfig, ContainerStatus, ContainerStatusRequest, CreateContainerRequest, ImageSpec,
    ImageStatusRequest, ListPodSandboxRequest, PodSandboxConfig, PodSandboxStatusRequest,
    PodSandboxStatusResponse, RemoveContainerRequest, RemovePodSandboxRequest,
    RunPodSandboxRequest, StartContainerRequest, StopContainerRequest, StopPodSandboxRequest,
    VersionRequest, image_service_client::ImageServiceClient,
    runtime_service_client::RuntimeServiceClient,
};
use tokio::{net::UnixStream, runtime::Runtime};
use tonic::transport::{Channel, Endpoint, Uri};

/// How long a call other than `StopContainer` may take (containerd answers in milliseconds;
/// RunPodSandbox with CNI in about a second on this machine).
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// A CRI client: the calls the kubelet makes, in its terms.
pub struct Kubelet {
    rt: Runtime,
    runtime: RuntimeServiceClient<Channel>,
    images: ImageServiceClient<Channel>,
    /// `Version`'s runtime name and version.
    pub runtime_name: String,
    pub runtime_version: String,
}

/// Runs one call to its end or `timeout`; the gRPC status as text on failure.
fn block<T>(
    rt: &Runtime,
    what: &str,
    timeout: Duration,
    call: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, String> {
    match rt.block_on(async { tokio::time::timeout(timeout, call).await }) {
        Err(_) => Err(format!("{what}: no answer within {timeout:?}")),
        Ok(Err(s)) => Err(format!("{what}: {:?}: {}", s.code(), s.message())),
        Ok(Ok(r)) => Ok(r.into_inner()),
    }
}

impl Kubelet {
    /// Connects to the CRI on `socket` and asks `Version`.
    pub fn connect(socket: &Path) -> Result<Kubelet, String> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("tokio runtime: {e}"))?;
        let path = socket.to_path_buf();
        // The URI is a placeholder: the connector dials the socket whatever it says.
        let endpoint =
            Endpoint::try_from("http://[::]:50051").map_err(|e| format!("endpoint: {e}"))?;
        let channel = rt
            .block_on(
                endpoint.connect_with_connector(tower::service_fn(move |_: Uri| {
                    let path = path.clone();
                    async move {
                        Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?))
                    }
                })),
            )
            .map_err(|e| format!("connecting to {}: {e}", socket.display()))?;
        let mut runtime = RuntimeServiceClient::new(channel.clone());
        let version = block(
            &rt,
            "Version",
            CALL_TIMEOUT,
            runtime.version(VersionRequest {
                version: "v1".into(),
            }),
        )?;
        Ok(Kubelet {
            rt,
            runtime,
            images: ImageServiceClient::new(channel),
            runtime_name: version.runtime_name,
            runtime_version: version.runtime_version,
        })
    }

    /// Whether the runtime has `image` (`ImageStatus`): the kubelet asks before it pulls.
    pub fn has_image(&mut self, image: &str) -> Result<bool, String> {
        let req = ImageStatusRequest {
            image: Some(ImageSpec {
                image: image.into(),
                ..Default::default()
            }),
            verbose: false,
        };
        let mut c = self.images.clone();
        let r = block(&self.rt, "ImageStatus", CALL_TIMEOUT, c.image_status(req))?;
        Ok(r.image.is_some())
    }

    /// `RunPodSandbox`: the sandbox's id.
    pub fn run_pod_sandbox(&mut self, config: &PodSandboxConfig) -> Result<String, String> {
        let req = RunPodSandboxRequest {
            config: Some(config.clone()),
            runtime_handler: String::new(),
        };
        let mut c = self.runtime.clone();
        let r = block(
            &self.rt,
            "RunPodSandbox",
            CALL_TIMEOUT,
            c.run_pod_sandbox(req),
        )?;
        Ok(r.pod_sandbox_id)
    }

    /// `PodSandboxStatus` with the runtime's verbose info (containerd: `info` as JSON).
    pub fn pod_sandbox_status(&mut self, id: &str) -> Result<PodSandboxStatusResponse, String> {
        let req = PodSandboxStatusRequest {
            pod_sandbox_id: id.into(),
            verbose: true,
        };
        let mut c = self.runtime.clone();
        block(
            &self.rt,
            "PodSandboxStatus",
            CALL_TIMEOUT,
            c.pod_sandbox_status(req),
        )
    }

    /// `CreateContainer` in `sandbox_id` (whose config the kubelet passes again): its id.
    pub fn create_container(
        &mut self,
        sandbox_id: &str,
        config: &ContainerConfig,
        sandbox: &PodSandboxConfig,
    ) -> Result<String, String> {
        let req = CreateContainerRequest {
            pod_sandbox_id: sandbox_id.into(),
            config: Some(config.clone()),
            sandbox_config: Some(sandbox.clone()),
        };
        let mut c = self.runtime.clone();
        let r = block(
            &self.rt,
            "CreateContainer",
            CALL_TIMEOUT,
            c.create_container(req),
        )?;
        Ok(r.container_id)
    }

    pub fn start_container(&mut self, id: &str) -> Result<(), String> {
        let req = StartContainerRequest {
            container_id: id.into(),
        };
        let mut c = self.runtime.clone();
        block(
            &self.rt,
            "StartContainer",
            CALL_TIMEOUT,
            c.start_container(req),
        )
        .map(drop)
    }

    /// `StopContainer(timeout)`: the stop signal, SIGKILL `grace_secs` later if still running;
    /// returns once the container has exited.
    pub fn stop_container(&mut self, id: &str, grace_secs: i64) -> Result<(), String> {
        let req = StopContainerRequest {
            container_id: id.into(),
            timeout: grace_secs,
        };
        let wait = CALL_TIMEOUT + Duration::from_secs(grace_secs.unsigned_abs());
        let mut c = self.runtime.clone();
        block(&self.rt, "StopContainer", wait, c.stop_container(req)).map(drop)
    }

    /// `StopPodSandbox`: SIGKILLs what still runs in the pod (the pause process), tears down
    /// its network (CNI DEL: the address goes) and removes its network namespace.
    pub fn stop_pod_sandbox(&mut self, id: &str) -> Result<(), String> {
        let req = StopPodSandboxRequest {
            pod_sandbox_id: id.into(),
        };
        let mut c = self.runtime.clone();
        block(
            &self.rt,
            "StopPodSandbox",
            CALL_TIMEOUT,
            c.stop_pod_sandbox(req),
        )
        .map(drop)
    }

    pub fn remove_container(&mut self, id: &str) -> Result<(), String> {
        let req = RemoveContainerRequest {
            container_id: id.into(),
        };
        let mut c = self.runtime.clone();
        block(
            &self.rt,
            "RemoveContainer",
            CALL_TIMEOUT,
            c.remove_container(req),
        )
        .map(drop)
    }

    pub fn remove_pod_sandbox(&mut self, id: &str) -> Result<(), String> {
        let req = RemovePodSandboxRequest {
            pod_sandbox_id: id.into(),
        };
        let mut c = self.runtime.clone();
        block(
            &self.rt,
            "RemovePodSandbox",
            CALL_TIMEOUT,
            c.remove_pod_sandbox(req),
        )
        .map(drop)
    }

    /// `ContainerStatus` (verbose) and the runtime's info map (containerd: `info`, JSON with
    /// the task's `pid`).
    pub fn container_status(
        &mut self,
        id: &str,
    ) -> Result<(ContainerStatus, HashMap<String, String>), String> {
        let req = ContainerStatusRequest {
            container_id: id.into(),
            verbose: true,
        };
        let mut c = self.runtime.clone();
        let r = block(
            &self.rt,
            "ContainerStatus",
            CALL_TIMEOUT,
            c.container_status(req),
        )?;
        let status = r
            .status
            .ok_or_else(|| format!("ContainerStatus of {id}: no status"))?;
        Ok((status, r.info))
    }

    /// Ids of every pod sandbox the runtime has.
    pub fn sandbox_ids(&mut self) -> Result<Vec<String>, String> {
        let req = ListPodSandboxRequest { filter: None };
        let mut c = self.runtime.clone();
        let r = block(
            &self.rt,
            "ListPodSandbox",
            CALL_TIMEOUT,
            c.list_pod_sandbox(req),
        )?;
        Ok(r.items.into_iter().map(|s| s.id).collect())
    }
}
