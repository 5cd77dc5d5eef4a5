//! Parser for tracefs `format` files (`/sys/kernel/tracing/events/<cat>/<name>/format`): field
//! offsets and sizes, and the symbol tables `__print_symbolic` embeds in `print fmt`, which give
//! this kernel's numbering of enums such as `sk_rst_reason` and `skb_drop_reason`.
//!
//! Hand-written: no maintained crate parses these files (libtraceevent is C).

use std::collections::BTreeMap;

use drainwatch_common::fields::{AddrFields, NO_FIELD};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FormatError {
    #[error("format file has no `name:` line")]
    NoName,
    #[error("malformed field line {line:?}: {why}")]
    BadField { line: String, why: &'static str },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    pub name: String,
    /// The C type as printed, e.g. `const void *`, `__u8[28]`, `__data_loc char[]`.
    pub c_type: String,
    pub offset: u16,
    pub size: u16,
    pub signed: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Format {
    pub name: String,
    pub id: Option<u32>,
    pub fields: Vec<Field>,
    pub print_fmt: String,
}

impl Format {
    pub fn parse(text: &str) -> Result<Self, FormatError> {
        let mut name = None;
        let mut id = None;
        let mut fields = Vec::new();
        let mut print_fmt = String::new();
        for line in text.lines() {
            let trimmed = line.trim();
            if let Some(v) = trimmed.strip_prefix("name:") {
                name = Some(v.trim().to_string());
            } else if let Some(v) = trimmed.strip_prefix("ID:") {
                id = v.trim().parse().ok();
            } else if trimmed.starts_with("field:") {
                fields.push(parse_field(trimmed)?);
            } else if let Some(v) = trimmed.strip_prefix("print fmt:") {
                print_fmt = v.trim().to_string();
            }
        }
        Ok(Self {
            name: name.ok_or(FormatError::NoName)?,
            id,
            fields,
            print_fmt,
        })
    }

    pub fn field(&self, name: &str) -> Option<&Field> {
        self.fields.iter().find(|f| f.name == name)
    }

    /// The numeric symbols `__print_symbolic(REC-><field>, { N, "NAME" }, ...)` lists. Entries
    /// whose value is a C identifier rather than a number are skipped: their value is not in
    /// the file.
    pub fn symbols(&self, field: &str) -> BTreeMap<u64, String> {
        let mut out = BTreeMap::new();
        let needle = format!("__print_symbolic(REC->{field},");
        let Some(start) = self.print_fmt.find(&needle) else {
            return out;
        };
        let mut rest = &self.print_fmt[start + needle.len()..];
        // Entries are `{ value, "NAME" }` until the closing parenthesis of the call.
        loop {
            rest = rest.trim_start_matches([' ', ',']);
            let Some(body) = rest.strip_prefix('{') else {
                break;
            };
            let Some(end) = body.find('}') else { break };
            let entry = &body[..end];
            rest = &body[end + 1..];
            let Some((value, label)) = entry.split_once(',') else {
                continue;
            };
            let value = value.trim();
            let parsed = match value.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16).ok(),
                None => value.parse().ok(),
            };
            if let Some(v) = parsed {
                out.insert(v, label.trim().trim_matches('"').to_string());
            }
        }
        out
    }

    /// The value of the symbol `name` in `field`'s table.
    pub fn symbol_value(&self, field: &str, name: &str) -> Option<u64> {
        self.symbols(field)
            .into_iter()
            .find_map(|(v, n)| (n == name).then_some(v))
    }
}

fn parse_field(line: &str) -> Result<Field, FormatError> {
    let bad = |why| FormatError::BadField {
        line: line.to_string(),
        why,
    };
    let mut decl = None;
    let mut offset = None;
    let mut size = None;
    let mut signed = false;
    for part in line.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        let (key, value) = part
            .split_once(':')
            .ok_or_else(|| bad("part without ':'"))?;
        match key {
            "field" => decl = Some(value.trim()),
            "offset" => offset = value.trim().parse::<u16>().ok(),
            "size" => size = value.trim().parse::<u16>().ok(),
            "signed" => signed = value.trim() == "1",
            _ => {}
        }
    }
    let decl = decl.ok_or_else(|| bad("no declaration"))?;
    let offset = offset.ok_or_else(|| bad("no numeric offset"))?;
    let size = size.ok_or_else(|| bad("no numeric size"))?;
    if offset == NO_FIELD {
        return Err(bad("offset out of range"));
    }
    // The name is the last token; an array suffix moves to the type (`__u8 saddr[28]`).
    let (ty, last) = decl
        .rsplit_once([' ', '*'])
        .ok_or_else(|| bad("no field name"))?;
    let (name, suffix) = match last.find('[') {
        Some(i) => (&last[..i], &last[i..]),
        None => (last, ""),
    };
    if name.is_empty() {
        return Err(bad("empty field name"));
    }
    let star = if decl[ty.len()..].starts_with('*') {
        " *"
    } else {
        ""
    };
    Ok(Field {
        name: name.to_string(),
        c_type: format!("{}{star}{suffix}", ty.trim()),
        offset,
        size,
        signed,
    })
}

