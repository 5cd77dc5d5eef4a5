//! tracefs `format` files (`/sys/kernel/tracing/events/<cat>/<name>/format`): the parser, the
//! `__print_symbolic` tables (`Format::symbols`, what `KernelNames` is read from), and every
//! hook's field resolution over the parsed format, as `capture::resolve_tracepoints` runs them.
#![no_main]

use drainwatch::capture::{
    hooks,
    tracefs::{Format, Resolver},
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(fmt) = Format::parse(text) else {
        return;
    };
    // The tables the agent reads, and every field's own name as a table.
    for field in [
        "reason", "newstate", "oldstate", "state", "family", "protocol",
    ] {
        let _ = fmt.symbols(field);
        let _ = fmt.symbol_value(field, "TCP_LISTEN_OVERFLOW");
    }
    for f in &fmt.fields {
        let _ = fmt.symbols(&f.name);
    }
    // Every tracepoint of the common table resolves its fields from this one format.
    macro_rules! resolve_all {
        (
            kinds { $($_k:tt)* }
            tracepoints { $($category:ident / $stem:ident;)* }
        ) => {$({
            let mut r = Resolver::new(&fmt);
            let _ = hooks::$stem::fields(&mut r);
            let _ = r.addr();
        })*};
    }
    drainwatch_common::for_each_hook!(resolve_all);
});
