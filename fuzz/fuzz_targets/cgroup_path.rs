//! cgroup paths (`/proc/<pid>/cgroup` lines, `cgroup_rmdir`'s path): which container or
//! service owns one, the choice of path from a whole `/proc/<pid>/cgroup` text, and the naming
//! of a systemd service owner (`runtime_meta::lookup` answers those without reading a file).
#![no_main]

use std::path::Path;

use drainwatch::enrich::{
    cgroup_path::{Runtime, container_path_from_proc_cgroup, parse_cgroup_path},
    runtime_meta,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let owners = [
        parse_cgroup_path(text),
        container_path_from_proc_cgroup(text).and_then(|p| parse_cgroup_path(&p)),
    ];
    for owner in owners.into_iter().flatten() {
        let _ = owner.runtime.as_str();
        // Only the answers that read no file: a systemd unit, or an id that is no path part.
        let readable_id = owner.id.len() == 64 && owner.id.bytes().all(|b| b.is_ascii_hexdigit());
        if owner.runtime == Runtime::Systemd || !readable_id {
            let _ = runtime_meta::lookup(Path::new("/nonexistent-drainwatch-fuzz"), &owner);
        }
    }
});