/// Resolves the fields one program reads, remembering which ones this kernel lacks. A field the
/// program reads with a fixed width counts as missing if its size differs: reading it would be
/// silently wrong.
pub struct Resolver<'a> {
    fmt: &'a Format,
    pub missing_required: Vec<String>,
    pub missing_optional: Vec<String>,
}

impl<'a> Resolver<'a> {
    pub fn new(fmt: &'a Format) -> Self {
        Self {
            fmt,
            missing_required: Vec::new(),
            missing_optional: Vec::new(),
        }
    }

    fn lookup(&self, name: &str, size: u16) -> Option<u16> {
        self.fmt
            .field(name)
            .filter(|f| f.size == size)
            .map(|f| f.offset)
    }

    pub fn required(&mut self, name: &str, size: u16) -> u16 {
        self.lookup(name, size).unwrap_or_else(|| {
            self.missing_required.push(name.to_string());
            NO_FIELD
        })
    }

    pub fn optional(&mut self, name: &str, size: u16) -> u16 {
        self.lookup(name, size).unwrap_or_else(|| {
            self.missing_optional.push(name.to_string());
            NO_FIELD
        })
    }

    /// Whether the field exists with this size, without recording anything.
    pub fn has(&self, name: &str, size: u16) -> bool {
        self.lookup(name, size).is_some()
    }

    /// The address fields many tracepoints share: family, ports and IPv4 addresses are
    /// required, IPv6 addresses optional. Without `family` (5.10's reset tracepoints) the
    /// program tells it from the IPv6 fields (`fields::family_of_v6`), which must then exist.
    pub fn addr(&mut self) -> AddrFields {
        let family = if self.has("family", 2) || !self.has("saddr_v6", 16) {
            self.required("family", 2)
        } else {
            NO_FIELD
        };
        AddrFields {
            family,
            sport: self.required("sport", 2),
            dport: self.required("dport", 2),
            saddr: self.required("saddr", 4),
            daddr: self.required("daddr", 4),
            saddr_v6: self.optional("saddr_v6", 16),
            daddr_v6: self.optional("daddr_v6", 16),
            _pad: 0,
        }
    }

