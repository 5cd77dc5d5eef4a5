//! Kubernetes pod objects as the API server serves them (JSON, one `Pod`: the items of a list
//! and the objects of watch events are seeded one by one), deserialized as kube-runtime does,
//! then the agent's pure core: `pod_record` (with `workload` and `container_id`) and the
//! store's answers for every container id and pod uid, across a relist and a deletion.
//! (Only `Pod`: each wrapper type would add a build of the whole Pod deserializer.)
#![no_main]

use drainwatch::enrich::kube::{Store, WatchEvent, container_id, pod_record, workload};
use k8s_openapi::api::core::v1::Pod;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(pod) = serde_json::from_slice::<Pod>(data) else {
        return;
    };
    let _ = workload(&pod);
    let Ok(r) = pod_record(&pod) else {
        return;
    };
    let mut store = Store::new(1_000);
    store.apply(0, WatchEvent::Init);
    store.apply(1, WatchEvent::InitApply(r.clone()));
    store.apply(2, WatchEvent::InitDone);
    store.apply(3, WatchEvent::Apply(r.clone()));
    for c in &r.containers {
        for id in &c.ids {
            let _ = container_id(id);
            let _ = store.lookup(id, Some(&r.uid));
            let _ = store.lookup(id, None);
        }
    }
    let _ = store.lookup("", Some(&r.uid));
    store.apply(4, WatchEvent::Delete(r));
    let _ = (store.deleted(""), store.live_pods());
    store.expire(5_000);
    let _ = (store.synced(), store.generation(), store.live_pods());
});
