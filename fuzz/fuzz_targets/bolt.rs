//! The bbolt reader (`runtime_meta::bolt`, podman's `bolt_state.db`): opening the file and
//! looking values up through nested buckets, directly and as `from_podman` does (the config of
//! a container `containers.json` lists, then its labels as JSON).
#![no_main]

use std::sync::LazyLock;

use drainwatch::enrich::runtime_meta::{bolt::Db, from_podman};
use libfuzzer_sys::fuzz_target;

/// The `containers.json` captured with the seed database (agent/fixtures/runtime/podman/).
const CONTAINERS: &str = include_str!("../../agent/fixtures/runtime/podman/containers.json");

/// The ids it lists, and one it does not.
static IDS: LazyLock<Vec<String>> = LazyLock::new(|| {
    let mut ids: Vec<String> = serde_json::from_str::<serde_json::Value>(CONTAINERS)
        .ok()
        .as_ref()
        .and_then(serde_json::Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|c| c.get("id")?.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    ids.push("0".repeat(64));
    ids
});

fuzz_target!(|data: &[u8]| {
    if let Ok(db) = Db::open(data) {
        let _ = db.get(&[], b"ctr");
        let _ = db.get(&[b"ctr"], b"config");
        let _ = db.get(&[b"ctr", b"", b"x"], b"");
        for id in IDS.iter() {
            let _ = db.get(&[b"ctr", id.as_bytes()], b"config");
            let _ = db.get(&[b"ctr", id.as_bytes()], b"state");
        }
    }
    // Once: each call parses containers.json again, which is not what is fuzzed here.
    let _ = from_podman(CONTAINERS, &IDS[0], Some(data));
});
