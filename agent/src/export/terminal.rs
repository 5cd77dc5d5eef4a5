//! What `drainwatch report` may print: names come from containers, pods and namespaces whoever
//! deploys chooses, so a name carrying terminal escapes (ESC [ …, OSC 52 clipboard writes), a
//! carriage return or a newline could rewrite or forge lines in the reader's terminal.

use std::borrow::Cow;

use serde_json::Value;

/// `s` without control characters (C0, DEL, C1) and without the Unicode bidirectional
/// overrides and isolates that reorder what a line appears to say.
pub fn printable(s: &str) -> Cow<'_, str> {
    let bad =
        |c: char| c.is_control() || matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}');
    if s.chars().any(bad) {
        Cow::Owned(s.chars().filter(|c| !bad(*c)).collect())
    } else {
        Cow::Borrowed(s)
    }
}

/// Makes every string of an answer printable, before it becomes a view: one place for every
/// field, those added later included.
pub fn clean(v: &mut Value) {
    match v {
        Value::String(s) => {
            if let Cow::Owned(p) = printable(s) {
                *s = p;
            }
        }
        Value::Array(a) => a.iter_mut().for_each(clean),
        Value::Object(o) => {
            // Keys are field names, or container names in maps of them: cleaned too.
            let entries = std::mem::take(o);
            for (k, mut val) in entries {
                clean(&mut val);
                o.insert(printable(&k).into_owned(), val);
            }
        }
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strips_escapes_newlines_and_bidi_overrides() {
        assert_eq!(printable("nginx-7d9f"), "nginx-7d9f");
        assert!(matches!(printable("web"), Cow::Borrowed(_)));
        assert_eq!(printable("\u{1b}[2J\u{1b}[31mevil"), "[2J[31mevil");
        assert_eq!(
            printable("a\u{1b}]52;c;ZWNobyBoaQ==\u{7}b"),
            "a]52;c;ZWNobyBoaQ==b"
        );
        assert_eq!(printable("ok\r\nSTOP forged\tx"), "okSTOP forgedx");
        assert_eq!(printable("del\u{7f}c1\u{9b}"), "delc1");
        assert_eq!(printable("abc\u{202E}fed\u{2066}"), "abcfed");
        assert_eq!(printable("ünïcødé-名前"), "ünïcødé-名前");
    }

    #[test]
    fn cleans_every_string_of_an_answer() {
        let mut v = serde_json::json!([{
            "container": {"name": "x\u{1b}[1A", "namespace": "ns\n"},
            "loss": {"refused": 3},
            "per_container": {"a\u{1b}b": 1},
            "ok": true
        }]);
        clean(&mut v);
        assert_eq!(
            v,
            serde_json::json!([{
                "container": {"name": "x[1A", "namespace": "ns"},
                "loss": {"refused": 3},
                "per_container": {"ab": 1},
                "ok": true
            }])
        );
    }

    /// `drainwatch report`'s fetch, with a token, from an agent whose answer carries a hostile
    /// name.
    #[test]
    fn report_reads_names_without_their_escapes() {
        use std::io::{Read, Write};
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let server = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            // The client may write the request in pieces: read to the end of its head.
            let mut head = Vec::new();
            let mut buf = [0u8; 1024];
            while !head.ends_with(b"\r\n\r\n") {
                let n = s.read(&mut buf).unwrap();
                assert!(n > 0, "closed before the end of the head");
                head.extend_from_slice(&buf[..n]);
            }
            let request = String::from_utf8_lossy(&head).to_string();
            assert!(
                request.contains("\r\nAuthorization: Bearer t0k\r\n"),
                "{request}"
            );
            let body = r#"["web\u001b]0;pwned\u0007\r\nDEPLOY fake"]"#;
            write!(
                s,
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )
            .unwrap();
        });
        let names: Vec<String> =
            super::super::report::fetch(&addr, "/api/v1/x", Some("t0k\n")).unwrap();
        server.join().unwrap();
        assert_eq!(names, ["web]0;pwnedDEPLOY fake"]);
    }
}
