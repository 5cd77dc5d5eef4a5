//! Kernel BTF (`/sys/kernel/btf/vmlinux`): btf-rs's parser over the bytes (what
//! `capture::btf::load` reads from the file), then the agent's walk of every struct member the
//! programs read (`kernel_offsets`: typedefs, qualifiers, anonymous unions, dotted paths).
#![no_main]

use btf_rs::Btf;
use drainwatch::capture::btf::{kernel_offsets, offset_of};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(btf) = Btf::from_bytes(data) else {
        return;
    };
    let _ = kernel_offsets(&btf);
    // Paths through several levels, and ones that cannot resolve.
    let _ = offset_of(
        &btf,
        "tcp_sock",
        "inet_conn.icsk_inet.sk.__sk_common.skc_num",
    );
    let _ = offset_of(&btf, "sock", "");
    let _ = offset_of(&btf, "sock", "..");
});
