//! Pure: container metadata from podman's own state: containers/storage's `containers.json`
//! for the name, libpod's bolt database for the labels.

use serde_json::{Map, Value};

use super::{ContainerMeta, MetaError, SANDBOX_NAME, bolt, naming::local_meta};

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
    let Some(config) = bolt_state.and_then(|db| libpod_config(db, id)) else {
        return Ok(Some(local_meta(name, &Map::new())));
    };
    let mut meta = local_meta(name, &config.labels);
    // A podman pod's members: its infra container is the pod's sandbox, like the kubelet's
    // pause container (it holds the namespace and is stopped last).
    if let Some(pod) = config.pod {
        meta.pod = pod;
        if config.infra {
            meta.name = SANDBOX_NAME.to_string();
        }
    }
    Ok(Some(meta))
}

/// What libpod's database holds of a container.
struct LibpodConfig {
    labels: Map<String, Value>,
    /// The name of its pod, when it is in one.
    pod: Option<String>,
    /// It is its pod's infra container (libpod's `IsInfra`, `"pause"` in the JSON).
    infra: bool,
}

/// A container's config in podman's libpod database (bucket `ctr` → `<id>` → `config`), and
/// its pod's name (`pod` → `<pod id>` → `config`); None when unreadable.
fn libpod_config(db: &[u8], id: &str) -> Option<LibpodConfig> {
    let db = bolt::Db::open(db).ok()?;
    let config = db.get(&[b"ctr", id.as_bytes()], b"config").ok()??;
    let config: Value = serde_json::from_slice(config).ok()?;
    let pod = config
        .get("pod")
        .and_then(Value::as_str)
        .filter(|p| !p.is_empty())
        .map(|pod_id| {
            let name = db
                .get(&[b"pod", pod_id.as_bytes()], b"config")
                .ok()
                .flatten()
                .and_then(|c| serde_json::from_slice::<Value>(c).ok())
                .and_then(|c| Some(c.get("name")?.as_str()?.to_string()));
            // Unnamed (unreadable): its id still tells its members apart.
            name.unwrap_or_else(|| pod_id.to_string())
        });
    Some(LibpodConfig {
        labels: config
            .get("labels")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default(),
        pod,
        infra: config.get("pause").and_then(Value::as_bool) == Some(true),
    })
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

    #[test]
    fn a_podman_pods_infra_container_is_its_sandbox() {
        // Captured here: podman 4.3.1, `podman pod create --name shop-pod`, then
        // `podman create --pod shop-pod --name shop-web`.
        let containers = fixture("podman-pod/containers.json");
        let db = fixture_bytes("podman-pod/bolt_state.db");
        let infra = "2caeb4010e0e66db24251e96edd720864cd8ed894b8f01137d3cf3183f54f008";
        let web = "037eb29e79d9942775b58b0829fb123a8effd11aaade70de5354faa7d3f13fd4";
        let got = |id| from_podman(&containers, id, Some(&db)).ok().flatten();
        assert_eq!(
            got(infra),
            Some(meta("POD", "", "shop-pod", "f6c393311fbc-infra"))
        );
        assert_eq!(got(web), Some(meta("shop-web", "", "shop-pod", "shop-web")));
        // Without the database, no pod is known: the names alone.
        assert_eq!(
            from_podman(&containers, web, None).ok().flatten(),
            Some(meta("shop-web", "", "", "shop-web"))
        );
    }
}
