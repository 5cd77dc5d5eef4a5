//! Test-only crate: see the files under tests/.
