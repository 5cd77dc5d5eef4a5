//! A pod with a mesh-like sidecar (issue 43 item 6): nginx in the app's network namespace
//! proxying to it over 127.0.0.1, behind a pilot-agent-like wrapper that keeps serving 3 s
//! after SIGTERM, stopped in classic and native sidecar order (see
//! `drainwatch_tests::lab::sidecar`). The real agent; ground truth from the clients, the app's
//! own work log, the sidecar's access and error logs and the pod namespace's counters.
//!
//! The app's record has its cut requests and the sidecar's refused loopback connects exactly,
//! the sidecar's own record is clean, a graceful pod reads zero; and the sidecar is taken for
//! a proxy (issue 43 item 4), so the cuts it answered with 502 are the app's
//! `upstream_aborts`, and the cuts a retrying sidecar ran again on another container of its
//! pod are the app's `retry_duplicates`.

use std::time::{Duration, Instant};

use drainwatch_tests::{
    agent::{Agent, api, current_stop, stop_record, wait_for},
    lab::{
        Outcome,
        sidecar::{Order, SidecarLab, SidecarRun, SidecarSpec},
    },
};
use serde_json::Value;

struct Pod {
    lab: SidecarLab,
    run: SidecarRun,
    app: Value,
    /// Null when the sidecar was not stopped (`Order::AppOnly`).
    sidecar: Value,
}

fn loss(stop: &Value, k: &str) -> u64 {
    stop["loss"][k]
        .as_u64()
        .unwrap_or_else(|| panic!("loss.{k} in {stop:#}"))
}

fn pod(spec: SidecarSpec) -> Pod {
    let started = Instant::now();
    let agent = Agent::start(&[]);
    let lab = SidecarLab::setup(spec);
    // The agent knows both containers before anything is sent.
    wait_for(
        "the agent to know the app and the sidecar",
        Duration::from_secs(10),
        || {
            let (_, starts) = api(&agent, "/api/v1/starts");
            let known = |id: &str| {
                starts
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|s| s["container"]["id"] == id)
            };
            known(&lab.app.id) && known(&lab.sidecar.id)
        },
    );
    let run = lab.run();
    print!("{}", run.report());
    let mut app = stop_record(&agent, &lab.app.id);
    let sidecar = match lab.spec.order {
        Order::AppOnly => Value::Null,
        _ => stop_record(&agent, &lab.sidecar.id),
    };
    // A cut's retry verdict comes up to a second after it: let it, then read the record again.
    std::thread::sleep(Duration::from_millis(1500));
    app = current_stop(&agent, &lab.app.id).unwrap_or(app);
    if lab.spec.order == Order::AppOnly {
        assert!(
            current_stop(&agent, &lab.sidecar.id).is_none(),
            "the sidecar was not stopped"
        );
    }
    if let Some(r) = &lab.replica {
        assert!(
            current_stop(&agent, &r.id).is_none(),
            "the replica was not stopped"
        );
    }
    println!("drainwatch, app: {app:#}");
    println!("drainwatch, sidecar: {sidecar:#}");
    let p = Pod {
        lab,
        run,
        app,
        sidecar,
    };
    p.table();
    println!("run took {:?}", started.elapsed());
    p
}

impl Pod {
    /// Truth beside drainwatch, field by field.
    fn table(&self) {
        let r = &self.run;
        let rows: [(&str, usize, &Value); 9] = [
            (
                "app inflight_cut (app log: started, never finished)",
                r.cut.len(),
                &self.app["loss"]["inflight_cut"],
            ),
            (
                "app refused (sidecar error log: connect refused)",
                r.refused_lines,
                &self.app["loss"]["refused"],
            ),
            (
                "app upstream_aborts (cut requests the sidecar answered 502)",
                self.aborts_truth(),
                &self.app["loss"]["upstream_aborts"],
            ),
            (
                "app retry_duplicates (cut requests the replica started too)",
                r.duplicates.len(),
                &self.app["loss"]["retry_duplicates"],
            ),
            (
                "app retried_unexecuted (reset before the app read them, run on the replica)",
                r.reset_unread.len(),
                &self.app["loss"]["retried_unexecuted"],
            ),
            (
                "sidecar inflight_cut",
                0,
                &self.sidecar["loss"]["inflight_cut"],
            ),
            ("sidecar refused", 0, &self.sidecar["loss"]["refused"]),
            (
                "app accepted_after_sigterm (clients sent after the app's logged SIGTERM)",
                r.sent_after(r.app_sigterm),
                &self.app["loss"]["accepted_after_sigterm"],
            ),
            (
                "sidecar accepted_after_sigterm (clients sent after the wrapper's SIGTERM)",
                r.sent_after(r.sidecar_sigterm),
                &self.sidecar["loss"]["accepted_after_sigterm"],
            ),
        ];
        for (what, truth, dw) in rows {
            println!("{what}: truth {truth}, drainwatch {dw}");
        }
        // Printed, not asserted: OutRsts counts the whole namespace over the load.
        let resets = |v: &Value| -> u64 {
            v["loss"]["resets_sent"]
                .as_object()
                .into_iter()
                .flatten()
                .filter_map(|(_, n)| n.as_u64())
                .sum()
        };
        println!(
            "pod resets sent (OutRsts): truth {}, drainwatch app {} {} + sidecar {}",
            r.out_rsts,
            resets(&self.app),
            self.app["loss"]["resets_sent"],
            resets(&self.sidecar)
        );
        println!(
            "outcomes: app {}, sidecar {}",
            self.app["outcome"], self.sidecar["outcome"]
        );
    }

