//! The deploy page the agent serves at `/`: recent deploys, newest first, each opening to its
//! stops drawn on one time axis (SIGTERM, routing lag, listener close, drain or cut, exit or
//! SIGKILL, cgroup removal, the grace period as a band, every loss where it happened), the
//! reconnect storms that followed, and the verdict with its fix (`verdict.rs`, shared with
//! `drainwatch report`).
//!
//! Pure: the report API's JSON in (the same values `/api/v1/*` serve), an HTML string out.
//! Server-rendered HTML with inline SVG and CSS, no external assets, relative URLs only, so it
//! works offline and through `kubectl port-forward` or a path-prefix proxy. One small
//! same-origin script (`page.js`) re-renders it in place when the data changes. Every string
//! that comes from a container (names, ids, addresses) is attacker-controlled and escaped.

use std::time::UNIX_EPOCH;

use serde_json::Value;

use super::verdict::{self, Level, secs, thousands};

/// What the page says about where it runs.
#[derive(Debug, Clone, Default)]
pub struct PageInfo {
    pub host: String,
    pub version: String,
    /// Wall-clock time of rendering, RFC 3339.
    pub rendered_at: String,
}

/// How many of the newest deploys are shown open (in-progress ones always are).
pub const OPEN_DEPLOYS: usize = 3;

/// The same-origin script the page loads (served at `page.js`): every few seconds it fetches
/// the page again and, when the data changed (`data-state`), swaps `<main>` in place, keeping
/// the sections the reader opened or closed. No library, no external request.
pub const SCRIPT: &str = r#"// drainwatch deploy page: re-render in place when the agent's data changes.
(function () {
  function every() { return Number(document.body.dataset.refresh) || 10000; }
  async function poll() {
    try {
      if (!document.hidden) {
        const r = await fetch(location.href, { cache: "no-store" });
        const doc = new DOMParser().parseFromString(await r.text(), "text/html");
        if (doc.body.dataset.state && doc.body.dataset.state !== document.body.dataset.state) {
          const open = new Map();
          for (const d of document.querySelectorAll("details[data-key]")) open.set(d.dataset.key, d.open);
          for (const d of doc.querySelectorAll("details[data-key]")) {
            if (open.has(d.dataset.key)) d.open = open.get(d.dataset.key);
          }
          document.getElementById("main").replaceWith(doc.getElementById("main"));
          document.body.dataset.state = doc.body.dataset.state;
          document.body.dataset.refresh = doc.body.dataset.refresh;
        }
        const u = doc.getElementById("updated");
        if (u) document.getElementById("updated").textContent = u.textContent;
      }
    } catch (e) { /* the agent restarts or the port-forward dropped: try again later */ }
    setTimeout(poll, every());
  }
  setTimeout(poll, every());
})();
"#;

/// HTML-escapes text and attribute values (`&`, `<`, `>`, `"`, `'`).
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn s<'a>(v: &'a Value, k: &str) -> &'a str {
    v.get(k).and_then(Value::as_str).unwrap_or("")
}

fn n(v: &Value, k: &str) -> u64 {
    v.get(k).and_then(Value::as_u64).unwrap_or(0)
}

fn f(v: &Value, k: &str) -> Option<f64> {
    v.get(k).and_then(Value::as_f64)
}

/// Seconds since the epoch of an RFC 3339 time from the API.
fn epoch(t: &str) -> Option<f64> {
    let at = humantime::parse_rfc3339(t).ok()?;
    Some(at.duration_since(UNIX_EPOCH).ok()?.as_secs_f64())
}

fn time_of(v: &Value, k: &str) -> Option<f64> {
    epoch(v.get(k)?.as_str()?)
}

/// `22:47:28.358` from an RFC 3339 time.
fn hms(t: &str) -> &str {
    t.split_once('T')
        .map_or(t, |(_, r)| r.trim_end_matches('Z'))
}

/// `2026-11-29 22:47:28` from an RFC 3339 time.
fn date_time(t: &str) -> String {
    let t = t.trim_end_matches('Z');
    let t = t.split_once('.').map_or(t, |(a, _)| a);
    t.replacen('T', " ", 1)
}

/// `+1.25 s`, `−0.5 s`: a time relative to the stop signal.
fn rel(x: f64) -> String {
    let sign = if x < 0.0 { "−" } else { "+" };
    format!("{sign}{} s", secs(x.abs()))
}

fn signal_name(sig: i64) -> String {
    match sig {
        2 => "SIGINT".into(),
        3 => "SIGQUIT".into(),
        9 => "SIGKILL".into(),
        15 => "SIGTERM".into(),
        other => format!("signal {other}"),
    }
}

/// The loss kinds the page shows, in order: field, chip label, CSS class.
const LOSS_KINDS: [(&str, &str, &str); 7] = [
    ("inflight_cut", "in-flight cut", "cut"),
    ("retry_duplicates", "retried (done twice)", "retried"),
    ("upstream_aborts", "seen as 502", "abort"),
    ("refused", "refused", "refused"),
    ("unreachable", "unreachable", "unreachable"),
    ("accepted_after_sigterm", "accepted after SIGTERM", "late"),
    ("idle_closed", "idle closed", "idle"),
];

/// Loss chips: one per non-zero kind, each with its field name for machines.
fn chips(loss: &Value) -> String {
    let mut out = String::new();
    for (k, label, class) in LOSS_KINDS {
        let v = n(loss, k);
        if v > 0 {
            out += &format!(
                r#"<span class="chip {class}" data-loss="{k}"><b>{}</b> {label}</span>"#,
                thousands(v)
            );
        }
    }
    if out.is_empty() {
        out = r#"<span class="chip none">nothing lost</span>"#.into();
    }
    out
}

fn outcome_level(outcome: Option<&str>) -> Level {
    match outcome {
        None => Level::Pending,
        Some("drained") => Level::Good,
        Some(_) => Level::Bad,
    }
}

fn outcome_label(outcome: Option<&str>) -> String {
    outcome.map_or("stopping".into(), |o| o.replace('_', " "))
}

/// The worst outcome of a deploy, for its badge: pending, then bad, then good.
fn deploy_badge(d: &Value) -> (Level, String) {
    let outcomes: Vec<(&String, u64)> = d["outcomes"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| (k, v.as_u64().unwrap_or(0)))
        .collect();
    if n(d, "in_progress") > 0 {
        return (Level::Pending, format!("{} stopping", n(d, "in_progress")));
    }
    let order = [
        "crashed",
        "killed_at_deadline",
        "exit_at_once",
        "listener_closed_early",
        "drained",
    ];
    for o in order {
        if let Some((_, c)) = outcomes.iter().find(|(k, _)| k.as_str() == o) {
            let label = outcome_label(Some(o));
            let label = if outcomes.len() > 1 || *c > 1 {
                format!("{c} {label}")
            } else {
                label
            };
            return (outcome_level(Some(o)), label);
        }
    }
    (Level::Pending, "no stops".into())
}

