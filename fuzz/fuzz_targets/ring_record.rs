//! Kernel ring-buffer records: `capture::event::decode`, every kind through one target. The
//! input's first u32 (little-endian) picks the kind, written into the record's header (the
//! rest of the input) so that every decoder is reached; the record as it is is decoded too
//! (unknown kinds, short headers). Names come from the 6.18 tracefs fixtures, as the agent
//! reads them from this kernel's formats.
#![no_main]

use std::sync::LazyLock;

use drainwatch::capture::{
    event::{Event, KernelNames, decode, record_kind},
    tracefs::Format,
};
use drainwatch_common::{EventKind, Header};
use libfuzzer_sys::fuzz_target;

static NAMES: LazyLock<KernelNames> = LazyLock::new(|| {
    let table = |text: &str, field: &str| {
        Format::parse(text)
            .map(|f| f.symbols(field))
            .unwrap_or_default()
    };
    KernelNames {
        rst_reasons: table(
            include_str!("../../agent/fixtures/tracefs/6.18/tcp_send_reset.format"),
            "reason",
        ),
        drop_reasons: table(
            include_str!("../../agent/fixtures/tracefs/6.18/kfree_skb.format"),
            "reason",
        ),
        tcp_states: table(
            include_str!("../../agent/fixtures/tracefs/6.18/inet_sock_set_state.format"),
            "newstate",
        ),
        states: Default::default(),
    }
});

const KIND_AT: usize = std::mem::offset_of!(Header, kind);

fuzz_target!(|data: &[u8]| {
    let names = &*NAMES;
    let Some((sel, record)) = data.split_first_chunk::<4>() else {
        return;
    };
    let kind = EventKind::ALL[u32::from_le_bytes(*sel) as usize % EventKind::ALL.len()];
    let mut record = record.to_vec();
    if let Some(k) = record.get_mut(KIND_AT..KIND_AT + 4) {
        k.copy_from_slice(&(kind as u32).to_ne_bytes());
    }
    for bytes in [&record[..], &data[4..], data] {
        let _ = record_kind(bytes);
        if let Ok(ev) = decode(bytes, names) {
            look_at(&ev);
        }
    }
});

/// What the pipeline reads first of every event.
fn look_at(ev: &Event) {
    let _ = (ev.meta(), ev.kind());
    match ev {
        Event::StateChange(s) => {
            let _ = (s.counters.request_pending(), s.counters.quiet_and_sending());
        }
        Event::Exit(e) => {
            let _ = e.status.shell_code();
        }
        _ => {}
    }
    let _ = format!("{ev:?}");
}
