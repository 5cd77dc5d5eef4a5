//! The kernel matrix's runner (`cargo xtask kernels` boots it as part of each kernel's
//! initramfs, and runs it directly on this machine's kernel): every check of
//! `drainwatch_tests::matrix`, one `DWK-` line each on stdout.
//!
//! `kernel-matrix [FILTER]` runs the checks whose names contain FILTER (all without one) and
//! exits 0 only if every one passed (and at least one ran); `kernel-matrix serve PORT` is the
//! synthetic container's server (see `matrix::container`). The agent binary is
//! `DRAINWATCH_BIN` (else `target/release/drainwatch`).

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("serve") {
        let port = args.get(1).and_then(|p| p.parse().ok()).unwrap_or(8080);
        drainwatch_tests::matrix::container::serve(port);
    }
    if args.first().map(String::as_str) == Some("memlock-probe") {
        drainwatch_tests::matrix::memlock::probe();
    }
    let (passed, total) = drainwatch_tests::matrix::run(args.first().cloned());
    if total > 0 && passed == total {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
