//! The deploy page end to end: the real agent, a real stop (backend s1 without a SIGTERM
//! handler behind HAProxy, stopped mid-load; see `drainwatch_tests::lab`), then
//! - the page served at `/` carries exactly what `/api/v1/*` serve (every deploy, stop and
//!   storm, their times, loss counts and verdicts), and draws one glyph per loss event;
//! - the routing lag it draws ends at the last request HAProxy sent to s1 (its own log);
//! - headless Chromium loads it, finds the stop and its verdict in the DOM, and takes a
//!   screenshot (`target/deploy-page.png`, or `DRAINWATCH_SCREENSHOT`).

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use drainwatch::{
    export::{
        page::esc,
        verdict,
        view::{StopView, StormView},
    },
    model::LossKind,
};
use drainwatch_tests::{
    agent::{Agent, api, get, instant, stop_record},
    browser,
    lab::{Lab, Mode, ScenarioSpec, Trigger, clock},
};
use serde_json::Value;

/// The report API's three answers.
#[derive(PartialEq)]
struct Data {
    deploys: Value,
    stops: Value,
    storms: Value,
}

fn data(agent: &Agent) -> Data {
    Data {
        deploys: api(agent, "/api/v1/deploys").1,
        stops: api(agent, "/api/v1/stops").1,
        storms: api(agent, "/api/v1/storms").1,
    }
}

/// The page and the API's data at one moment: the API answered the same before and after
/// the page was rendered (bounded retries while late events still change it).
fn snapshot(agent: &Agent) -> (Data, String) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let before = data(agent);
        let (status, headers, html) = get(agent.port, "/", "text/html").expect("the page");
        assert_eq!(status, 200, "{html}");
        let csp = headers
            .iter()
            .find(|(k, _)| k == "content-security-policy")
            .map(|(_, v)| v.as_str())
            .unwrap_or_default();
        assert!(csp.contains("script-src 'self'"), "CSP: {csp}");
        if data(agent) == before {
            return (before, html);
        }
        assert!(Instant::now() < deadline, "the data never held still");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// An API element as the page and the verdicts read it.
fn view<T: serde::de::DeserializeOwned>(v: &Value) -> T {
    serde_json::from_value(v.clone()).expect("an element of the report API")
}

fn unescape(s: &str) -> String {
    s.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&amp;", "&")
}

/// The value of `name="..."` in an opening tag.
fn attr(tag: &str, name: &str) -> Option<String> {
    let key = format!(" {name}=\"");
    let start = tag.find(&key)? + key.len();
    let end = tag[start..].find('"')? + start;
    Some(unescape(&tag[start..end]))
}

/// Each element opened with `open` (up to its closing `close`): (opening tag, whole element).
fn elements<'a>(html: &'a str, open: &str, close: &str) -> Vec<(&'a str, &'a str)> {
    let mut out = Vec::new();
    let mut rest = html;
    while let Some(i) = rest.find(open) {
        let el = &rest[i..];
        let tag_end = el.find('>').map_or(el.len(), |e| e + 1);
        let end = el.find(close).map_or(el.len(), |e| e + close.len());
        out.push((&el[..tag_end], &el[..end]));
        rest = &el[end..];
    }
    out
}

/// The loss chips in an element: field → count.
fn chips(el: &str) -> Vec<(String, u64)> {
    elements(el, "data-loss=\"", "</span>")
        .into_iter()
        .filter_map(|(_, chip)| {
            let kind = chip["data-loss=\"".len()..].split('"').next()?.to_string();
            let count = chip
                .split("<b>")
                .nth(1)?
                .split("</b>")
                .next()?
                .replace(',', "");
            Some((kind, count.parse().ok()?))
        })
        .collect()
}

/// The non-zero loss counts of an API loss object, in the page's chip order.
fn nonzero(loss: &Value) -> Vec<(String, u64)> {
    LossKind::ALL
        .iter()
        .filter(|k| k.info().chip.is_some())
        .filter_map(|k| {
            let v = loss[k.as_str()].as_u64().unwrap_or(0);
            (v > 0).then(|| (k.as_str().to_string(), v))
        })
        .chain({
            // Failed health checks: one chip apart from the loss.
            let p = &loss["probes"];
            let failed: u64 = ["cut", "refused", "unreachable"]
                .iter()
                .map(|k| p[k].as_u64().unwrap_or(0))
                .sum();
            (failed > 0).then(|| ("probes".to_string(), failed))
        })
        .collect()
}