    /// Cut requests the sidecar answered 502: each a client's error no proxy re-sent.
    fn aborts_truth(&self) -> usize {
        self.run.cut.intersection(&self.run.sidecar_502).count()
    }

    /// The ground truth is consistent with itself: every source tells the same story.
    fn check_truth(&self) {
        let r = &self.run;
        let client_502 = r
            .requests
            .iter()
            .filter(|q| q.outcome == Outcome::Cut)
            .count();
        let ok = r
            .requests
            .iter()
            .filter(|q| q.outcome == Outcome::Ok)
            .count();
        assert_eq!(
            ok + client_502,
            r.requests.len(),
            "every client got 200 or 502: {:?}",
            r.outcomes()
        );
        assert_eq!(
            client_502,
            r.sidecar_502.len(),
            "the clients' 502s are the sidecar's"
        );
        assert_eq!(
            self.aborts_truth() + r.refused_502.len(),
            r.sidecar_502.len(),
            "each 502 is a cut or a refused connect"
        );
        assert_eq!(
            self.aborts_truth() + r.duplicates.len(),
            r.cut.len(),
            "each cut reached its client as a 502 or ran again on the replica"
        );
        assert_eq!(
            r.premature_lines,
            r.cut.len(),
            "the sidecar's error log: cuts"
        );
        if self.lab.replica.is_none() {
            assert_eq!(
                r.refused_lines,
                r.refused_502.len(),
                "the sidecar's error log: refusals, each a 502"
            );
        }
        assert_eq!(
            r.attempt_fails, r.refused_lines as u64,
            "the pod namespace's failed connects are the sidecar's refused ones"
        );
        if r.sidecar_stop.is_some() {
            assert_eq!(
                r.sidecar_exit,
                Some(0),
                "the wrapper quit nginx and exited 0"
            );
        }
    }

    /// The app's record against the truth: its cuts (started, never finished) and the
    /// sidecar's refused loopback connects.
    fn check_app_exact(&self) {
        let r = &self.run;
        assert_eq!(
            loss(&self.app, "inflight_cut"),
            r.cut.len() as u64,
            "{:#}",
            self.app
        );
        assert_eq!(
            loss(&self.app, "refused"),
            r.refused_lines as u64,
            "{:#}",
            self.app
        );
    }

    /// What holds today for a cut: the app's record exact, the sidecar's clean.
    fn check_cut(&self) {
        self.check_truth();
        let r = &self.run;
        assert!(
            !r.cut.is_empty() && !r.refused_502.is_empty(),
            "the lab cut and refused: {}",
            r.report()
        );
        self.check_app_exact();
        self.check_sidecar_clean();
    }

    /// A draining app, clients gone before it closes: zero everywhere, no bad verdict.
    fn check_graceful(&self) {
        self.check_truth();
        let r = &self.run;
        assert!(
            r.sidecar_502.is_empty() && r.cut.is_empty(),
            "ground truth: nothing lost: {}",
            r.report()
        );
        assert_eq!(r.app_exit, 0);
        for k in [
            "inflight_cut",
            "refused",
            "upstream_aborts",
            "retry_duplicates",
        ] {
            assert_eq!(
                loss(&self.app, k),
                0,
                "the app lost nothing ({k}): {:#}",
                self.app
            );
        }
        assert_eq!(self.app["outcome"], "drained", "{:#}", self.app);
        self.check_sidecar_clean();
    }

