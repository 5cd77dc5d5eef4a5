//! nginx's access log in the lab's format (`log_format lab` in the template): one line per
//! request, parsed.

use std::{net::SocketAddr, time::Duration};

/// One line of the lab's access log (`log_format lab` in the template): one per request,
/// written by the worker when the request ends.
#[derive(Clone, Debug, PartialEq)]
pub struct AccessEntry {
    /// `$msec`: Unix time in seconds (ms resolution) when the line was written.
    pub msec: f64,
    /// `$pid`: the worker that served the request (and opened its upstream connections).
    pub pid: u32,
    /// `$connection`: the worker's serial number of the client connection.
    pub connection: u64,
    /// `$remote_addr:$remote_port`: the client's side of its connection to nginx.
    pub client: Option<SocketAddr>,
    /// `$request_method`.
    pub method: String,
    /// `$arg_id`: the `id` query argument (the lab's request id), if any.
    pub id: Option<String>,
    /// `$status`: what the client got.
    pub status: u16,
    /// `$upstream_addr`: every upstream tried, in order (`ip:port`; the upstream group's name
    /// `be` when no server was available). Empty when nginx answered by itself.
    pub upstream_addrs: Vec<String>,
    /// `$upstream_status`, one per try (`None` where nginx wrote `-`). A try cut before the
    /// response headers shows as 502, a connect timeout as 504.
    pub upstream_statuses: Vec<Option<u16>>,
    /// `$request_time`: from the first byte read from the client to the log line.
    pub request_time: Duration,
    /// `$upstream_connect_time`, one per try.
    pub upstream_connect_times: Vec<Option<Duration>>,
    /// `$upstream_header_time`, one per try (`None` for a try that got no headers).
    pub upstream_header_times: Vec<Option<Duration>>,
    /// `$upstream_response_time`, one per try (for a cut try: until the cut was seen).
    pub upstream_response_times: Vec<Option<Duration>>,
    /// `$request_id`: nginx's own 32-hex id of the request.
    pub request_id: String,
    /// `$request`: the request line.
    pub request: String,
}

fn dash(v: &str) -> Option<&str> {
    (!v.is_empty() && v != "-").then_some(v)
}

/// An `$upstream_*` list: ", " between tries, " : " between internal redirects.
fn list(v: &str) -> Vec<&str> {
    if dash(v).is_none() {
        return Vec::new();
    }
    v.split(" : ").flat_map(|g| g.split(", ")).collect()
}

fn secs(v: &str) -> Option<Duration> {
    dash(v)?.parse::<f64>().ok().map(Duration::from_secs_f64)
}

impl AccessEntry {
    /// Parses one line of the lab's log format; `None` for anything else.
    pub fn parse(line: &str) -> Option<AccessEntry> {
        let f: Vec<&str> = line.split('\t').collect();
        if f.len() != 15 {
            return None;
        }
        Some(AccessEntry {
            msec: f[0].parse().ok()?,
            pid: f[1].parse().ok()?,
            connection: f[2].parse().ok()?,
            client: f[3].parse().ok(),
            method: f[4].to_string(),
            id: dash(f[5]).map(str::to_string),
            status: f[6].parse().ok()?,
            upstream_addrs: list(f[7]).into_iter().map(str::to_string).collect(),
            upstream_statuses: list(f[8]).into_iter().map(|s| s.parse().ok()).collect(),
            request_time: secs(f[9])?,
            upstream_connect_times: list(f[10]).into_iter().map(secs).collect(),
            upstream_header_times: list(f[11]).into_iter().map(secs).collect(),
            upstream_response_times: list(f[12]).into_iter().map(secs).collect(),
            request_id: f[13].to_string(),
            request: f[14].to_string(),
        })
    }

    /// Whether nginx tried more than one upstream for this request.
    pub fn retried(&self) -> bool {
        self.upstream_addrs.len() > 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_retried_request() {
        // A real line of nginx 1.22.1: tried 18081 (cut before the headers), then 18082.
        let line = "1795993740.756\t27122\t6\t127.0.0.1:33762\tGET\tx3\t200\t\
                    127.0.0.1:18081, 127.0.0.1:18082\t502, 200\t1.414\t0.000, 0.000\t\
                    -, 1.004\t0.410, 1.004\tfcd13bd51cc60b9dca19210d4813bc2d\t\
                    GET /work?id=x3 HTTP/1.1";
        let e = AccessEntry::parse(line).unwrap();
        assert_eq!(e.pid, 27122);
        assert_eq!(e.connection, 6);
        assert_eq!(e.client, Some("127.0.0.1:33762".parse().unwrap()));
        assert_eq!(e.id.as_deref(), Some("x3"));
        assert_eq!(e.status, 200);
        assert_eq!(e.upstream_addrs, ["127.0.0.1:18081", "127.0.0.1:18082"]);
        assert_eq!(e.upstream_statuses, [Some(502), Some(200)]);
        assert_eq!(e.request_time, Duration::from_millis(1414));
        assert_eq!(
            e.upstream_header_times,
            [None, Some(Duration::from_millis(1004))]
        );
        assert_eq!(
            e.upstream_response_times[0],
            Some(Duration::from_millis(410))
        );
        assert!(e.retried());
        assert_eq!(e.request, "GET /work?id=x3 HTTP/1.1");
    }

    #[test]
    fn parses_a_local_answer_and_rejects_other_lines() {
        let line =
            "1.000\t1\t2\t127.0.0.1:1\tGET\t-\t200\t-\t-\t0.000\t-\t-\t-\tab\tGET / HTTP/1.1";
        let e = AccessEntry::parse(line).unwrap();
        assert_eq!(e.id, None);
        assert!(e.upstream_addrs.is_empty() && e.upstream_statuses.is_empty());
        assert!(!e.retried());
        assert_eq!(
            AccessEntry::parse("2026/11/29 23:08:58 [notice] start"),
            None
        );
    }
}
