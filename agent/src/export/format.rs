//! Numbers and times as people read them, shared by the verdicts, `drainwatch report` and the
//! deploy page so that all three write `2,000 clients`, `3.8 s` and `22:47:28.358` alike.

use std::time::UNIX_EPOCH;

/// `2,000`: thousands separated, as people read counts.
pub fn thousands(x: u64) -> String {
    let digits = x.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `1 request`, `2 requests`, `2,000 clients`.
pub fn count(x: u64, one: &str, many: &str) -> String {
    format!("{} {}", thousands(x), if x == 1 { one } else { many })
}

/// Seconds as people say them: `3.8`, `10`, `0.004`.
pub fn secs(x: f64) -> String {
    if x.abs() < 0.1 && x != 0.0 {
        return format!("{x:.3}");
    }
    let s = format!("{x:.1}");
    s.strip_suffix(".0").map_or(s.clone(), str::to_string)
}

/// A rate: whole numbers from 10 up, one decimal below.
pub fn rate(x: f64) -> String {
    if x >= 10.0 {
        thousands(x.round() as u64)
    } else {
        format!("{x:.1}")
    }
}

/// Rounded up to a tenth: a window advice must not fall short of the evidence.
pub fn ceil_tenth(x: f64) -> f64 {
    // The small epsilon keeps 4.2000000001 (float noise) from becoming 4.3.
    (x * 10.0 - 1e-6).ceil() / 10.0
}

/// `+1.25 s`, `−0.5 s`: a time relative to the stop signal.
pub fn rel(x: f64) -> String {
    let sign = if x < 0.0 { "−" } else { "+" };
    format!("{sign}{} s", secs(x.abs()))
}

/// An optional number as the API's JSON spells it: `null` when absent.
pub fn or_null(x: Option<i32>) -> String {
    x.map_or_else(|| "null".into(), |x| x.to_string())
}

/// `SIGTERM`, or `signal 10` for one without a common name.
pub fn signal_name(sig: i32) -> String {
    match sig {
        2 => "SIGINT".into(),
        3 => "SIGQUIT".into(),
        9 => "SIGKILL".into(),
        15 => "SIGTERM".into(),
        other => format!("signal {other}"),
    }
}

/// Seconds since the epoch of an RFC 3339 time from the API.
pub fn epoch(t: &str) -> Option<f64> {
    let at = humantime::parse_rfc3339(t).ok()?;
    Some(at.duration_since(UNIX_EPOCH).ok()?.as_secs_f64())
}

/// `22:47:28.358` from an RFC 3339 time.
pub fn hms(t: &str) -> &str {
    t.split_once('T')
        .map_or(t, |(_, r)| r.trim_end_matches('Z'))
}

/// `2026-11-29 22:47:28` from an RFC 3339 time.
pub fn date_time(t: &str) -> String {
    let t = t.trim_end_matches('Z');
    let t = t.split_once('.').map_or(t, |(a, _)| a);
    t.replacen('T', " ", 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_read_as_people_write_them() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(1234567), "1,234,567");
        assert_eq!(secs(3.8), "3.8");
        assert_eq!(secs(10.0), "10");
        assert_eq!(secs(0.0042), "0.004");
        assert_eq!(secs(0.0), "0");
        assert_eq!(ceil_tenth(4.164), 4.2);
        assert_eq!(ceil_tenth(4.2), 4.2);
    }
}
