//! Container runtimes' state files, JSON: the OCI runtime spec (containerd's and CRI-O's
//! `config.json`), Docker's `config.v2.json` and podman's `containers.json` (every id it
//! lists, and one it does not), with the naming rules they end in.
#![no_main]

use drainwatch::enrich::runtime_meta::{
    from_docker_config_v2, from_oci_config, from_podman, workload_from_container_name,
    workload_from_pod_name,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = from_oci_config(text);
    if let Ok(meta) = from_docker_config_v2(text) {
        let _ = workload_from_pod_name(&meta.pod);
    }
    let _ = from_podman(text, "", None);
    let ids: Vec<String> = serde_json::from_str::<serde_json::Value>(text)
        .ok()
        .as_ref()
        .and_then(serde_json::Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|c| c.get("id")?.as_str().map(str::to_string))
                .take(4)
                .collect()
        })
        .unwrap_or_default();
    for id in &ids {
        let _ = from_podman(text, id, None);
    }
    // The naming rules on raw text too (names come from labels and annotations).
    let _ = workload_from_pod_name(text);
    let _ = workload_from_container_name(text);
});