/// A short FNV-1a hash: the page's `data-state`, which changes when its data does.
fn fnv(text: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// Renders the whole page. `deploys`, `stops` and `storms` are the values `/api/v1/deploys`,
/// `/api/v1/stops` and `/api/v1/storms` serve.
pub fn render(deploys: &Value, stops: &Value, storms: &Value, info: &PageInfo) -> String {
    let main = render_main(deploys, stops, storms);
    let in_progress = deploys
        .as_array()
        .into_iter()
        .flatten()
        .any(|d| n(d, "in_progress") > 0);
    // Every 2 s while a container is stopping, every 10 s otherwise.
    let refresh = if in_progress { 2000 } else { 10000 };
    format!(
        r#"<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>drainwatch · {host}</title>
<style>{CSS}</style>
<script src="page.js" defer></script>
</head>
<body data-state="{state}" data-refresh="{refresh}">
<header>
<div class="brand"><span class="logo">drainwatch</span><span class="host">{host}</span></div>
<div class="tagline">what each deploy did to TCP connections, seen from the kernel</div>
<nav><span id="updated">updated {updated} UTC</span> · <a href="api/v1/deploys">deploys</a> · <a href="api/v1/stops">stops</a> · <a href="api/v1/storms">storms</a> · <a href="metrics">metrics</a> · v{version}</nav>
</header>
{main}
</body>
</html>
"#,
        host = esc(&info.host),
        state = fnv(&main),
        updated = esc(hms(&info.rendered_at).split('.').next().unwrap_or("")),
        version = esc(&info.version),
    )
}

/// What the glyphs mean: each drawn by the same code as on the timelines.
fn legend() -> String {
    let items: [(&str, &str); 8] = [
        ("sigterm", "stop signal"),
        ("late", "accepted after it"),
        ("refused", "refused"),
        ("unreachable", "unreachable"),
        ("cut", "in-flight cut"),
        ("retried", "retried: done twice"),
        ("abort", "cut, seen as 502"),
        ("grace", "grace period, drain"),
    ];
    let mut out = String::from(r#"<div class="legend">"#);
    for (kind, label) in items {
        let w = if kind == "grace" { 24 } else { 16 };
        out += &format!(
            r#"<span><svg viewBox="0 0 {w} 16" width="{w}" height="16" aria-hidden="true">{}</svg>{label}</span>"#,
            glyph(kind, if kind == "grace" { 9.0 } else { 8.0 }, 8.0)
        );
    }
    out + "</div>"
}

/// One loss glyph centred at (x, y).
fn glyph(kind: &str, x: f64, y: f64) -> String {
    match kind {
        "inflight_cut" | "cut" => format!(
            r#"<path class="g-cut" d="M{a:.1} {b:.1}L{c:.1} {d:.1}M{a:.1} {d:.1}L{c:.1} {b:.1}"/>"#,
            a = x - 4.5,
            b = y - 4.5,
            c = x + 4.5,
            d = y + 4.5
        ),
        "retry_duplicates" | "retried" => format!(
            r#"<circle class="g-retried" cx="{x:.1}" cy="{y:.1}" r="6"/><path class="g-retried" d="M{:.1} {:.1}l3 -3l1 4z"/>"#,
            x + 3.0,
            y - 5.0
        ),
        "upstream_aborts" | "abort" => format!(
            r#"<rect class="g-abort" x="{:.1}" y="{:.1}" width="8" height="8" transform="rotate(45 {x:.1} {y:.1})"/>"#,
            x - 4.0,
            y - 4.0
        ),
        "refused" => format!(r#"<circle class="g-refused" cx="{x:.1}" cy="{y:.1}" r="4"/>"#),
        "unreachable" => {
            format!(r#"<circle class="g-unreachable" cx="{x:.1}" cy="{y:.1}" r="4"/>"#)
        }
        "accepted_after_sigterm" | "late" => format!(
            r#"<rect class="g-late" x="{:.1}" y="{:.1}" width="2.5" height="12"/>"#,
            x - 1.25,
            y - 6.0
        ),
        "sigterm" => format!(
            r#"<rect class="g-sigterm" x="{:.1}" y="{:.1}" width="2.5" height="16"/>"#,
            x - 1.25,
            y - 8.0
        ),
        "grace" => format!(
            r#"<rect class="grace" x="{:.1}" y="{:.1}" width="18" height="12" rx="2"/><rect class="drain good" x="{:.1}" y="{:.1}" width="9" height="12" rx="2"/>"#,
            x - 5.0,
            y - 6.0,
            x - 5.0,
            y - 6.0
        ),
        _ => String::new(),
    }
}

fn render_main(deploys: &Value, stops: &Value, storms: &Value) -> String {
    let deploys: Vec<&Value> = deploys.as_array().into_iter().flatten().collect();
    let stops: Vec<&Value> = stops.as_array().into_iter().flatten().collect();
    let storms: Vec<&Value> = storms.as_array().into_iter().flatten().collect();
    let mut out = String::from("<main id=\"main\">\n");
    if deploys.is_empty() {
        out += r#"<section class="empty"><h2>No container stops seen yet</h2><p>Every container this agent sees stop (a rolling deploy, <code>podman stop</code>, a crash) shows up here with what it cost: stop one, or run <code>cargo xtask demo</code> to see every failure mode.</p></section>"#;
        out += "\n</main>";
        return out;
    }
    let total_stops: usize = deploys
        .iter()
        .map(|d| d["stops"].as_array().map_or(0, Vec::len))
        .sum();
    out += &format!(
        r#"<div class="overview"><span>{} · {}{}</span>{}</div>"#,
        plural(deploys.len() as u64, "deploy", "deploys"),
        plural(total_stops as u64, "container stop", "container stops"),
        if storms.is_empty() {
            String::new()
        } else {
            format!(
                " · {}",
                plural(storms.len() as u64, "reconnect storm", "reconnect storms")
            )
        },
        legend()
    );
    let mut shown_storms = vec![false; storms.len()];
    for (i, d) in deploys.iter().enumerate() {
        let ids: Vec<&str> = d["stops"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let (level, badge) = deploy_badge(d);
        let open = i < OPEN_DEPLOYS || n(d, "in_progress") > 0;
        let ns = s(d, "namespace");
        out += &format!(
            r#"<details class="deploy {lvl}" data-key="{key}" data-stops="{nstops}" data-in-progress="{inprog}"{open}>
<summary><span class="badge {lvl}">{badge}</span><span class="workload">{workload}</span>{ns}<span class="when">{when} UTC · {stops}{revisions}</span><span class="chips">{chips}</span></summary>
"#,
            lvl = level.as_str(),
            key = esc(s(d, "id")),
            nstops = ids.len(),
            inprog = n(d, "in_progress"),
            open = if open { " open" } else { "" },
            badge = esc(&badge),
            workload = esc(s(d, "workload")),
            ns = [s(d, "workload_kind"), ns]
                .iter()
                .filter(|x| !x.is_empty())
                .map(|x| format!(r#"<span class="ns">{}</span>"#, esc(x)))
                .collect::<String>(),
            revisions = {
                let revs: Vec<String> = d["revisions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .map(esc)
                    .collect();
                if revs.is_empty() {
                    String::new()
                } else {
                    format!(" · replaced revision {}", revs.join(", "))
                }
            },
            when = esc(&date_time(s(d, "started_at"))),
            stops = plural(ids.len() as u64, "stop", "stops"),
            chips = chips(&d["loss"]),
        );
        for id in &ids {
            if let Some(stop) = stops.iter().find(|x| s(x, "id") == *id) {
                out += &render_stop(stop);
            }
        }
        for (j, st) in storms.iter().enumerate() {
            let ours = match st.get("deploy_id").and_then(Value::as_str) {
                Some(dep) => dep == s(d, "id"),
                None => ids.contains(&s(st, "stop_id")),
            };
            if ours && !shown_storms[j] {
                shown_storms[j] = true;
                out += &render_storm(st);
            }
        }
        out += "</details>\n";
    }
    let orphans: Vec<&&Value> = storms
        .iter()
        .zip(&shown_storms)
        .filter(|(_, shown)| !**shown)
        .map(|(st, _)| st)
        .collect();
    if !orphans.is_empty() {
        out += r#"<details class="deploy good" data-key="storms" open><summary><span class="workload">Reconnect storms</span><span class="when">after stops no longer listed</span></summary>"#;
        for st in orphans {
            out += &render_storm(st);
        }
        out += "</details>\n";
    }
    out += "</main>";
    out
}

fn plural(x: u64, one: &str, many: &str) -> String {
    format!("{} {}", thousands(x), if x == 1 { one } else { many })
}

/// Geometry of a timeline: seconds relative to the stop signal → x in the SVG.
struct Axis {
    lo: f64,
    hi: f64,
    left: f64,
    right: f64,
}

impl Axis {
    fn x(&self, t: f64) -> f64 {
        let t = t.clamp(self.lo, self.hi);
        self.left + (t - self.lo) / (self.hi - self.lo) * (self.right - self.left)
    }

    /// Tick positions: a round step giving at most ten ticks.
    fn ticks(&self) -> (f64, Vec<f64>) {
        let span = self.hi - self.lo;
        let steps = [
            0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 15.0,
            30.0, 60.0, 120.0, 300.0, 600.0,
        ];
        let step = steps
            .into_iter()
            .find(|s| span / s <= 10.0)
            .unwrap_or(1200.0);
        let mut t = (self.lo / step).ceil() * step;
        let mut out = Vec::new();
        while t <= self.hi + 1e-9 && out.len() < 40 {
            out.push(t);
            t += step;
        }
        (step, out)
    }
}

/// A vertical marker on the timeline: when, its label, its class.
struct Marker {
    at: f64,
    label: String,
    class: &'static str,
}

const W: f64 = 960.0;
const GUTTER: f64 = 112.0;
const PAD_RIGHT: f64 = 28.0;
const LABEL_ROW: f64 = 15.0;
const LABEL_ROWS: usize = 3;

fn render_stop(stop: &Value) -> String {
    let outcome = stop.get("outcome").and_then(Value::as_str);
    let v = verdict::stop(stop);
    let c = &stop["container"];
    let id12: String = s(c, "id").chars().take(12).collect();
    let listener_closed = stop["listeners"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|l| l.get("closed_at").and_then(Value::as_str))
        .min()
        .unwrap_or("");
    let attr = |k: &str| esc(s(stop, k));
    let num = |k: &str| f(stop, k).map_or(String::new(), |x| x.to_string());
    let events = stop["loss_events"].as_array().map_or(0, Vec::len);
    let pod = s(c, "pod");
    let ns = s(c, "namespace");
    let mut out = format!(
        r#"<article class="stop" id="stop-{sid}" data-stop-id="{sid}" data-container-id="{cid}" data-outcome="{outcome}" data-sigterm-at="{term}" data-sigkill-at="{kill}" data-exit-at="{exit}" data-cgroup-removed-at="{cg}" data-listener-closed-at="{lc}" data-drain-seconds="{drain}" data-routing-lag-seconds="{lag}" data-loss-events="{events}">
<h3><span class="badge {lvl}">{outcome_label}</span><span class="cname">{name}</span><span class="cmeta">{runtime} {id12}{pod}</span></h3>
<p class="verdict {vlvl}" data-level="{vlvl}">{verdict}</p>
"#,
        sid = attr("id"),
        cid = esc(s(c, "id")),
        outcome = esc(outcome.unwrap_or("")),
        term = attr("sigterm_at"),
        kill = attr("sigkill_at"),
        exit = attr("exit_at"),
        cg = attr("cgroup_removed_at"),
        lc = esc(listener_closed),
        drain = num("drain_seconds"),
        lag = num("routing_lag_seconds"),
        lvl = outcome_level(outcome).as_str(),
        outcome_label = esc(&outcome_label(outcome)),
        name = esc(s(c, "name")),
        runtime = esc(s(c, "runtime")),
        id12 = esc(&id12),
        pod = if pod.is_empty() {
            String::new()
        } else {
            let node = s(c, "node");
            format!(
                " · pod {}{}{}",
                if ns.is_empty() {
                    String::new()
                } else {
                    esc(ns) + "/"
                },
                esc(pod),
                if node.is_empty() {
                    String::new()
                } else {
                    format!(" on {}", esc(node))
                }
            )
        },
        vlvl = v.level.as_str(),
        verdict = esc(&v.text),
    );
    out += &timeline(stop);
    out += &facts(stop);
    out += "</article>\n";
    out
}

/// The facts under a stop's timeline, with times relative to the stop signal.
fn facts(stop: &Value) -> String {
    let origin = time_of(stop, "sigterm_at").or_else(|| time_of(stop, "exit_at"));
    let at = |k: &str| -> Option<String> {
        let t = time_of(stop, k)?;
        Some(match origin {
            Some(o) => rel(t - o),
            None => hms(s(stop, k)).to_string(),
        })
    };
    let mut rows: Vec<(String, String)> = Vec::new();
    if let Some(t) = stop.get("sigterm_at").and_then(Value::as_str) {
        let sender = &stop["sigterm_sender"];
        rows.push((
            "stop signal".into(),
            format!(
                "{} UTC from {} (pid {}) · {} open",
                esc(hms(t)),
                esc(s(sender, "comm")),
                n(sender, "pid"),
                plural(
                    n(stop, "connections_at_sigterm"),
                    "connection",
                    "connections"
                )
            ),
        ));
    }
    if let Some(last) = at("last_accept_at") {
        rows.push(("last accepted".into(), last));
    }
    for l in stop["listeners"].as_array().into_iter().flatten() {
        let when = l
            .get("closed_at")
            .and_then(Value::as_str)
            .and_then(epoch)
            .zip(origin)
            .map_or("still open".into(), |(t, o)| {
                format!("closed {}", rel(t - o))
            });
        rows.push((
            "listener".into(),
            format!("{} {when}", esc(s(l, "address"))),
        ));
    }
    if let Some(k) = at("sigkill_at") {
        rows.push(("SIGKILL".into(), k));
    }
    if let Some(e) = at("exit_at") {
        // Numbers only: nothing here needs escaping.
        let code = stop["exit_code"]
            .as_i64()
            .map_or("?".to_string(), |c| c.to_string());
        let how = match stop["exit_signal"].as_i64() {
            Some(sig) => format!("killed by {} (code {})", signal_name(sig), code),
            None => format!("code {code}"),
        };
        rows.push((
            "exit".into(),
            format!(
                "{e} · {how} · {} still open",
                plural(n(stop, "connections_at_exit"), "connection", "connections")
            ),
        ));
    }
    // What the pod spec allowed (Kubernetes API), when known.
    if let Some(g) = stop["grace_configured_seconds"].as_i64() {
        rows.push(("grace period".into(), format!("{g} s configured")));
    }
    if let Some(p) = stop["prestop"].as_bool() {
        rows.push(("preStop hook".into(), if p { "yes" } else { "none" }.into()));
    }
    if let Some(d) = f(stop, "drain_seconds") {
        let grace = f(stop, "grace_configured_seconds").or_else(|| f(stop, "grace_seconds"));
        let text = match grace {
            Some(g) if g > 0.0 => format!(
                "{} s of {} s grace ({:.0}%)",
                secs(d),
                secs(g),
                (d / g * 100.0).min(999.0)
            ),
            _ => format!("{} s", secs(d)),
        };
        rows.push(("drain".into(), text));
    }
    if let Some(r) = f(stop, "routing_lag_seconds") {
        rows.push((
            "routing lag".into(),
            format!("{} s after the stop signal", secs(r)),
        ));
    }
    if let Some(c) = at("cgroup_removed_at") {
        rows.push(("cgroup removed".into(), c));
    }
    let resets: u64 = stop["loss"]["resets_sent"]
        .as_object()
        .map_or(0, |m| m.values().filter_map(Value::as_u64).sum());
    if resets > 0 {
        let reasons: Vec<String> = stop["loss"]["resets_sent"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(k, v)| format!("{} {}", v, esc(k)))
            .collect();
        rows.push(("resets sent".into(), reasons.join(", ")));
    }
    let mut out = String::from(r#"<div class="facts"><div class="loss">"#);
    out += &chips(&stop["loss"]);
    out += "</div><dl>";
    for (k, v) in rows {
        out += &format!("<div><dt>{k}</dt><dd>{v}</dd></div>");
    }
    out += "</dl></div>\n";
    out
}

/// The stop's timeline as inline SVG: three lanes (connections routed to it, the process, the
/// loss) on one axis of seconds from the stop signal.
fn timeline(stop: &Value) -> String {
    let Some(origin) = time_of(stop, "sigterm_at").or_else(|| time_of(stop, "exit_at")) else {
        return String::new();
    };
    let rel_of = |k: &str| time_of(stop, k).map(|t| t - origin);
    let has_term = stop.get("sigterm_at").and_then(Value::as_str).is_some();
    let exit = rel_of("exit_at");
    let kill = rel_of("sigkill_at");
    let cgroup = rel_of("cgroup_removed_at");
    let lag = f(stop, "routing_lag_seconds");
    let grace = f(stop, "grace_configured_seconds").or_else(|| f(stop, "grace_seconds"));
    let closes: Vec<f64> = stop["listeners"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|l| epoch(l.get("closed_at")?.as_str()?))
        .map(|t| t - origin)
        .collect();
    let events: Vec<(f64, String)> = stop["loss_events"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| {
            Some((
                epoch(e.get("at")?.as_str()?)? - origin,
                s(e, "kind").to_string(),
            ))
        })
        .collect();
    let last_accept = rel_of("last_accept_at");

    // The domain: everything that happened, from a little before the stop signal.
    let mut times: Vec<f64> = vec![0.0];
    times.extend(exit);
    times.extend(kill);
    times.extend(cgroup);
    times.extend(lag);
    times.extend(closes.iter().copied());
    times.extend(events.iter().map(|e| e.0));
    let mut hi = times.iter().copied().fold(0.0, f64::max);
    let mut lo = times.iter().copied().fold(0.0, f64::min);
    // A grace period that ends not far beyond the rest is drawn whole; a long one runs off the
    // right edge rather than squashing what happened.
    let grace_whole = grace.is_some_and(|g| g <= (hi * 1.6).max(1.0));
    if let Some(g) = grace.filter(|_| grace_whole) {
        hi = hi.max(g);
    }
    // The last accept before the signal, if it was recent, shows how busy it was.
    let accept_shown = last_accept.filter(|a| *a < 0.0 && *a >= -hi.max(0.05) * 0.25);
    if let Some(a) = accept_shown {
        lo = lo.min(a);
    }
    let span = (hi - lo).max(0.5);
    let axis = Axis {
        lo: lo - span * 0.04,
        hi: hi + span * 0.06,
        left: GUTTER,
        right: W - PAD_RIGHT,
    };

    let top = LABEL_ROWS as f64 * LABEL_ROW + 6.0;
    let lane_h = 30.0;
    // The routed lane is taller: its band's label sits under the glyphs.
    let traffic_h = 40.0;
    let gap = 8.0;
    let traffic_y = top;
    let process_y = traffic_y + traffic_h + gap;
    let loss_y = process_y + lane_h + gap;
    let bottom = loss_y + lane_h;
    let height = bottom + 24.0;
    let mut svg = format!(
        r#"<svg class="timeline" viewBox="0 0 {W} {height:.0}" role="img" aria-label="stop timeline">"#
    );
    // Lanes.
    for (y, h, label, sub) in [
        (traffic_y, traffic_h, "routed to it", count_routed(&events)),
        (process_y, lane_h, "process", String::new()),
        (loss_y, lane_h, "lost", count_lost(&events)),
    ] {
        let mid = y + h / 2.0;
        svg += &format!(
            r#"<rect class="lane" x="{GUTTER}" y="{y:.1}" width="{:.1}" height="{h}" rx="3"/><text class="lane-label" x="{:.1}" y="{:.1}">{label}</text>"#,
            W - PAD_RIGHT - GUTTER,
            GUTTER - 8.0,
            mid + if sub.is_empty() { 4.0 } else { -2.0 },
        );
        if !sub.is_empty() {
            svg += &format!(
                r#"<text class="lane-sub" x="{:.1}" y="{:.1}">{sub}</text>"#,
                GUTTER - 8.0,
                mid + 10.0
            );
        }
    }
    // Ticks.
    let (step, ticks) = axis.ticks();
    let decimals = if step >= 1.0 {
        0
    } else if step >= 0.1 {
        1
    } else if step >= 0.01 {
        2
    } else {
        3
    };
    for t in ticks {
        let x = axis.x(t);
        svg += &format!(
            r#"<line class="tick" x1="{x:.1}" y1="{top:.1}" x2="{x:.1}" y2="{bottom:.1}"/><text class="tick-label" x="{x:.1}" y="{:.1}">{}</text>"#,
            bottom + 15.0,
            if t.abs() < step / 2.0 {
                "0".to_string()
            } else {
                format!(
                    "{}{:.*} s",
                    if t > 0.0 { "+" } else { "−" },
                    decimals,
                    t.abs()
                )
            }
        );
    }
    // Process lane: the grace band, and the part of it the drain used.
    let x0 = axis.x(0.0);
    if let Some(g) = grace.filter(|_| has_term) {
        let xg = axis.x(g);
        svg += &format!(
            r#"<rect class="grace" x="{x0:.1}" y="{:.1}" width="{:.1}" height="{:.1}" rx="3"/>"#,
            process_y + 3.0,
            (xg - x0).max(1.0),
            lane_h - 6.0
        );
        let label = if grace_whole {
            format!("grace {} s", secs(g))
        } else {
            format!("grace {} s →", secs(g))
        };
        svg += &format!(
            r#"<text class="band-label" x="{:.1}" y="{:.1}" text-anchor="end">{label}</text>"#,
            xg - 5.0,
            process_y + 19.0
        );
    }
    if let (Some(e), true) = (exit, has_term) {
        let xe = axis.x(e);
        let level = outcome_level(stop.get("outcome").and_then(Value::as_str));
        svg += &format!(
            r#"<rect class="drain {}" x="{x0:.1}" y="{:.1}" width="{:.1}" height="{:.1}" rx="3"/>"#,
            level.as_str(),
            process_y + 3.0,
            (xe - x0).max(2.0),
            lane_h - 6.0
        );
        let label = format!("drain {} s", secs(e.max(0.0)));
        let width = label.len() as f64 * 6.6;
        if xe - x0 > width + 10.0 {
            svg += &format!(
                r#"<text class="band-label on-drain" x="{:.1}" y="{:.1}">{label}</text>"#,
                x0 + 6.0,
                process_y + 19.0
            );
        }
    }
    // Routed lane: the routing lag band, then every connection routed to it (glyphs in its
    // upper part, the band's label under them).
    let glyph_y = traffic_y + 13.0;
    if let Some(l) = lag.filter(|l| *l > 0.0) {
        let xl = axis.x(l);
        svg += &format!(
            r#"<rect class="lag" x="{x0:.1}" y="{:.1}" width="{:.1}" height="{:.1}" rx="3"/>"#,
            traffic_y + 3.0,
            (xl - x0).max(1.0),
            traffic_h - 6.0
        );
        let label = format!("routing continued {} s", secs(l));
        let width = label.chars().count() as f64 * 6.4;
        let (x, anchor) = if xl - x0 > width + 12.0 {
            (x0 + 6.0, "start")
        } else if xl + 6.0 + width < W - PAD_RIGHT {
            (xl + 6.0, "start")
        } else {
            (xl - 6.0, "end")
        };
        svg += &format!(
            r#"<text class="band-label" x="{x:.1}" y="{:.1}" text-anchor="{anchor}">{label}</text>"#,
            traffic_y + traffic_h - 7.0
        );
    }
    if let Some(a) = accept_shown {
        svg += &glyph("late", axis.x(a), glyph_y).replace("g-late", "g-accept");
    }
    // Loss glyphs at (nearly) the same moment stack vertically instead of hiding each other;
    // what a proxy made of a cut sits just after the cut.
    let mut stacked: Vec<(f64, f64, usize)> = Vec::new();
    for (t, kind) in &events {
        let proxy_outcome = matches!(kind.as_str(), "retry_duplicates" | "upstream_aborts");
        let mut x = axis.x(*t) + if proxy_outcome { 11.0 } else { 0.0 };
        let y = match kind.as_str() {
            "accepted_after_sigterm" | "refused" | "unreachable" => glyph_y,
            _ => {
                let lane = loss_y + lane_h / 2.0;
                let k = stacked
                    .iter()
                    .position(|(sx, sy, _)| (sx - x).abs() < 3.0 && *sy == lane);
                let nth = match k {
                    Some(i) => {
                        stacked[i].2 += 1;
                        x = stacked[i].0;
                        stacked[i].2
                    }
                    None => {
                        stacked.push((x, lane, 0));
                        0
                    }
                };
                // 0, above, below, then on top of each other (the lane's count says how many).
                lane + [0.0, -8.0, 8.0][nth.min(2)]
            }
        };
        svg += &format!(
            "<g><title>{} {}</title>{}</g>",
            esc(&kind.replace('_', " ")),
            rel(*t),
            glyph(kind, x, y)
        );
    }
    let dropped = n(stop, "loss_events_dropped");
    if dropped > 0 {
        svg += &format!(
            r#"<text class="lane-sub" x="{:.1}" y="{:.1}" text-anchor="end">+{} not drawn</text>"#,
            W - PAD_RIGHT - 4.0,
            loss_y + lane_h - 4.0,
            thousands(dropped)
        );
    }
    // Markers across the lanes, labels in rows above so they never overlap.
    let mut markers: Vec<Marker> = Vec::new();
    if has_term {
        markers.push(Marker {
            at: 0.0,
            label: "SIGTERM".into(),
            class: "m-term",
        });
    }
    for c in &closes {
        markers.push(Marker {
            at: *c,
            label: "listener closed".into(),
            class: "m-listener",
        });
    }
    if let Some(k) = kill {
        markers.push(Marker {
            at: k,
            label: "SIGKILL".into(),
            class: "m-kill",
        });
    }
    if let Some(e) = exit {
        let label = match (stop["exit_signal"].as_i64(), stop["exit_code"].as_i64()) {
            (Some(sig), _) => format!("exit ({})", signal_name(sig)),
            (None, Some(code)) => format!("exit {code}"),
            _ => "exit".into(),
        };
        markers.push(Marker {
            at: e,
            label,
            class: "m-exit",
        });
    }
    if let Some(c) = cgroup {
        markers.push(Marker {
            at: c,
            label: "cgroup removed".into(),
            class: "m-cgroup",
        });
    }
    markers.sort_by(|a, b| a.at.total_cmp(&b.at));
    for m in &markers {
        let x = axis.x(m.at);
        svg += &format!(
            r#"<line class="marker {cls}" x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{bottom:.1}"/>"#,
            top - 3.0,
            cls = m.class,
        );
    }
    // Markers a few pixels apart share one label ("SIGTERM · exit · listener closed"), each
    // part in its marker's colour; labels go in rows so that none overlaps another.
    let mut groups: Vec<Vec<&Marker>> = Vec::new();
    for m in &markers {
        match groups.last_mut() {
            Some(g) if axis.x(m.at) - axis.x(g[0].at) < 8.0 => g.push(m),
            _ => groups.push(vec![m]),
        }
    }
    let mut row_end = [f64::MIN; LABEL_ROWS];
    for g in &groups {
        let x = axis.x(g[0].at);
        let text: usize = g.iter().map(|m| m.label.chars().count() + 3).sum();
        let width = text as f64 * 6.6 + 6.0;
        let right_side = x + width < W - 4.0;
        let (start, end) = if right_side {
            (x, x + width)
        } else {
            (x - width, x)
        };
        let row = (0..LABEL_ROWS)
            .find(|r| row_end[*r] < start)
            .unwrap_or(LABEL_ROWS - 1);
        row_end[row] = end;
        let y = (row + 1) as f64 * LABEL_ROW;
        let parts: Vec<String> = g
            .iter()
            .map(|m| format!(r#"<tspan class="{}">{}</tspan>"#, m.class, esc(&m.label)))
            .collect();
        svg += &format!(
            r#"<line class="marker-stem" x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{:.1}"/><text class="marker-label" x="{:.1}" y="{y:.1}" text-anchor="{}">{}</text>"#,
            y + 3.0,
            top - 3.0,
            if right_side { x + 3.0 } else { x - 3.0 },
            if right_side { "start" } else { "end" },
            parts.join(r#"<tspan class="sep"> · </tspan>"#),
        );
    }
    svg += "</svg>\n";
    svg
}

fn count_kinds(events: &[(f64, String)], kinds: &[(&str, &str)]) -> String {
    let mut parts = Vec::new();
    for (k, label) in kinds {
        let c = events.iter().filter(|e| e.1 == *k).count();
        if c > 0 {
            parts.push(format!("{c} {label}"));
        }
    }
    parts.join(", ")
}

fn count_routed(events: &[(f64, String)]) -> String {
    count_kinds(
        events,
        &[
            ("accepted_after_sigterm", "late"),
            ("refused", "refused"),
            ("unreachable", "unreach."),
        ],
    )
}

fn count_lost(events: &[(f64, String)]) -> String {
    count_kinds(
        events,
        &[
            ("inflight_cut", "cut"),
            ("retry_duplicates", "retried"),
            ("upstream_aborts", "as 502"),
        ],
    )
}

/// A reconnect storm: arrivals per 100 ms against the accept capacity measured while connections
/// queued, the observed window (95% back) beside the recommended one, the accept-path numbers.
fn render_storm(st: &Value) -> String {
    let v = verdict::storm(st);
    let buckets: Vec<u64> = st["arrivals_per_100ms"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_u64)
        .collect();
    let observed = f(st, "seconds_to_95_percent").unwrap_or(0.0);
    let recommended = f(st, "recommended_window_seconds");
    let rate = f(st, "sustained_accept_rate");
    let dur = buckets.len() as f64 * 0.1;
    let hi = dur.max(observed).max(recommended.unwrap_or(0.0)).max(0.5) * 1.04;
    let per_bucket_rate = rate.map(|r| r / 10.0);
    let ymax = (buckets.iter().copied().max().unwrap_or(1) as f64)
        .max(per_bucket_rate.unwrap_or(0.0))
        .max(1.0)
        * 1.15;
    let (left, right, top, plot_h) = (GUTTER, W - PAD_RIGHT, 10.0, 120.0);
    let x = |t: f64| left + t / hi * (right - left);
    let y = |c: f64| top + plot_h - c / ymax * plot_h;
    let height = top + plot_h + 70.0;
    let mut svg = format!(
        r#"<svg class="storm-chart" viewBox="0 0 {W} {height:.0}" role="img" aria-label="reconnect storm">"#
    );
    svg += &format!(
        r#"<rect class="lane" x="{left}" y="{top}" width="{:.1}" height="{plot_h}" rx="3"/><text class="lane-label" x="{:.1}" y="{:.1}">arrivals</text><text class="lane-sub" x="{:.1}" y="{:.1}">per 100 ms</text><line class="tick" x1="{left}" y1="{ytop:.1}" x2="{right:.1}" y2="{ytop:.1}"/><text class="tick-label" x="{:.1}" y="{:.1}" text-anchor="start">{}</text>"#,
        right - left,
        left - 8.0,
        top + 14.0,
        left - 8.0,
        top + 27.0,
        left + 4.0,
        y(ymax / 1.15) - 3.0,
        (ymax / 1.15).round(),
        ytop = y(ymax / 1.15),
    );
    let bw = (x(0.1) - x(0.0)).max(1.0);
    for (i, c) in buckets.iter().enumerate() {
        let t = i as f64 * 0.1;
        let over = per_bucket_rate.is_some_and(|r| *c as f64 > r);
        svg += &format!(
            r#"<rect class="bar{}" x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}"><title>{} arrivals at +{:.1} s</title></rect>"#,
            if over { " over" } else { "" },
            x(t) + 0.5,
            y(*c as f64),
            (bw - 1.0).max(0.8),
            (top + plot_h - y(*c as f64)).max(0.0),
            c,
            t
        );
    }
    if let (Some(r), Some(rate)) = (per_bucket_rate, rate) {
        let yr = y(r);
        svg += &format!(
            r#"<line class="rate" x1="{left}" y1="{yr:.1}" x2="{right:.1}" y2="{yr:.1}"/><text class="band-label rate-label" x="{:.1}" y="{:.1}" text-anchor="end">capacity {} accepts/s</text>"#,
            right - 4.0,
            yr - 4.0,
            thousands(rate.round() as u64)
        );
    }
    // Windows under the chart: observed, then recommended; each label beside its bar, or
    // inside it when the bar reaches the right edge.
    let window = |svg: &mut String, class: &str, wy: f64, until: f64, label: String| {
        let xe = x(until);
        let width = label.chars().count() as f64 * 6.4;
        let (lx, anchor, on) = if xe + 6.0 + width < right {
            (xe + 6.0, "start", "")
        } else {
            (xe - 6.0, "end", " on-drain")
        };
        *svg += &format!(
            r#"<rect class="win {class}" x="{left}" y="{wy:.1}" width="{:.1}" height="13" rx="2"/><text class="band-label{on}" x="{lx:.1}" y="{:.1}" text-anchor="{anchor}">{label}</text>"#,
            (xe - left).max(2.0),
            wy + 10.5,
        );
    };
    let wy = top + plot_h + 10.0;
    window(
        &mut svg,
        "observed",
        wy,
        observed,
        format!("95% back in {} s", secs(observed)),
    );
    if let Some(r) = recommended {
        window(
            &mut svg,
            "recommended",
            wy + 18.0,
            r,
            format!(
                "recommended window ≥ {} s",
                secs((r * 10.0 - 1e-6).ceil() / 10.0)
            ),
        );
    }
    let (step, _) = Axis {
        lo: 0.0,
        hi,
        left,
        right,
    }
    .ticks();
    let mut t = 0.0;
    while t <= hi + 1e-9 {
        svg += &format!(
            r#"<text class="tick-label" x="{:.1}" y="{:.1}">+{} s</text>"#,
            x(t),
            height - 6.0,
            secs(t)
        );
        t += step;
    }
    svg += "</svg>";
    let q = |k: &str| f(st, k).map_or("–".into(), |x| format!("{} s", secs(x)));
    format!(
        r#"<article class="storm" data-storm-stop-id="{sid}" data-port="{port}" data-clients="{clients}">
<h3><span class="badge {lvl}">reconnect storm</span><span class="cname">{container}</span><span class="cmeta">port {port} · after stop {sid}</span></h3>
<p class="verdict {lvl}" data-level="{lvl}">{verdict}</p>
{svg}
<div class="facts"><dl><div><dt>clients</dt><dd>{clients_h}</dd></div><div><dt>peak</dt><dd>{peak} arrivals/s</dd></div><div><dt>accept queue</dt><dd>max {depth} waiting · {overflows} overflowed</dd></div><div><dt>accept wait</dt><dd>p50 {p50} · p95 {p95} · max {max}</dd></div></dl></div>
</article>
"#,
        sid = esc(s(st, "stop_id")),
        port = n(st, "port"),
        clients = n(st, "clients"),
        clients_h = thousands(n(st, "clients")),
        lvl = v.level.as_str(),
        container = esc(s(st, "container")),
        verdict = esc(&v.text),
        peak = thousands(f(st, "peak_arrivals_per_second").unwrap_or(0.0).round() as u64),
        depth = n(st, "max_queue_depth"),
        overflows = n(st, "overflows"),
        p50 = q("accept_wait_p50_seconds"),
        p95 = q("accept_wait_p95_seconds"),
        max = q("accept_wait_max_seconds"),
    )
}

const CSS: &str = r#"
:root{--bad:#c8324b;--bad-bg:#fdecef;--warn:#b86e00;--warn-bg:#fff4e0;--good:#23875a;--good-bg:#e6f5ed;--pending:#2f6fd6;--pending-bg:#e8f0fd;--ink:#1d2430;--muted:#667085;--line:#e3e7ee;--card:#fff;--bg:#f4f6f9;--lag:#f1a33a;--grace:#dfe4ec}
*{box-sizing:border-box}
body{margin:0;background:var(--bg);color:var(--ink);font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif}
header{background:#151b26;color:#e9edf3;padding:14px 28px 12px;display:grid;grid-template-columns:auto 1fr auto;align-items:baseline;gap:4px 18px}
.brand{display:flex;align-items:baseline;gap:12px}.logo{font-weight:700;font-size:19px;letter-spacing:.2px}
.host{font:13px ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;color:#9fb3d1;background:#222b3a;padding:1px 8px;border-radius:4px}
.tagline{color:#98a4b8;font-size:13px}
nav{font-size:12.5px;color:#98a4b8}nav a{color:#c5d3ea;text-decoration:none}nav a:hover{text-decoration:underline}
main{max-width:1180px;margin:0 auto;padding:18px 24px 40px}
.overview{display:flex;flex-wrap:wrap;align-items:center;justify-content:space-between;gap:8px;color:var(--muted);font-size:13px;margin:0 2px 12px}
.legend{display:flex;flex-wrap:wrap;gap:4px 14px;font-size:12px;color:var(--muted)}.legend span{display:inline-flex;align-items:center;gap:5px}
.empty{background:var(--card);border:1px solid var(--line);border-radius:10px;padding:28px 32px;text-align:center;color:var(--muted)}.empty h2{color:var(--ink);margin:0 0 6px;font-size:18px}
details.deploy{background:var(--card);border:1px solid var(--line);border-left:4px solid var(--line);border-radius:10px;margin:0 0 14px;box-shadow:0 1px 2px rgba(16,24,40,.04)}
details.deploy.bad{border-left-color:var(--bad)}details.deploy.good{border-left-color:var(--good)}details.deploy.warning{border-left-color:var(--warn)}details.deploy.pending{border-left-color:var(--pending)}
summary{cursor:pointer;list-style:none;display:flex;flex-wrap:wrap;align-items:center;gap:6px 12px;padding:12px 16px}
summary::-webkit-details-marker{display:none}
summary::before{content:"▸";color:var(--muted);font-size:12px;width:10px}details[open]>summary::before{content:"▾"}
details[open]>summary{border-bottom:1px solid var(--line)}
.workload{font-weight:650;font-size:15.5px}.ns{color:var(--muted);font-size:12.5px;background:#eef1f5;border-radius:4px;padding:0 6px}
.when{color:var(--muted);font-size:12.5px}.chips{margin-left:auto;display:flex;flex-wrap:wrap;gap:5px}
.chip{font-size:12px;border-radius:999px;padding:1px 9px;background:#eef1f5;color:#3d4757;white-space:nowrap}.chip b{font-weight:650}
.chip.cut,.chip.abort{background:var(--bad-bg);color:var(--bad)}.chip.refused{background:var(--warn-bg);color:var(--warn)}.chip.retried{background:#f1eafd;color:#6b3fc7}.chip.unreachable{background:#eceef2;color:#4a5363}.chip.late{background:var(--pending-bg);color:var(--pending)}.chip.none{background:var(--good-bg);color:var(--good)}
.badge{font-size:11.5px;font-weight:650;text-transform:uppercase;letter-spacing:.4px;border-radius:5px;padding:2px 8px;white-space:nowrap}
.badge.bad{background:var(--bad-bg);color:var(--bad)}.badge.good{background:var(--good-bg);color:var(--good)}.badge.warning{background:var(--warn-bg);color:var(--warn)}.badge.pending{background:var(--pending-bg);color:var(--pending)}
article{padding:14px 18px 12px 18px;border-top:1px solid var(--line)}summary+article{border-top:0}
article h3{margin:0 0 6px;font-size:14.5px;display:flex;flex-wrap:wrap;align-items:center;gap:4px 10px}
.cname{font-weight:650}.cmeta{color:var(--muted);font:12px ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
.verdict{margin:4px 0 8px;padding:8px 12px;border-radius:6px;font-size:13.5px;border-left:3px solid}
.verdict.bad{background:var(--bad-bg);border-color:var(--bad)}.verdict.good{background:var(--good-bg);border-color:var(--good)}.verdict.warning{background:var(--warn-bg);border-color:var(--warn)}.verdict.pending{background:var(--pending-bg);border-color:var(--pending)}
svg.timeline,svg.storm-chart{width:100%;height:auto;display:block;margin:2px 0 4px}
svg text{font-family:system-ui,-apple-system,"Segoe UI",Roboto,Arial,sans-serif}
.lane{fill:#f7f8fb;stroke:#edf0f4}.lane-label{font-size:12px;fill:#3d4757;text-anchor:end;font-weight:600}.lane-sub{font-size:10.5px;fill:var(--muted);text-anchor:end}
.tick{stroke:#e9ecf1;stroke-width:1}.tick-label{font-size:10.5px;fill:var(--muted);text-anchor:middle}
.grace{fill:var(--grace)}.drain{fill:#9aa6b8}.drain.good{fill:#5fbf8f}.drain.bad{fill:#e4798b}.drain.pending{fill:#86aef0}
.lag{fill:var(--lag);opacity:.28}
.band-label{font-size:11px;fill:#3d4757}.on-drain{fill:#fff;font-weight:600}
.marker{stroke-width:1.5}.marker-label{font-size:11px;font-weight:600}
line.m-term{stroke:#1d2430}tspan.m-term{fill:#1d2430}
line.m-listener{stroke:#7a4fd6;stroke-dasharray:4 3}tspan.m-listener{fill:#7a4fd6}
line.m-exit{stroke:#1d2430;stroke-dasharray:2 2}tspan.m-exit{fill:#1d2430}
line.m-kill{stroke:var(--bad);stroke-width:2}tspan.m-kill{fill:var(--bad)}
line.m-cgroup{stroke:#98a2b3;stroke-dasharray:1 3}tspan.m-cgroup{fill:#667085}
.marker-stem{stroke:#c4cad4;stroke-width:1}tspan.sep{fill:#98a2b3;font-weight:400}
.g-cut{stroke:var(--bad);stroke-width:2.6;stroke-linecap:round;fill:none}
.g-retried{stroke:#6b3fc7;stroke-width:2;fill:none}path.g-retried{fill:#6b3fc7;stroke:none}
.g-abort{fill:#8a1c30}
.g-refused{fill:#e08a00;stroke:#fff;stroke-width:1}
.g-unreachable{fill:#fff;stroke:#4a5363;stroke-width:1.6}
.g-late{fill:var(--pending);opacity:.8}.g-accept{fill:#98a2b3}.g-sigterm{fill:#1d2430}
.bar{fill:#7fa7ea}.bar.over{fill:#e4798b}.rate{stroke:#1d2430;stroke-width:1.5;stroke-dasharray:6 4}.rate-label{font-weight:600}
.win.observed{fill:#7fa7ea}.win.recommended{fill:#5fbf8f}
.facts{display:flex;flex-wrap:wrap;gap:6px 18px;align-items:flex-start;font-size:12.5px;color:#3d4757}
.facts .loss{display:flex;flex-wrap:wrap;gap:5px;min-width:220px}
.facts dl{margin:0;display:grid;grid-template-columns:repeat(auto-fill,minmax(250px,1fr));gap:2px 18px;flex:1}
.facts dl div{display:flex;gap:8px}.facts dt{color:var(--muted);min-width:96px}.facts dd{margin:0}
@media (max-width:1060px){header{grid-template-columns:1fr auto}.tagline{display:none}}
@media (max-width:760px){header{grid-template-columns:1fr}main{padding:12px}.chips{margin-left:0}}
"#;

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn info() -> PageInfo {
        PageInfo {
            host: "node-1".into(),
            version: "0.1.0".into(),
            rendered_at: "2026-11-29T22:48:00.000Z".into(),
        }
    }

    fn no_handler_stop(name: &str) -> Value {
        json!({
            "id": "c67f6ba70c4b-1",
            "container": {"id": "c67f6ba70c4b0123", "runtime": "podman", "name": name, "namespace": "", "pod": "", "workload": "web"},
            "sigterm_at": "2026-11-29T22:47:28.358Z",
            "sigterm_sender": {"pid": 16354, "comm": "runc"},
            "sigkill_at": null,
            "exit_at": "2026-11-29T22:47:28.361Z",
            "exit_code": 143, "exit_signal": 15,
            "cgroup_removed_at": "2026-11-29T22:47:28.551Z",
            "listeners": [{"address": "10.88.0.5:8080", "closed_at": "2026-11-29T22:47:28.362Z"}],
            "last_accept_at": "2026-11-29T22:47:27.335Z",
            "connections_at_sigterm": 2, "connections_at_exit": 2,
            "grace_seconds": null, "drain_seconds": 0.003, "routing_lag_seconds": 3.512,
            "loss": {"inflight_cut": 2, "idle_closed": 0, "resets_sent": {"NOT_SPECIFIED": 2}, "refused": 3, "unreachable": 0, "accepted_after_sigterm": 0, "retry_duplicates": 1, "upstream_aborts": 0},
            "loss_events": [
                {"at": "2026-11-29T22:47:28.362Z", "kind": "inflight_cut", "open_seconds": 0.3},
                {"at": "2026-11-29T22:47:28.362Z", "kind": "inflight_cut", "open_seconds": 0.31},
                {"at": "2026-11-29T22:47:28.362Z", "kind": "retry_duplicates", "open_seconds": null},
                {"at": "2026-11-29T22:47:29.858Z", "kind": "refused", "open_seconds": null},
                {"at": "2026-11-29T22:47:30.858Z", "kind": "refused", "open_seconds": null},
                {"at": "2026-11-29T22:47:31.870Z", "kind": "refused", "open_seconds": null},
            ],
            "loss_events_dropped": 0,
            "outcome": "exit_at_once"
        })
    }

    fn deploy_of(stop: &Value, in_progress: u64) -> Value {
        json!([{
            "id": "web-c67f6ba70c4b-1", "namespace": "", "workload": stop["container"]["workload"],
            "started_at": stop["sigterm_at"], "last_stop_at": stop["sigterm_at"],
            "stops": [stop["id"]], "outcomes": if in_progress > 0 { json!({}) } else { json!({"exit_at_once": 1}) },
            "in_progress": in_progress, "loss": stop["loss"]
        }])
    }

    #[test]
    fn a_stop_shows_its_timeline_loss_and_the_shared_verdict() {
        let stop = no_handler_stop("web-1");
        let html = render(&deploy_of(&stop, 0), &json!([stop]), &json!([]), &info());
        assert!(html.starts_with("<!doctype html>"));
        // The same sentence `drainwatch report` prints.
        let v = verdict::stop(&stop);
        assert_eq!(v.level, Level::Bad);
        assert!(html.contains(&esc(&v.text)), "verdict missing:\n{html}");
        assert!(v.text.contains("wait ≥ 4 s before closing the listener"));
        // Machine-readable data that matches the API's.
        for needle in [
            r#"data-stop-id="c67f6ba70c4b-1""#,
            r#"data-outcome="exit_at_once""#,
            r#"data-sigterm-at="2026-11-29T22:47:28.358Z""#,
            r#"data-exit-at="2026-11-29T22:47:28.361Z""#,
            r#"data-listener-closed-at="2026-11-29T22:47:28.362Z""#,
            r#"data-routing-lag-seconds="3.512""#,
            r#"data-loss-events="6""#,
            r#"data-loss="inflight_cut"><b>2</b> in-flight cut"#,
            r#"data-loss="refused"><b>3</b> refused"#,
            r#"data-loss="retry_duplicates"><b>1</b> retried"#,
        ] {
            assert!(html.contains(needle), "{needle} missing");
        }
        // The timeline: markers, bands, one glyph per loss event, in the right lanes.
        for needle in [
            ">SIGTERM</tspan>",
            ">listener closed</tspan>",
            ">exit (SIGTERM)</tspan>",
            ">cgroup removed</tspan>",
            ">routing continued 3.5 s</text>",
            "2 cut, 1 retried",
            "3 refused",
        ] {
            assert!(html.contains(needle), "{needle} missing");
        }
        assert_eq!(
            html.matches(r#"class="g-cut""#).count(),
            2 + 1,
            "2 cuts + legend"
        );
        assert_eq!(html.matches(r#"class="g-refused""#).count(), 3 + 1);
        // Relative URLs only: works through a port-forward or a path prefix.
        assert!(html.contains(r#"<script src="page.js" defer>"#));
        assert!(!html.contains("src=\"/") && !html.contains("href=\"/") && !html.contains("http"));
        // Nothing is stopping: slow refresh.
        assert!(html.contains(r#"data-refresh="10000""#));
    }

    #[test]
    fn kubernetes_facts_show_when_known() {
        let mut stop = no_handler_stop("web-7d9f8c-abcde");
        stop["container"]["namespace"] = json!("shop");
        stop["container"]["pod"] = json!("web-7d9f8c-abcde");
        stop["container"]["node"] = json!("node-3");
        stop["grace_configured_seconds"] = json!(30);
        stop["prestop"] = json!(false);
        let mut deploys = deploy_of(&stop, 0);
        deploys[0]["workload_kind"] = json!("Deployment");
        deploys[0]["revisions"] = json!(["7d9f8c"]);
        let html = render(&deploys, &json!([stop]), &json!([]), &info());
        for needle in [
            r#"<span class="ns">Deployment</span>"#,
            "replaced revision 7d9f8c",
            "pod shop/web-7d9f8c-abcde on node-3",
            "<dt>grace period</dt><dd>30 s configured</dd>",
            "<dt>preStop hook</dt><dd>none</dd>",
            // A 30 s grace period is drawn as a band running off the right edge.
            "grace 30 s →",
            "(or add a preStop hook that sleeps ≥ 4 s)",
        ] {
            assert!(html.contains(needle), "{needle} missing");
        }
    }

    #[test]
    fn container_names_cannot_inject_markup() {
        let evil = r#"<script>alert(1)</script>"'&"#;
        let mut stop = no_handler_stop(evil);
        stop["container"]["workload"] = json!(evil);
        stop["listeners"][0]["address"] = json!("<img src=x onerror=alert(1)>");
        stop["sigterm_sender"]["comm"] = json!("<b>runc</b>");
        stop["loss"]["resets_sent"] = json!({"<i>reason</i>": 1});
        let storm = json!({"container": evil, "stop_id": evil, "port": 8080, "clients": 20, "arrivals_per_100ms": [20], "seconds_to_95_percent": 0.1});
        let html = render(
            &deploy_of(&stop, 0),
            &json!([stop]),
            &json!([storm]),
            &PageInfo {
                host: evil.into(),
                ..info()
            },
        );
        for bad in ["<script>alert", "<img", "<b>runc", "<i>reason", "\"'&\""] {
            assert!(!html.contains(bad), "{bad} not escaped");
        }
        assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;&quot;&#39;&amp;"));
        // The only script is the same-origin one.
        assert_eq!(html.matches("<script").count(), 1);
    }

    #[test]
    fn a_deploy_under_way_refreshes_fast_and_says_so() {
        let mut stop = no_handler_stop("web-1");
        for k in [
            "exit_at",
            "cgroup_removed_at",
            "outcome",
            "exit_code",
            "exit_signal",
        ] {
            stop[k] = Value::Null;
        }
        let html = render(&deploy_of(&stop, 1), &json!([stop]), &json!([]), &info());
        assert!(html.contains(r#"data-refresh="2000""#));
        assert!(html.contains(r#"<span class="badge pending">1 stopping</span>"#));
        assert!(html.contains("stopping: no verdict until the process exits"));
    }

    #[test]
    fn a_storm_is_drawn_under_the_deploy_that_caused_it() {
        let stop = no_handler_stop("web-1");
        let storm = json!({
            "namespace": "", "workload": "web", "container": "web-2", "port": 8080,
            "stop_id": "c67f6ba70c4b-1", "clients": 2000, "seconds_to_95_percent": 1.1,
            "peak_arrivals_per_second": 2600.0, "arrivals_per_100ms": [100, 260, 250, 240, 230, 220, 210, 200, 190, 150, 150],
            "max_queue_depth": 128, "overflows": 0,
            "accept_wait_p50_seconds": 1.2, "accept_wait_p95_seconds": 3.6, "accept_wait_max_seconds": 3.9,
            "sustained_accept_rate": 480.0, "recommended_window_seconds": 4.167
        });
        let html = render(
            &deploy_of(&stop, 0),
            &json!([stop]),
            &json!([storm.clone()]),
            &info(),
        );
        let deploy_at = html.find("<details class=\"deploy").unwrap();
        let storm_at = html.find(r#"data-storm-stop-id="c67f6ba70c4b-1""#).unwrap();
        let end = html[deploy_at..].find("</details>").unwrap() + deploy_at;
        assert!(
            deploy_at < storm_at && storm_at < end,
            "storm inside its deploy"
        );
        assert!(html.contains(&esc(&verdict::storm(&storm).text)));
        assert!(html.contains("capacity 480 accepts/s"));
        assert!(html.contains("recommended window ≥ 4.2 s"));
        assert!(html.contains("95% back in 1.1 s"));
        assert_eq!(html.matches(r#"class="bar"#).count(), 11);
        assert!(html.contains("1 reconnect storm"));
    }

    #[test]
    fn nothing_seen_says_how_to_see_something() {
        let html = render(&json!([]), &json!([]), &json!([]), &info());
        assert!(html.contains("No container stops seen yet"));
        assert!(html.contains("cargo xtask demo"));
    }

    #[test]
    fn the_state_changes_with_the_data_only() {
        let stop = no_handler_stop("web-1");
        let a = render(
            &deploy_of(&stop, 0),
            &json!([stop.clone()]),
            &json!([]),
            &info(),
        );
        let later = PageInfo {
            rendered_at: "2026-11-29T22:49:00.000Z".into(),
            ..info()
        };
        let b = render(
            &deploy_of(&stop, 0),
            &json!([stop.clone()]),
            &json!([]),
            &later,
        );
        let state = |h: &str| h.split("data-state=\"").nth(1).unwrap()[..16].to_string();
        assert_eq!(state(&a), state(&b));
        let mut more = stop.clone();
        more["loss"]["refused"] = json!(4);
        let c = render(&deploy_of(&more, 0), &json!([more]), &json!([]), &info());
        assert_ne!(state(&a), state(&c));
    }
}
