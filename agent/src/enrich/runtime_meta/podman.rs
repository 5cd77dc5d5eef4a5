//! Pure: container metadata from podman's own state: containers/storage's `containers.json`
//! for the name, libpod's bolt database for the labels.

use serde_json::{Map, Value};

use super::{ContainerMeta, MetaError, bolt, naming::local_meta};

/// Pure: podman's own state for a container.
///
/// podman 4.x keeps the name in containers/storage's `containers.json` (a JSON array of
/// `{"id", "names": [...]}`; the OCI `config.json` it writes carries neither name nor labels)
/// and the labels only in its libpod database `bolt_state.db` (bucket `ctr` → `<id>` →
/// `config`, the container's JSON config). Pass the database when it is readable: labels are
/// only used for the Compose service, so a missing, newer (podman 5's SQLite `db.sql`) or
/// torn database costs the workload label, never the name. None when `id` is not in
/// `containers.json`.
pub fn from_podman(
    containers_json: &str,
    id: &str,
    bolt_state: Option<&[u8]>,
) -> Result<Option<ContainerMeta>, MetaError> {
    let containers: Value = serde_json::from_str(containers_json)?;
    let containers = containers
        .as_array()
        .ok_or(MetaError::Shape("containers.json is not an array"))?;
    let Some(entry) = containers
        .iter()
        .find(|c| c.get("id").and_then(Value::as_str) == Some(id))
    else {
        return Ok(None);
    };
    let name = entry
        .get("names")
        .and_then(Value::as_array)
        .and_then(|names| names.first())
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let labels = bolt_state
        .and_then(|db| podman_labels(db, id))
        .unwrap_or_default();
    Ok(Some(local_meta(name, &labels)))
}

/// The labels podman's libpod database holds for a container, None when unreadable.
fn podman_labels(db: &[u8], id: &str) -> Option<Map<String, Value>> {
    let config = bolt::Db::open(db)
        .ok()?
        .get(&[b"ctr", id.as_bytes()], b"config")
        .ok()??;
    let config: Value = serde_json::from_slice(config).ok()?;
    config.get("labels")?.as_object().cloned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::enrich::runtime_meta::test_support::*;

    #[test]
    fn podman_name_and_labels_from_the_state_captured_here() {
        let containers = fixture("podman/containers.json");
        let db = fixture_bytes("podman/bolt_state.db");
        assert_eq!(
            from_podman(&containers, PODMAN_WEB, Some(&db))
                .ok()
                .flatten(),
            Some(meta("web-2", "", "", "web"))
        );
        // `shop_api_1` with com.docker.compose.service=api: the label wins over the name.
        assert_eq!(
            from_podman(&containers, PODMAN_API, Some(&db))
                .ok()
                .flatten(),
            Some(meta("shop_api_1", "", "", "api"))
        );
        // Without the database: the name still decides.
        assert_eq!(
            from_podman(&containers, PODMAN_API, None).ok().flatten(),
            Some(meta("shop_api_1", "", "", "shop_api"))
        );
        assert_eq!(
            from_podman(&containers, PODMAN_REMOVED, Some(&db)).ok(),
            Some(None)
        );
    }
}
