//! Builds the eBPF programs (agent-ebpf) with aya-build and the nightly toolchain, so the
//! object can be embedded in the binary. `cargo xtask setup` installs what this needs.

use anyhow::{Context as _, anyhow};

fn main() -> anyhow::Result<()> {
    let manifest = std::env::var("CARGO_MANIFEST_DIR").context("CARGO_MANIFEST_DIR")?;
    let ebpf_dir = std::path::Path::new(&manifest)
        .parent()
        .ok_or_else(|| anyhow!("agent/ has no parent"))?
        .join("agent-ebpf");
    let root_dir = ebpf_dir.to_str().ok_or_else(|| anyhow!("non-UTF-8 path"))?;
    println!(
        "cargo:rerun-if-changed={}",
        ebpf_dir.join("../common/src").display()
    );
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "drainwatch-ebpf",
            root_dir,
            ..Default::default()
        }],
        aya_build::Toolchain::default(),
    )
}
