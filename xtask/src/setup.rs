//! `cargo xtask setup`: installs what a fresh Debian 12 machine (root, rustup's stable toolchain,
//! a C compiler, nothing else) lacks to build, run and test drainwatch. Every step checks first,
//! so a second run installs nothing. What running the agent needs (`Purpose::Run`: tracefs, LLVM,
//! the nightly toolchain, bpf-linker) is a subset: `cargo xtask run` installs only that, the
//! lab's packages (podman, proxies, Prometheus, Chromium, the deploy tools) come with `test`,
//! `demo` and the other lab commands (with the Socket.IO lab's npm packages: `npm ci`, pinned by
//! its lock file).

mod containers;
// The lab subnets and their fallback routes, one list with the tests' (std only). The route
// check is the labs' own: setup and the bench only install the fallbacks.
#[allow(dead_code)]
#[path = "../../tests/src/lab/net.rs"]
pub(crate) mod lab_net;
mod node;
mod packages;
mod toolchain;
mod tracefs;

pub(crate) use packages::apt;

use std::time::Instant;

use anyhow::Result;

use crate::secs;

/// What the machine is set up for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Purpose {
    /// Build and run the agent (`cargo xtask run`).
    Run,
    /// Everything: also the tests, the demo and the labs (their containers, proxies,
    /// Prometheus, Chromium, QEMU, the deploy tools).
    Test,
}

/// Every step for `Test`; a failing step has printed why and stops the rest.
pub fn run() -> Result<(), ()> {
    run_for(Purpose::Test)
}

/// The steps `purpose` needs, in order; a failing step has printed why and stops the rest.
pub fn run_for(purpose: Purpose) -> Result<(), ()> {
    let t = Instant::now();
    let lab = purpose == Purpose::Test;
    step("tracefs", tracefs::tracefs)?;
    step("apt", || packages::apt(packages::APT_BUILD))?;
    if lab {
        step("apt (tests and labs)", || packages::apt(packages::APT_LAB))?;
        step("busybox image", containers::busybox_image)?;
        step("podman", containers::podman_check)?;
        step("lab routes", containers::lab_routes)?;
        step("containerd service", containers::containerd_service)?;
    }
    step("rust nightly", toolchain::nightly)?;
    step("rust-src", || {
        toolchain::nightly_component("rust-src", "for -Z build-std=core")
    })?;
    if lab {
        step("nightly clippy", || {
            toolchain::nightly_component("clippy", "the eBPF crate's lints")
        })?;
    }
    step("bpf-linker", toolchain::bpf_linker)?;
    if lab {
        step("pip", packages::pip)?;
        step("deploy tools", packages::deploy_tools)?;
        step("socket.io lab", node::socketio_lab)?;
    }
    println!("[setup] done for {purpose:?} ({})", secs(t.elapsed()));
    Ok(())
}

/// Runs one step: prints its outcome and how long it took, or why it failed.
fn step(name: &str, f: impl FnOnce() -> Result<String>) -> Result<(), ()> {
    let t = Instant::now();
    match f() {
        Ok(outcome) => {
            println!("[setup] {name}: {outcome} ({})", secs(t.elapsed()));
            Ok(())
        }
        Err(e) => {
            eprintln!("[setup] {name}: FAILED after {}: {e}", secs(t.elapsed()));
            for cause in e.chain().skip(1) {
                eprintln!("[setup]   caused by: {cause}");
            }
            Err(())
        }
    }
}

fn say(name: &str, what: &str) {
    println!("[setup] {name}: {what}");
}
