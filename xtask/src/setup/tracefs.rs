//! The tracefs step: drainwatch reads tracepoint formats from tracefs, mounted here if absent.

use std::{path::Path, process::Command};

use anyhow::{Context as _, Result, ensure};

use super::say;
use crate::run_cmd;

const TRACEFS: &str = "/sys/kernel/tracing";

pub(super) fn tracefs() -> Result<String> {
    let events = Path::new(TRACEFS).join("events");
    if events.is_dir() {
        return Ok(format!("present ({} exists)", events.display()));
    }
    say("tracefs", &format!("mounting tracefs at {TRACEFS}"));
    run_cmd(Command::new("mount").args(["-t", "tracefs", "nodev", TRACEFS]))
        .with_context(|| format!("could not mount tracefs at {TRACEFS}, which drainwatch needs to read tracepoint formats"))?;
    ensure!(
        events.is_dir(),
        "tracefs is mounted at {TRACEFS} but has no events/ directory, so this kernel offers no tracepoints"
    );
    Ok(format!("mounted tracefs at {TRACEFS}"))
}