fn text_or_empty(v: &Value) -> String {
    v.as_str().unwrap_or("").to_string()
}

fn num_or_empty(v: &Value) -> String {
    v.as_f64().map_or(String::new(), |x| x.to_string())
}

/// Every deploy, stop and storm of the API is on the page with the same data.
fn check_page_matches_api(d: &Data, html: &str) {
    let deploys = elements(html, "<details class=\"deploy", "</details>");
    let api_deploys = d.deploys.as_array().expect("deploys");
    assert_eq!(deploys.len(), api_deploys.len(), "one section per deploy");
    for (dep, (tag, el)) in api_deploys.iter().zip(&deploys) {
        assert_eq!(
            attr(tag, "data-key").as_deref(),
            dep["id"].as_str(),
            "deploys in the API's order (newest first)"
        );
        let stop_ids: Vec<&str> = dep["stops"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert_eq!(attr(tag, "data-stops"), Some(stop_ids.len().to_string()));
        assert_eq!(
            attr(tag, "data-in-progress"),
            Some(dep["in_progress"].to_string())
        );
        let summary = el.split("</summary>").next().unwrap();
        assert_eq!(chips(summary), nonzero(&dep["loss"]), "deploy loss");
        let stops_here = elements(el, "<article class=\"stop\"", "</article>");
        assert_eq!(stops_here.len(), stop_ids.len());
        for ((tag, art), id) in stops_here.iter().zip(&stop_ids) {
            let stop = d
                .stops
                .as_array()
                .unwrap()
                .iter()
                .find(|s| s["id"] == *id)
                .expect("the deploy's stop is in /api/v1/stops");
            assert_eq!(attr(tag, "data-stop-id").as_deref(), Some(*id));
            for (a, k) in [
                ("data-outcome", "outcome"),
                ("data-sigterm-at", "sigterm_at"),
                ("data-sigkill-at", "sigkill_at"),
                ("data-exit-at", "exit_at"),
                ("data-cgroup-removed-at", "cgroup_removed_at"),
            ] {
                assert_eq!(attr(tag, a), Some(text_or_empty(&stop[k])), "{a}");
            }
            assert_eq!(
                attr(tag, "data-container-id"),
                Some(text_or_empty(&stop["container"]["id"]))
            );
            let closed = stop["listeners"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|l| l["closed_at"].as_str())
                .min()
                .unwrap_or("");
            assert_eq!(
                attr(tag, "data-listener-closed-at").as_deref(),
                Some(closed)
            );
            for (a, k) in [
                ("data-drain-seconds", "drain_seconds"),
                ("data-routing-lag-seconds", "routing_lag_seconds"),
            ] {
                assert_eq!(attr(tag, a), Some(num_or_empty(&stop[k])), "{a}");
            }
            let events = stop["loss_events"].as_array().unwrap();
            assert_eq!(
                attr(tag, "data-loss-events"),
                Some(events.len().to_string())
            );
            assert_eq!(chips(art), nonzero(&stop["loss"]), "stop loss");
            // The page's verdict is the report's: one function.
            let v = verdict::stop(&view::<StopView>(stop));
            assert!(art.contains(&esc(&v.text)), "verdict {:?} in {art}", v.text);
            assert!(art.contains(&esc(stop["container"]["name"].as_str().unwrap())));
            // One glyph per loss event, each in its lane.
            for (kind, class) in [
                ("inflight_cut", "g-cut"),
                ("refused", "g-refused"),
                ("unreachable", "g-unreachable"),
                ("accepted_after_sigterm", "g-late"),
                ("retry_duplicates", "g-retried\" cx"),
            ] {
                let want = events.iter().filter(|e| e["kind"] == kind).count();
                let drawn = art.matches(&format!("class=\"{class}")).count();
                assert_eq!(drawn, want, "{kind} glyphs");
            }
            let probes = events
                .iter()
                .filter(|e| e["kind"].as_str().is_some_and(|k| k.starts_with("probe_")))
                .count();
            assert_eq!(
                art.matches("class=\"g-probe").count(),
                probes,
                "probe glyphs"
            );
        }
    }
    let storms = elements(html, "<article class=\"storm\"", "</article>");
    let api_storms = d.storms.as_array().expect("storms");
    assert_eq!(storms.len(), api_storms.len(), "one chart per storm");
    for st in api_storms {
        let shown = storms.iter().find(|(tag, _)| {
            attr(tag, "data-storm-stop-id").as_deref() == st["stop_id"].as_str()
                && attr(tag, "data-port") == Some(st["port"].to_string())
        });
        let (tag, el) = shown.expect("the storm is on the page");
        assert_eq!(attr(tag, "data-clients"), Some(st["clients"].to_string()));
        assert!(el.contains(&esc(&verdict::storm(&view::<StormView>(st)).text)));
    }
}

#[test]
fn the_page_shows_a_stop_as_the_api_does_and_chromium_finds_it() {
    let agent = Agent::start(&[]);
    let mut spec = ScenarioSpec::new(Mode::NoHandler, Trigger::Stop { grace_secs: 10 });
    spec.remove_when_down = true;
    let lab = Lab::setup(spec);
    let run = lab.run();
    print!("{}", run.report());
    let stop = stop_record(&agent, &lab.s1.id);
    println!("drainwatch: {stop:#}");

    let (d, html) = snapshot(&agent);
    check_page_matches_api(&d, &html);

    // What this stop cost, drawn where it happened, against ground truth: the client's cut
    // requests, and routing that ended with the last request HAProxy sent to s1.
    let api_stop = d
        .stops
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == stop["id"])
        .expect("s1's stop")
        .clone();
    assert_eq!(api_stop["outcome"], "exit_at_once");
    assert_eq!(
        api_stop["loss"]["inflight_cut"],
        run.summary.count("cut") as u64
    );
    let term = instant(&api_stop["sigterm_at"]).expect("sigterm_at");
    let lag = api_stop["routing_lag_seconds"]
        .as_f64()
        .expect("routing continued after SIGTERM");
    // Routing is the requests HAProxy still sent to s1 (its log names the server); its
    // health checks until it marked s1 DOWN are probes, not routing.
    let last_routed = run
        .records
        .iter()
        .filter(|r| r.server.as_deref() == Some("s1") && r.start > term)
        .map(|r| r.start)
        .max()
        .expect("HAProxy routed requests to s1 after SIGTERM");
    let routed_after = clock::secs_since(term, last_routed);
    assert!(
        (lag - routed_after).abs() < 0.25,
        "routing lag {lag:.3}s vs HAProxy's last request to s1 {routed_after:.3}s after SIGTERM"
    );
    let text = verdict::stop(&view::<StopView>(&api_stop)).text;
    assert!(
        text.contains(&format!(
            "wait ≥ {} s before closing the listener",
            lag.ceil()
        )),
        "{text}"
    );

    // A real browser loads it and finds the stop and its verdict.
    let url = format!("http://127.0.0.1:{}/", agent.port);
    let dom = browser::dump_dom(&url).expect("chromium --dump-dom");
    assert!(
        dom.contains(&format!(
            "data-stop-id=\"{}\"",
            esc(stop["id"].as_str().unwrap())
        )),
        "the stop is in the DOM"
    );
    assert!(dom.contains(&browser::dom_text(&lab.s1.container)));
    assert!(
        dom.contains(&browser::dom_text(&text)),
        "the verdict is in the DOM: {text}"
    );
    assert!(dom.contains("<svg class=\"timeline\""));
    let shot = std::env::var_os("DRAINWATCH_SCREENSHOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/deploy-page.png")
        });
    browser::screenshot(&url, &shot, 1280, 900).expect("screenshot");
    assert_eq!(browser::png_size(&shot), Some((1280, 900)));
    println!("screenshot: {}", shot.display());
}