    pub fn format(&self) -> &Format {
        self.fmt
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub fn fixture(kernel: &str, name: &str) -> Format {
        let path = format!(
            "{}/fixtures/tracefs/{kernel}/{name}.format",
            env!("CARGO_MANIFEST_DIR")
        );
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        Format::parse(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    #[test]
    fn parses_6_18_send_reset_with_sockaddr_blobs_and_reason() {
        let f = fixture("6.18", "tcp_send_reset");
        assert_eq!(f.name, "tcp_send_reset");
        assert_eq!(f.id, Some(2280));
        let names: Vec<_> = f.fields.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "common_type",
                "common_flags",
                "common_preempt_count",
                "common_pid",
                "skbaddr",
                "skaddr",
                "state",
                "reason",
                "saddr",
                "daddr"
            ]
        );
        let saddr = f.field("saddr").unwrap();
        assert_eq!(
            (saddr.offset, saddr.size, saddr.c_type.as_str()),
            (32, 28, "__u8[28]")
        );
        let skaddr = f.field("skaddr").unwrap();
        assert_eq!(
            (skaddr.offset, skaddr.size, skaddr.c_type.as_str()),
            (16, 8, "const void *")
        );
        let reason = f.field("reason").unwrap();
        assert_eq!((reason.offset, reason.size), (28, 4));
        assert!(f.field("state").unwrap().signed);
    }

    #[test]
    fn parses_pre_6_10_send_reset_with_separate_ports() {
        let f = fixture("6.1", "tcp_send_reset");
        assert!(f.field("reason").is_none());
        assert_eq!(f.field("sport").unwrap().offset, 28);
        assert_eq!(f.field("saddr").unwrap().size, 4);
        assert_eq!(f.field("saddr_v6").unwrap().offset, 42);
        assert_eq!(f.field("daddr_v6").unwrap().offset, 58);
        // Its state table uses C identifiers: nothing numeric to learn from it.
        assert!(f.symbols("state").is_empty());
        assert_eq!(
            f.symbols("family").get(&10).map(String::as_str),
            Some("AF_INET6")
        );
    }

    #[test]
    fn reads_reset_reasons_and_drop_reasons_from_symbol_tables() {
        let send = fixture("6.18", "tcp_send_reset");
        let reasons = send.symbols("reason");
        assert_eq!(reasons.get(&1).map(String::as_str), Some("NO_SOCKET"));
        assert_eq!(
            reasons.get(&12).map(String::as_str),
            Some("TCP_ABORT_ON_LINGER")
        );
        assert_eq!(reasons.len(), 26);
        let skb = fixture("6.18", "kfree_skb");
        assert_eq!(skb.symbol_value("reason", "TCP_LISTEN_OVERFLOW"), Some(40));
        assert_eq!(skb.symbol_value("reason", "NO_SOCKET"), Some(3));
        let state = fixture("6.18", "inet_sock_set_state");
        assert_eq!(
            state.symbols("newstate").get(&1).map(String::as_str),
            Some("TCP_ESTABLISHED")
        );
        assert_eq!(state.symbols("newstate").len(), 12);
    }

    #[test]
    fn parses_data_loc_and_char_arrays() {
        let f = fixture("6.18", "cgroup_rmdir");
        let path = f.field("path").unwrap();
        assert_eq!(
            (path.offset, path.size, path.c_type.as_str()),
            (24, 4, "__data_loc char[]")
        );
        let sig = fixture("6.18", "signal_generate");
        let comm = sig.field("comm").unwrap();
        assert_eq!(
            (comm.offset, comm.size, comm.c_type.as_str()),
            (20, 16, "char[16]")
        );
        assert_eq!(sig.field("pid").unwrap().offset, 36);
    }

    #[test]
    fn resolver_records_missing_and_resized_fields() {
        let f = fixture("6.1", "tcp_send_reset");
        let mut r = Resolver::new(&f);
        assert_eq!(r.required("skaddr", 8), 16);
        assert_eq!(r.optional("reason", 4), NO_FIELD);
        // saddr exists but is 4 bytes here, not a 28-byte sockaddr.
        assert!(!r.has("saddr", 28));
        assert_eq!(r.required("saddr", 28), NO_FIELD);
        assert_eq!(r.missing_required, ["saddr"]);
        assert_eq!(r.missing_optional, ["reason"]);
    }

    #[test]
    fn without_family_the_ipv6_fields_tell_it() {
        // 5.10: no `family` in the reset tracepoints; IPv4 sockets' addresses are mapped into
        // saddr_v6, which the program reads for it.
        for name in ["tcp_send_reset", "tcp_receive_reset"] {
            let f = fixture("5.10", name);
            assert!(f.field("family").is_none());
            let mut r = Resolver::new(&f);
            let a = r.addr();
            assert_eq!(a.family, NO_FIELD, "{name}");
            assert_ne!(a.saddr_v6, NO_FIELD, "{name}");
            assert!(
                r.missing_required.is_empty() && r.missing_optional.is_empty(),
                "{name}"
            );
        }
        let f = fixture("6.1", "tcp_receive_reset");
        assert_eq!(Resolver::new(&f).addr().family, 20);
    }

    #[test]
    fn rejects_garbage_without_panicking() {
        assert_eq!(Format::parse("nothing here"), Err(FormatError::NoName));
        let err = Format::parse("name: x\n\tfield:int a;\toffset:zz;\tsize:4;\tsigned:1;\n");
        assert!(matches!(err, Err(FormatError::BadField { .. })));
        let err = Format::parse("name: x\n\tfield:;\toffset:1;\tsize:4;\tsigned:1;\n");
        assert!(matches!(err, Err(FormatError::BadField { .. })));
        let empty =
            Format::parse("name: x\nprint fmt: \"%d\", __print_symbolic(REC->a, { 1").unwrap();
        assert!(empty.symbols("a").is_empty());
    }
}
