//! Pure: container metadata from Docker's `config.v2.json`, including the Kubernetes pod of
//! containers the kubelet made through dockershim or cri-dockerd.

use serde_json::{Map, Value};

use super::{
    ContainerMeta, KUBE_CONTAINER_NAME, KUBE_POD_NAME, KUBE_POD_NAMESPACE, MetaError, SANDBOX_NAME,
    naming::{kube_meta, local_meta},
    non_empty,
};

const DOCKER_K8S_TYPE: &str = "io.kubernetes.docker.type";

/// Pure: Docker's /var/lib/docker/containers/<id>/config.v2.json ("Name": "/web-1",
/// Config.Labels incl. com.docker.compose.service). Containers the kubelet made through
/// dockershim or cri-dockerd carry the pod in their `io.kubernetes.*` labels.
pub fn from_docker_config_v2(json: &str) -> Result<ContainerMeta, MetaError> {
    let config: Value = serde_json::from_str(json)?;
    let name = config
        .get("Name")
        .and_then(Value::as_str)
        .ok_or(MetaError::Shape("no Name"))?;
    let name = name.strip_prefix('/').unwrap_or(name).to_string();
    // Labels are null for a container created without any.
    let labels = match config.get("Config").and_then(|c| c.get("Labels")) {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(labels)) => labels.clone(),
        Some(_) => return Err(MetaError::Shape("Config.Labels is not an object")),
    };
    let label = |key: &str| non_empty(&labels, key);
    if let Some(pod) = label(KUBE_POD_NAME) {
        let name = if label(DOCKER_K8S_TYPE) == Some("podsandbox") {
            SANDBOX_NAME
        } else {
            label(KUBE_CONTAINER_NAME).unwrap_or(&name)
        };
        return Ok(kube_meta(
            name,
            label(KUBE_POD_NAMESPACE).unwrap_or_default(),
            pod,
        ));
    }
    Ok(local_meta(name, &labels))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::enrich::runtime_meta::test_support::*;

    #[test]
    fn docker_compose_kubernetes_and_plain_containers() {
        // docker inspect of a Compose 1.29 container with container_name: gitea, service server.
        assert_eq!(
            from_docker_config_v2(&fixture("docker-compose-gitea.json")).ok(),
            Some(meta("gitea", "", "", "server"))
        );
        // A kubelet (dockershim) container.
        assert_eq!(
            from_docker_config_v2(&fixture("docker-k8s-container.config.v2.json")).ok(),
            Some(meta(
                "app",
                "default",
                "inf-hulk-demo-ebs",
                "inf-hulk-demo-ebs"
            ))
        );
        // Plain `docker run --name x-ui`.
        assert_eq!(
            from_docker_config_v2(&fixture("docker-plain.config.v2.json")).ok(),
            Some(meta("x-ui", "", "", "x-ui"))
        );
        assert!(from_docker_config_v2("{}").is_err());
        assert!(from_docker_config_v2("nope").is_err());
    }
}
