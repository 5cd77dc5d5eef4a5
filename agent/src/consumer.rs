//! The pipeline's thread: events from the reader's queue through the pipeline, the periodic
//! work every 100 ms, the kernel's watch maps kept in step, and the checkpoint written.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use crate::{
    capture::{event::Event, hold::Hold, storming::Storming, watch::Watch},
    checkpoint::{self, StateDir},
    enrich::host::Procfs,
    model::monotonic_now,
    pipeline::Pipeline,
    queue,
    telemetry::{
        Telemetry,
        internal::{StormingSet, UpstreamsFollowed, WatchUpdateFailed, WatchUpdated},
    },
};

/// How often the pipeline's periodic work runs.
const TICK: Duration = Duration::from_millis(100);
/// `--hold`: how long the kernel may hold a connection's arrival before the agent takes it over
/// (checked every `HOLD_CHECK`), so that the arrival metrics lag by at most about this.
const HOLD_AT_MOST: Duration = Duration::from_secs(10);
const HOLD_CHECK: Duration = Duration::from_secs(5);
/// How often freed heap pages go back to the kernel (see `release_free_memory`).
const TRIM_EVERY: Duration = Duration::from_secs(10);

/// Runs the pipeline on its own thread: its procfs reads block (a namespace's TCP table can
/// take the kernel most of a second to print), and must hold up neither the reader, which
/// would leave events in the ring buffer until it overflows, nor the HTTP server.
pub fn consume(
    rx: queue::Receiver<Event>,
    mut pipeline: Pipeline<Procfs>,
    (mut watch, mut hold, mut storming): (Watch, Option<Hold>, Option<Storming>),
    telemetry: Arc<Telemetry>,
    mut state_dir: Option<StateDir>,
) {
    use queue::{RecvTimeoutError, TryRecvError};
    // The kernel keeps host-namespace traffic only for what the pipeline knows of
    // containers: after each step that may have changed it.
    // The set last applied: most changes to what the pipeline knows (a listener opened in a
    // known container, a proxy found again) leave it as it was, and need no map writes.
    let mut applied = None;
    let mut sync_watch = |pipeline: &mut Pipeline<Procfs>| {
        let mut changed = false;
        if let Some(set) = pipeline
            .watch_update(monotonic_now)
            .filter(|set| applied.as_ref() != Some(set))
        {
            match watch.apply(&set) {
                Ok(a) => {
                    WatchUpdated {
                        addresses: a.addrs,
                        ports: a.ports,
                        refused: a.refused,
                    }
                    .emit(&telemetry);
                    applied = Some(set);
                    changed = true;
                }
                Err(error) => {
                    WatchUpdateFailed { error }.emit(&telemetry);
                    applied = None;
                }
            }
        }
        let follow = pipeline.take_follow();
        if !follow.is_empty() {
            match watch.follow(&follow) {
                Ok(refused) => UpstreamsFollowed { refused }.emit(&telemetry),
                Err(error) => WatchUpdateFailed { error }.emit(&telemetry),
            }
        }
        changed
    };
    // The namespaces whose accepted connections' answers the kernel times: those of workloads
    // a storm may follow (a stop within its watch), kept in step at each tick, lifecycle event
    // and change of what the pipeline knows of containers.
    let mut sync_storming = |pipeline: &mut Pipeline<Procfs>| {
        let Some(s) = storming.as_mut() else { return };
        match s.set(&pipeline.storming_netns(monotonic_now())) {
            Ok(refused) => StormingSet { refused }.emit(&telemetry),
            Err(error) => WatchUpdateFailed { error }.emit(&telemetry),
        }
    };
    // `--hold`: the namespaces that must be seen as they happen, kept in step; what the kernel
    // held there (or for long) is taken over and goes through the pipeline at once, late.
    let mut next_hold_check = Instant::now();
    let mut taken = Vec::new();
    let mut sync_hot = |pipeline: &mut Pipeline<Procfs>| {
        let Some(hold) = hold.as_mut() else { return };
        let now = monotonic_now();
        let by_age = Instant::now() >= next_hold_check;
        let oldest = now.saturating_sub(HOLD_AT_MOST.as_nanos() as u64);
        let result = hold.set_hot(&pipeline.hot_netns(now)).and_then(|new| {
            if new.is_empty() && !by_age {
                return Ok(());
            }
            let t = Instant::now();
            let sweep = hold.take_over(
                |ns, at| new.contains(&ns) || (by_age && at < oldest),
                &mut taken,
            )?;
            let seconds = t.elapsed().as_secs_f64();
            telemetry
                .work
                .hold_take_over(sweep.held, sweep.taken, seconds);
            Ok(())
        });
        if by_age {
            next_hold_check = Instant::now() + HOLD_CHECK;
        }
        if let Err(error) = result {
            WatchUpdateFailed { error }.emit(&telemetry);
        }
        for ev in taken.drain(..) {
            pipeline.event(&ev);
        }
    };
    pipeline.start();
    sync_watch(&mut pipeline);
    sync_hot(&mut pipeline);
    sync_storming(&mut pipeline);
    tracing::info!(
        containers = pipeline.container_count(),
        "containers found at start-up"
    );
    release_free_memory();
    let mut next_tick = Instant::now() + TICK;
    let mut next_checkpoint = Instant::now() + checkpoint::EVERY;
    let mut next_trim = Instant::now() + TRIM_EVERY;
    loop {
        // The clock is read once per batch (a drain of the ring buffers), not per event: those
        // reads were a tenth of the agent's time on pod churn.
        let batch = match rx.try_recv() {
            Ok(batch) => Ok(batch),
            Err(TryRecvError::Empty) => {
                rx.recv_timeout(next_tick.saturating_duration_since(Instant::now()))
            }
            Err(TryRecvError::Disconnected) => Err(RecvTimeoutError::Disconnected),
        };
        match batch {
            Ok(batch) => {
                for ev in &batch {
                    pipeline.event(ev);
                    // A new container or listener widens the watch at once, not a tick later.
                    let changed = sync_watch(&mut pipeline);
                    // A stop is seen whole from its signal on.
                    if ev.kind().lifecycle() {
                        sync_hot(&mut pipeline);
                    }
                    if changed || ev.kind().lifecycle() {
                        sync_storming(&mut pipeline);
                    }
                }
                if Instant::now() < next_tick {
                    continue;
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => break,
        }
        // The periodic work sees the events already queued first, so arrivals waiting in the
        // queue do not make a storm look over; a pipeline that cannot catch up still ticks,
        // at most a second late.
        while Instant::now() < next_tick + Duration::from_secs(1) {
            match rx.try_recv() {
                Ok(batch) => batch.iter().for_each(|ev| pipeline.event(ev)),
                Err(_) => break,
            }
        }
        pipeline.tick(monotonic_now());
        sync_watch(&mut pipeline);
        sync_hot(&mut pipeline);
        sync_storming(&mut pipeline);
        telemetry.heartbeats.pipeline.beat();
        if let Some(sd) = state_dir.as_mut()
            && Instant::now() >= next_checkpoint
        {
            save(sd, &pipeline);
            next_checkpoint = Instant::now() + checkpoint::EVERY;
        }
        if Instant::now() >= next_trim {
            release_free_memory();
            next_trim = Instant::now() + TRIM_EVERY;
        }
        next_tick = Instant::now() + TICK;
    }
    // The reader is gone (shutdown): what a restart resumes from, up to the last event.
    if let Some(sd) = state_dir.as_mut() {
        save(sd, &pipeline);
    }
}

/// Encodes under the correlator's lock, writes after it.
fn save(sd: &mut StateDir, pipeline: &Pipeline<Procfs>) {
    let mut encoded = Ok(());
    pipeline.with_checkpoint(|cp| encoded = sd.encode(cp));
    let result = encoded.and_then(|()| sd.flush());
    sd.logged(result);
}

/// glibc raises its mmap threshold each time a mapped block is freed (up to 32 MiB), after
/// which large buffers (API answers, the checkpoint) come from the heap and leave holes in it
/// when freed. A fixed threshold keeps every block of 128 KiB or more mapped, and returned
/// whole when freed. Called first thing in `main`.
pub fn fix_mmap_threshold() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets an allocator parameter.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024);
    }
}

/// Start-up parses the kernel's BTF twice (ours for the offsets, aya's own in
/// `EbpfLoader::new`) and loads the object: tens of MiB allocated and freed, which glibc
/// keeps, because the few allocations that stay live are scattered through its heap and a
/// heap only shrinks by itself from its top. Measured: 26 of the 38 MiB the agent held at
/// rest. `malloc_trim(0)` returns every whole free page of every arena, wherever it lies.
/// Every ten seconds after that too: records and containers come and go for months, and what
/// their churn freed would otherwise stay the agent's (the soak, BENCHMARKS.md; once a minute
/// left a sawtooth of about 2 MiB over a 27 MiB floor).
pub fn release_free_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim has no preconditions; it only walks the allocator's free lists.
    unsafe {
        libc::malloc_trim(0);
    }
}
