//! Pure: container metadata from the annotations of an OCI runtime spec (`config.json`), as
//! containerd's CRI plugin and CRI-O fill them.

use std::collections::BTreeMap;

use serde_json::Value;

use super::{
    ContainerMeta, KUBE_CONTAINER_NAME, KUBE_POD_NAME, KUBE_POD_NAMESPACE, MetaError, SANDBOX_NAME,
    naming::kube_meta, non_empty,
};

// containerd's CRI plugin (pkg/cri/annotations/annotations.go).
const CRI_CONTAINER_TYPE: &str = "io.kubernetes.cri.container-type";
const CRI_CONTAINER_NAME: &str = "io.kubernetes.cri.container-name";
const CRI_SANDBOX_NAME: &str = "io.kubernetes.cri.sandbox-name";
const CRI_SANDBOX_NAMESPACE: &str = "io.kubernetes.cri.sandbox-namespace";

// CRI-O (pkg/annotations/internal.go).
const CRIO_CONTAINER_TYPE: &str = "io.kubernetes.cri-o.ContainerType";
const CRIO_LABELS: &str = "io.kubernetes.cri-o.Labels";
const CRIO_METADATA: &str = "io.kubernetes.cri-o.Metadata";
const CRIO_KUBE_NAME: &str = "io.kubernetes.cri-o.KubeName";
const CRIO_NAMESPACE: &str = "io.kubernetes.cri-o.Namespace";
const CRIO_SANDBOX_NAME: &str = "io.kubernetes.cri-o.SandboxName";
const CRIO_CONTAINER_NAME: &str = "io.kubernetes.cri-o.ContainerName";

/// Pure: annotations from an OCI runtime spec (`config.json`) as containerd and CRI-O fill
/// them. None when it has no Kubernetes annotations (podman's, Docker's, plain containerd's).
pub fn from_oci_config(json: &str) -> Result<Option<ContainerMeta>, MetaError> {
    let spec: Value = serde_json::from_str(json)?;
    let Some(annotations) = spec.get("annotations") else {
        return Ok(None);
    };
    let annotations = annotations
        .as_object()
        .ok_or(MetaError::Shape("annotations is not an object"))?;
    let get = |key: &str| non_empty(annotations, key);

    if let Some(pod) = get(CRI_SANDBOX_NAME) {
        let name = if get(CRI_CONTAINER_TYPE) == Some("sandbox") {
            SANDBOX_NAME
        } else {
            get(CRI_CONTAINER_NAME).unwrap_or_default()
        };
        return Ok(Some(kube_meta(
            name,
            get(CRI_SANDBOX_NAMESPACE).unwrap_or_default(),
            pod,
        )));
    }

    let crio_type = get(CRIO_CONTAINER_TYPE);
    if crio_type.is_none() && get(KUBE_POD_NAME).is_none() {
        return Ok(None);
    }
    // CRI-O copies the kubelet's labels both as annotations and as one JSON annotation; older
    // versions and crictl-made pods have only its own keys, hence the chain of fallbacks.
    let labels =
        get(CRIO_LABELS).and_then(|l| serde_json::from_str::<BTreeMap<String, String>>(l).ok());
    let label = |key: &str| {
        labels
            .as_ref()
            .and_then(|l| l.get(key))
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    };
    let sandbox_fields = get(CRIO_SANDBOX_NAME).and_then(|s| kubelet_name_fields(s, 5));
    let is_sandbox = crio_type == Some("sandbox");

    let pod = get(KUBE_POD_NAME)
        .or_else(|| label(KUBE_POD_NAME))
        .or_else(|| is_sandbox.then(|| get(CRIO_KUBE_NAME)).flatten())
        .or_else(|| sandbox_fields.as_ref().map(|f| f[1]));
    let Some(pod) = pod else {
        return Ok(None);
    };
    let namespace = get(KUBE_POD_NAMESPACE)
        .or_else(|| label(KUBE_POD_NAMESPACE))
        .or_else(|| get(CRIO_NAMESPACE))
        .or_else(|| sandbox_fields.as_ref().map(|f| f[2]))
        .unwrap_or_default();
    let metadata_name = get(CRIO_METADATA)
        .and_then(|m| serde_json::from_str::<Value>(m).ok())
        .and_then(|m| m.get("name").and_then(Value::as_str).map(str::to_string));
    let name = if is_sandbox {
        SANDBOX_NAME.to_string()
    } else {
        get(KUBE_CONTAINER_NAME)
            .or_else(|| label(KUBE_CONTAINER_NAME))
            .map(str::to_string)
            .or(metadata_name)
            .or_else(|| {
                get(CRIO_CONTAINER_NAME)
                    .and_then(|n| kubelet_name_fields(n, 6))
                    .map(|f| f[1].to_string())
            })
            .unwrap_or_default()
    };
    Ok(Some(kube_meta(&name, namespace, pod)))
}

/// The `_`-separated fields of a kubelet-made name: `k8s_<pod>_<ns>_<uid>_<attempt>` for a
/// sandbox (n = 5), `k8s_<container>_<pod>_<ns>_<uid>_<attempt>` for a container (n = 6).
/// Kubernetes names never hold `_`, so the split is exact.
fn kubelet_name_fields(name: &str, n: usize) -> Option<Vec<&str>> {
    let fields: Vec<&str> = name.split('_').collect();
    (fields.len() == n && fields[0] == "k8s" && fields.iter().all(|f| !f.is_empty()))
        .then_some(fields)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::enrich::runtime_meta::test_support::*;

    #[test]
    fn containerd_container_of_a_deployment() {
        let got = from_oci_config(&fixture("containerd-container-nginx.json"))
            .ok()
            .flatten();
        assert_eq!(
            got,
            Some(meta("nginx", "default", "nginx-7848d4b86f-xztfp", "nginx"))
        );
    }

    #[test]
    fn containerd_sandbox_is_named_pod() {
        let got = from_oci_config(&fixture("containerd-sandbox-aks.json"))
            .ok()
            .flatten();
        assert_eq!(
            got,
            Some(meta("POD", "develop", "web-with-logger", "web-with-logger"))
        );
    }

    #[test]
    fn crio_container_and_sandbox() {
        // crictl-made on CRI-O: no kubelet labels, so the CRI-O keys' fallbacks are exercised.
        let got = from_oci_config(&fixture("crio-container.json"))
            .ok()
            .flatten();
        assert_eq!(
            got,
            Some(meta(
                "podsandbox1-redis",
                "redhat.test.crio",
                "podsandbox1",
                "podsandbox1"
            ))
        );
        let got = from_oci_config(&fixture("crio-sandbox.json"))
            .ok()
            .flatten();
        assert_eq!(
            got,
            Some(meta(
                "POD",
                "redhat.test.crio",
                "podsandbox1",
                "podsandbox1"
            ))
        );
    }

    #[test]
    fn oci_config_without_kubernetes_annotations_is_none() {
        // podman's own config.json, captured here.
        assert_eq!(
            from_oci_config(&fixture("podman/web-2.config.json")).ok(),
            Some(None)
        );
        assert_eq!(
            from_oci_config(r#"{"ociVersion":"1.0.2"}"#).ok(),
            Some(None)
        );
        assert!(from_oci_config("{\"annotations\":").is_err());
        assert!(from_oci_config(r#"{"annotations":[1]}"#).is_err());
    }
}
