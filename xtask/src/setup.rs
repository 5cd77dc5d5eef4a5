//! `cargo xtask setup`: installs what a fresh Debian 12 machine (root, rustup's stable toolchain,
//! nothing else) lacks to build, run and test drainwatch. Every step checks first, so a second run
//! installs nothing.

mod containers;
mod packages;
mod toolchain;
mod tracefs;

pub(crate) use packages::install_apt;

use std::time::Instant;

use anyhow::Result;

use crate::secs;

/// Runs every step in order; a failing step has printed why and stops the rest.
pub fn run() -> Result<(), ()> {
    let t = Instant::now();
    step("tracefs", tracefs::tracefs)?;
    step("apt", packages::apt)?;
    step("busybox image", containers::busybox_image)?;
    step("podman", containers::podman_check)?;
    step("rust nightly", toolchain::nightly)?;
    step("rust-src", toolchain::rust_src)?;
    step("bpf-linker", toolchain::bpf_linker)?;
    step("pip", packages::pip)?;
    step("deploy tools", packages::deploy_tools)?;
    println!("[setup] done ({})", secs(t.elapsed()));
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
