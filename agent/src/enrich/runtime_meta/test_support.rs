//! Test support shared by the parsers' tests: the fixtures under `agent/fixtures/runtime/`
//! and the podman container ids they hold.

use super::ContainerMeta;

pub(super) fn fixture(name: &str) -> String {
    let path = format!("{}/fixtures/runtime/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

pub(super) fn fixture_bytes(name: &str) -> Vec<u8> {
    let path = format!("{}/fixtures/runtime/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

pub(super) fn meta(name: &str, namespace: &str, pod: &str, workload: &str) -> ContainerMeta {
    ContainerMeta {
        name: name.into(),
        namespace: namespace.into(),
        pod: pod.into(),
        workload: workload.into(),
    }
}

pub(super) const PODMAN_WEB: &str =
    "129bf6a9c38081e34c6565211c48068ff79bc11ddbccd067768ca64b035eb65c";
pub(super) const PODMAN_API: &str =
    "9ae4d580024f41a3ee6cdd658972c90da8b35c1b48fbccd72a4e8dcee2bfdc7a";
/// Created and removed in the same store before the fixture was taken: its config is
/// still in pages bbolt freed.
pub(super) const PODMAN_REMOVED: &str =
    "a23659ea44c7178cc25a2257ce55b04e7b557e1bd18a6b77651e955e75c22237";
