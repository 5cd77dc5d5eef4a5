//! A backend's own logs, read from its host directory: requests, lifecycle events, health
//! checks.

use std::{fs, time::Instant};

use super::{Backend, ConnEntry, LAB_AGENT, ServerEvent, WorkEntry};
use crate::lab::clock;

impl Backend {
    fn read_log(&self, file: &str) -> Vec<String> {
        let text = fs::read_to_string(self.log_dir.join(file)).unwrap_or_default();
        // Only complete lines: one being written has no newline yet.
        let complete = text.rfind('\n').map_or("", |i| &text[..i]);
        complete.lines().map(str::to_string).collect()
    }

    /// The request log, raw: `start <id> <ns>` and `end <id> <ns>` lines.
    pub fn log_lines(&self) -> Vec<String> {
        self.read_log("requests.log")
    }

    /// The request log, parsed.
    pub fn work_log(&self) -> Vec<WorkEntry> {
        self.log_lines()
            .iter()
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                let started = match f.next()? {
                    "start" => true,
                    "end" => false,
                    _ => return None,
                };
                let id = f.next()?.to_string();
                let ns: u64 = f.next()?.parse().ok()?;
                Some(WorkEntry {
                    started,
                    id,
                    at: clock::instant_of_mono_ns(ns),
                })
            })
            .collect()
    }

    /// The server's lifecycle events (events.log), parsed.
    pub fn events(&self) -> Vec<ServerEvent> {
        self.read_log("events.log")
            .iter()
            .filter_map(|l| {
                let mut f = l.splitn(3, ' ');
                let kind = f.next()?.to_string();
                let mono_ns: u64 = f.next()?.trim().parse().ok()?;
                Some(ServerEvent {
                    kind,
                    mono_ns,
                    at: clock::instant_of_mono_ns(mono_ns),
                    detail: f.next().unwrap_or("").trim().to_string(),
                })
            })
            .collect()
    }

    /// The connections the server accepted, in order: each `conn-open` paired with the next
    /// `conn-close` of the same peer port, a check when a health log line of that port falls
    /// between them.
    pub fn connections(&self) -> Vec<ConnEntry> {
        let checks: Vec<(u64, u64)> = self
            .read_log("health.log")
            .iter()
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                Some((f.get(1)?.parse().ok()?, f.get(4)?.parse().ok()?))
            })
            .collect();
        let events = self.events();
        let port = |e: &ServerEvent| e.detail.parse::<u64>().ok();
        events
            .iter()
            .enumerate()
            .filter(|(_, e)| e.kind == "conn-open")
            .filter_map(|(i, open)| {
                let p = port(open)?;
                let close = events[i + 1..]
                    .iter()
                    .find(|e| e.kind == "conn-close" && port(e) == Some(p));
                let end = close.map_or(u64::MAX, |c| c.mono_ns);
                Some(ConnEntry {
                    opened: open.at,
                    closed: close.map(|c| c.at),
                    check: checks
                        .iter()
                        .any(|&(ns, cp)| cp == p && ns >= open.mono_ns && ns <= end),
                })
            })
            .collect()
    }

    /// When the first event of `kind` happened, if it did.
    pub fn event_at(&self, kind: &str) -> Option<Instant> {
        self.events()
            .into_iter()
            .find(|e| e.kind == kind)
            .map(|e| e.at)
    }

    /// Every `GET /health` the server answered except the lab's own probes (HAProxy's checks,
    /// in practice): when, and the status it gave.
    pub fn health_checks(&self) -> Vec<(Instant, u16)> {
        self.read_log("health.log")
            .iter()
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                (f.next()? == "health").then_some(())?;
                let ns: u64 = f.next()?.parse().ok()?;
                let status: u16 = f.next()?.parse().ok()?;
                (f.next() != Some(LAB_AGENT)).then_some(())?;
                Some((clock::instant_of_mono_ns(ns), status))
            })
            .collect()
    }
}
