//! Texts under /proc, each through the parser the agent runs on it (all of them on every input:
//! coverage steers the fuzzer to the one a mutation feeds):
//! - `net/netstat`: `netstat::parse_listen_counters`;
//! - `net/fib_trie`: `host::local_ipv4_from_fib_trie`;
//! - `net/tcp{,6}`: `host::listening_prefix`, then procfs's table parser on that prefix (as
//!   `Procfs::listeners` does), and on the whole text (as `Procfs::sockets` does);
//! - `ns/net` link targets: `host::netns_inode`;
//! - `status` and `stat` (procfs's parsers, as `Procfs::process` and `start_ns` read them).
//!   `stat` only in the shape the kernel prints it (`<pid> (<comm>) <state> <numbers>…`, the
//!   comm up to 15 arbitrary bytes): procfs-core 0.18.0's `Stat::from_read` slices its text at
//!   byte offsets around the parentheses and panics on other shapes (fuzz/RESULTS.md), which
//!   no kernel writes.
#![no_main]

use drainwatch::enrich::{host, netstat};
use libfuzzer_sys::fuzz_target;
use procfs::{FromBufReadSI, FromRead};

fuzz_target!(|data: &[u8]| {
    let si = procfs::current_system_info();
    if let Ok(prefix) = host::listening_prefix(data) {
        let _ = procfs::net::TcpNetEntries::from_buf_read(prefix.as_bytes(), si);
    }
    let _ = procfs::net::TcpNetEntries::from_buf_read(data, si);
    let _ = procfs::process::Status::from_read(data);
    if kernel_shaped_stat(data) {
        let _ = procfs::process::Stat::from_read(data);
    }
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = netstat::parse_listen_counters(text);
    let _ = host::local_ipv4_from_fib_trie(text);
    let _ = host::netns_inode(text);
});

/// `<pid> (<comm>) <state> <fields>`, as `fs/proc/array.c` prints `/proc/<pid>/stat`: the comm
/// (at most 15 bytes, any bytes) is the only free text and the last `)` closes it; the state is
/// a letter and the fields that follow are numbers.
fn kernel_shaped_stat(data: &[u8]) -> bool {
    let digits = data.iter().take_while(|b| b.is_ascii_digit()).count();
    let Some(close) = data.iter().rposition(|b| *b == b')') else {
        return false;
    };
    let rest = &data[close + 1..];
    digits > 0
        && data.get(digits..digits + 2) == Some(&b" ("[..])
        && close >= digits + 2
        && close - (digits + 2) <= 15
        && rest.len() > 4
        && rest[0] == b' '
        && rest[1].is_ascii_alphabetic()
        && rest[2] == b' '
        && rest[3].is_ascii_digit()
        && rest[3..]
            .iter()
            .all(|b| b.is_ascii_digit() || b" -\n".contains(b))
}
