//! The lifecycle programs' log (agent-ebpf/src/fault.rs) on each kernel: a cgroup path longer
//! than a record holds is a real fault of the cgroup-removal program (`path_truncated`). Each
//! plan that loaded that program counts it once, as before, and logs it once through aya-log
//! (its first on the CPU, and the plan's maps are fresh): the log map was set up, and the
//! programs that write to it passed this kernel's verifier.

use std::time::{Duration, Instant};

use drainwatch::capture::ebpf_log::EbpfLog;
use drainwatch_common::faults::FaultKind;

use super::Loaded;

pub fn check(loaded: &mut [Loaded]) -> String {
    let mut plans: Vec<(&mut Loaded, EbpfLog, u64, u64)> = loaded
        .iter_mut()
        .filter(|l| l.chosen("cgroup_removals").is_some())
        .map(|l| {
            let mut log =
                l.h.capture
                    .take_log()
                    .unwrap_or_else(|e| panic!("{}: the eBPF log: {e}", l.variant.name));
            let records = log.drain().expect("decodable records");
            let faults = l.h.fault_count(FaultKind::PathTruncated);
            (l, log, records, faults)
        })
        .collect();
    assert!(
        !plans.is_empty(),
        "no plan loaded the cgroup-removal program"
    );
    crate::remove_cgroups_one_too_long();
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut out = Vec::new();
    for (l, log, records_before, faults_before) in &mut plans {
        let faults = l.h.fault_count(FaultKind::PathTruncated) - *faults_before;
        let records = loop {
            let n = log.drain().expect("decodable records") - *records_before;
            if n > 0 || Instant::now() > deadline {
                break n;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        assert_eq!(
            (faults, records),
            (1, 1),
            "{}: (path_truncated faults, log records) after one cut path",
            l.variant.name
        );
        out.push(format!(
            "{}: 1 fault counted, 1 record logged",
            l.variant.name
        ));
    }
    out.join("; ")
}