    fn check_sidecar_clean(&self) {
        let s = &self.sidecar;
        for k in [
            "inflight_cut",
            "refused",
            "retry_duplicates",
            "upstream_aborts",
        ] {
            assert_eq!(loss(s, k), 0, "the sidecar lost nothing ({k}): {s:#}");
        }
        assert_ne!(s["outcome"], "crashed", "{s:#}");
        assert_ne!(s["outcome"], "killed_at_deadline", "{s:#}");
    }
}

#[test]
fn classic_order_the_apps_record_has_its_cuts_and_the_sidecars_refused_connects() {
    let p = pod(SidecarSpec::cut(Order::Classic));
    p.check_cut();
    let _ = &p.lab;
}

#[test]
fn native_order_the_apps_record_has_its_cuts_and_the_sidecars_refused_connects() {
    let p = pod(SidecarSpec::cut(Order::Native));
    p.check_cut();
    assert!(
        p.lab
            .sidecar
            .event_at("sigterm")
            .expect("the wrapper's SIGTERM")
            >= p.run.app_stop.returned,
        "native order: the sidecar's SIGTERM after the app's exit"
    );
}

#[test]
fn a_draining_app_behind_its_native_sidecar_loses_nothing() {
    let p = pod(SidecarSpec::graceful(Order::Native));
    p.check_graceful();
}

#[test]
fn a_draining_app_and_its_sidecar_stopped_together_lose_nothing() {
    let p = pod(SidecarSpec::graceful(Order::Classic));
    p.check_graceful();
}

/// A sidecar balancing over two app containers of its pod, retrying a cut request on the
/// other (nginx's default `proxy_next_upstream`): the app restarted alone (a failed liveness
/// probe), the sidecar serving on.
fn retrying() -> SidecarSpec {
    SidecarSpec {
        replica: true,
        ..SidecarSpec::cut(Order::AppOnly)
    }
}

#[test]
fn a_retrying_sidecar_runs_the_apps_cut_requests_again_on_its_replica() {
    let p = pod(retrying());
    p.check_truth();
    let r = &p.run;
    assert!(
        !r.duplicates.is_empty() && r.sidecar_502.is_empty(),
        "ground truth: every cut ran again, no client saw an error: {}",
        r.report()
    );
    p.check_app_exact();
}

#[test]
fn a_retrying_sidecars_reruns_are_retry_duplicates() {
    let p = pod(retrying());
    p.check_truth();
    assert!(!p.run.duplicates.is_empty(), "{}", p.run.report());
    assert_eq!(
        loss(&p.app, "retry_duplicates"),
        p.run.duplicates.len() as u64,
        "cut requests the sidecar ran again on the replica: {:#}",
        p.app
    );
    assert_eq!(loss(&p.app, "upstream_aborts"), 0);
}

#[test]
fn a_sidecars_502s_for_cut_requests_are_upstream_aborts() {
    let p = pod(SidecarSpec::cut(Order::Classic));
    p.check_truth();
    assert!(p.aborts_truth() > 0, "{}", p.run.report());
    assert_eq!(
        loss(&p.app, "upstream_aborts"),
        p.aborts_truth() as u64,
        "cut requests the sidecar answered 502, not re-sent: {:#}",
        p.app
    );
    assert_eq!(loss(&p.app, "retry_duplicates"), 0);
    assert_eq!(loss(&p.app, "retried_unexecuted"), 0);
}

/// A retrying sidecar that keeps trying the stopped app (Envoy's connect-failure retries with
/// no outlier detection): every request whose turn the app has is refused over loopback and
/// re-sent to the replica. Each refusal is the app's `refused` (the sidecar's error log), the
/// cuts it re-ran are `retry_duplicates`, and no client saw an error, so nothing is an abort.
#[test]
fn a_sidecar_retrying_refused_connects_elsewhere_counts_them_refused_and_no_abort() {
    let p = pod(SidecarSpec {
        keep_trying: true,
        ..retrying()
    });
    p.check_truth();
    let r = &p.run;
    assert!(
        r.refused_lines > 0 && r.sidecar_502.is_empty(),
        "ground truth: refused connects, each retried on the replica: {}",
        r.report()
    );
    p.check_app_exact();
    assert_eq!(
        loss(&p.app, "retry_duplicates"),
        r.duplicates.len() as u64,
        "{:#}",
        p.app
    );
    assert_eq!(loss(&p.app, "upstream_aborts"), 0, "{:#}", p.app);
    assert_eq!(
        loss(&p.app, "retried_unexecuted"),
        r.reset_unread.len() as u64,
        "{:#}",
        p.app
    );
}
