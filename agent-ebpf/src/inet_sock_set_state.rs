//! `inet_sock_set_state`, two ways. Preferred: the BTF-typed raw tracepoint (tp_btf), which
//! hands over the socket itself and builds no tracepoint record, and whose socket fields are
//! plain loads. Fallback: the classic tracepoint, whose record carries the tuple and whose
//! socket fields cost a helper call each. Both emit the same event through `emit`.

use aya_ebpf::{
    helpers::bpf_get_current_pid_tgid,
    macros::{btf_tracepoint, tracepoint},
    programs::{BtfTracePointContext, TracePointContext},
};
use drainwatch_common::{
    EventKind, Tuple,
    inet_sock_set_state::{Event, Fields, HELD_ONLY},
};

use crate::ring::{reserve, submit};
use crate::{
    hold, loopback,
    util::{
        CONFIG, IPPROTO_TCP, Ns, Record, btf_inet_sport, btf_sock_netns, btf_sock_tuple,
        btf_tcp_sock, cfg, count_filtered, fill_header_task, is_host, kread, ld, out_of_scope,
        sock_netns, tp_tuple, zeroed,
    },
};

const KIND: EventKind = EventKind::InetSockSetState;

/// Whether `state` has its bit in `mask` (states outside 0..32 pass: no filter can name them).
#[inline(always)]
fn in_mask(mask: u32, state: i32) -> bool {
    !(0..32).contains(&state) || mask & (1 << state) != 0
}

/// Zero counters, one store each: LLVM would merge plain stores into a byte-at-a-time
/// `memset` call (see `util::zeroed`).
#[inline(always)]
fn no_counters(ev: &mut Event) {
    unsafe {
        core::ptr::write_volatile(&mut ev.bytes_received, 0);
        core::ptr::write_volatile(&mut ev.bytes_sent, 0);
        core::ptr::write_volatile(&mut ev.rcv_nxt, 0);
        core::ptr::write_volatile(&mut ev.copied_seq, 0);
        core::ptr::write_volatile(&mut ev.lrcvtime, 0);
        core::ptr::write_volatile(&mut ev.lsndtime, 0);
        core::ptr::write_volatile(&mut ev.jiffies, 0);
        core::ptr::write_volatile(&mut ev.data_segs_in, 0);
        core::ptr::write_volatile(&mut ev.data_segs_out, 0);
        core::ptr::write_volatile(&mut ev.snd_wl1, 0);
        core::ptr::write_volatile(&mut ev.unacked, 0);
    }
    nothing_held(ev);
}

/// No connect failed (`Event::syn_ms`, `Event::error`): two stores.
#[inline(always)]
fn no_failure(ev: &mut Event) {
    unsafe {
        core::ptr::write_volatile(&mut ev.syn_ms, 0);
        core::ptr::write_volatile(&mut ev.error, 0);
    }
}

/// Nothing held (`hold`): four stores.
#[inline(always)]
fn nothing_held(ev: &mut Event) {
    unsafe {
        core::ptr::write_volatile(&mut ev.held.arrived_ns, 0);
        core::ptr::write_volatile(&mut ev.held.accepted_ns, 0);
        core::ptr::write_volatile(&mut ev.held.accept_tgid, 0);
        core::ptr::write_volatile(&mut ev.held._pad, 0);
    }
}

/// The socket-side reads of one state change, however the hook reaches them.
trait Socket {
    fn netns(&self) -> Ns;
    fn tuple(&self, t: &mut Tuple);
    /// `tcp_sock` counters (`ev.bytes_received` ..= `ev.lsndtime`, the segment counts).
    fn counters(&self, ev: &mut Event);
    fn max_ack_backlog(&self) -> u32;
    /// A failed connect's first SYN and error (`Event::syn_ms`, `Event::error`).
    fn failure(&self, ev: &mut Event);
}

#[inline(always)]
fn emit<S: Socket>(
    s: &S,
    f: &Fields,
    skaddr: u64,
    oldstate: i32,
    newstate: i32,
    follow_containers: bool,
) -> Option<()> {
    // The same flag: both need tp_btf (the classic program is at its verifier's limit).
    let r = emit_event(s, f, skaddr, oldstate, newstate, follow_containers);
    if matches!(r, Err(Skip::LoopbackConnect)) {
        // A connect known to be no proxy's and to no container: not followed (as
        // `on_connect` would find, with a second look at the proxies).
        crate::sock_length::on_new_sock(skaddr);
    } else if in_mask(cfg(&f.connect_new), newstate) {
        // A proxy's upstream is followed wherever it goes, and any connection to a container
        // on this node from its first byte: a proxy is known only after its first connect
        // reached the agent, too late for the requests it sent meanwhile. After the
        // connect's own event, which a retry's start (emitted here) refers to. Not on the
        // classic tracepoint, whose program the verifier then finds too long (sock_length
        // needs tp_btf anyway).
        // A sidecar's loopback connect to its app (`loopback::Connect::Pod`) is one too.
        let to_container = follow_containers
            && (r == Ok(loopback::Connect::Pod) || {
                let mut tuple = zeroed::<Tuple>();
                s.tuple(&mut tuple);
                crate::util::watched_addr(tuple.family, &tuple.daddr)
            });
        crate::sock_length::on_connect(
            skaddr,
            (bpf_get_current_pid_tgid() >> 32) as u32,
            to_container,
        );
    }
    r.ok().map(|_| ())
}

/// Why a step made no record.
#[derive(PartialEq, Eq)]
enum Skip {
    /// A connect dropped as `unused_connect`: no proxy's, to no container.
    LoopbackConnect,
    Other,
}

/// A passive child's first step (LISTEN to SYN_RECV: the handshake's completion, SYN_RECV to
/// ESTABLISHED, is the arrival), which no part of the agent reads: dropped before anything
/// is read from the socket.
#[inline(always)]
fn child_first_step(f: &Fields, oldstate: i32, newstate: i32) -> bool {
    newstate == cfg(&f.syn_recv_state) && in_mask(cfg(&f.backlog_new), oldstate)
}

/// Whether a connect is one no part of the agent reads (see `loopback`): to a loopback or
/// unset address, by a process that is no proxy, to no pod's shared listener (marked, so that
/// its later steps go too).
#[inline(always)]
fn unused_connect(sk: u64, t: &Tuple, netns: Ns) -> loopback::Connect {
    // A proxy's connect stays whole: `sock_length` follows its socket, whose I/O the agent
    // matches by address (`UpstreamIo`), and this record is where it forgets a closed upstream
    // that had the address. So does a sidecar's to its app, which makes it known as a proxy.
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    loopback::on_connect(sk, t, netns, tgid)
}

/// Such a connect's steps after SYN_SENT but its failure (no step is a connect here).
#[inline(always)]
fn unused_later(f: &Fields, sk: u64, oldstate: i32, newstate: i32) -> bool {
    let failed = in_mask(cfg(&f.connect_new), oldstate) && newstate == cfg(&f.close_state);
    let old = cfg(&f.loopback_old);
    old != 0
        && in_mask(old, oldstate)
        && !failed
        && newstate != cfg(&f.syn_recv_state)
        && loopback::is_loopback_connect(sk)
}

#[inline(always)]
fn emit_event<S: Socket>(
    s: &S,
    f: &Fields,
    skaddr: u64,
    oldstate: i32,
    newstate: i32,
    btf: bool,
) -> Result<loopback::Connect, Skip> {
    if btf && loopback::lean() && child_first_step(f, oldstate, newstate) {
        count_filtered(KIND);
        return Err(Skip::Other);
    }
    let netns = s.netns();
    // Each `cfg` read below only where `lean` (on tp_btf): the classic program is at its
    // verifier's limit on 5.10 and 6.1.
    let lean = btf && loopback::lean();
    // A pod's loopback connect's later steps go before its tuple is read. (A host socket's
    // after the host filter, which drops most of them with no lookup.)
    if lean
        && !in_mask(cfg(&f.connect_new), newstate)
        && !is_host(netns)
        && unused_later(f, skaddr, oldstate, newstate)
    {
        count_filtered(KIND);
        return Err(Skip::Other);
    }
    let mut tuple = zeroed::<Tuple>();
    s.tuple(&mut tuple);
    // Each mask read where it is needed, through `cfg`: `f` is the frozen global itself on the
    // tp_btf path, and copying all of it up front cost a dozen loads per run.
    let backlog_new = cfg(&f.backlog_new);
    let listener = in_mask(backlog_new, newstate)
        || (in_mask(backlog_new, oldstate) && in_mask(cfg(&f.listener_closed_new), newstate));
    // The host's own traffic first: its loopback connects then cost no map update each (no
    // step `unused_connect` or `unused_later` drops is a listener's). A host socket the watch
    // set takes in later was never marked a loopback connect: its steps are kept, as before
    // the lean filter.
    // A connect's failure, the agent's only sight of an attempt sent through NAT (a Service's
    // virtual IP, which no container has): kept from the host too, but to loopback (never
    // NATed to a pod). Failures are rare; a successful connect's steps still go.
    let failed = btf && in_mask(cfg(&f.connect_new), oldstate) && newstate == cfg(&f.close_state);
    let host_failure =
        failed && drainwatch_common::watch::Addr::of(tuple.family, &tuple.daddr).is_some();
    if !listener && !host_failure && out_of_scope(KIND, netns, &tuple) {
        return Err(Skip::Other);
    }
    let mut kind = loopback::Connect::Other;
    if lean {
        let connect = in_mask(cfg(&f.connect_new), newstate);
        if connect {
            kind = unused_connect(skaddr, &tuple, netns);
            if kind == loopback::Connect::Unused {
                count_filtered(KIND);
                return Err(Skip::LoopbackConnect);
            }
        }
        if !connect && is_host(netns) && unused_later(f, skaddr, oldstate, newstate) {
            count_filtered(KIND);
            return Err(Skip::Other);
        }
    }
    // Only on tp_btf (the classic program is at its verifier's limit): a held arrival is
    // carried by the connection's first step out of ESTABLISHED.
    let hold = btf && hold::on();
    if hold
        && oldstate == cfg(&f.syn_recv_state)
        && newstate == cfg(&f.established_state)
        && hold::arrive(skaddr, netns.inum, &tuple)
    {
        return Err(Skip::Other);
    }
    let mut entry = reserve::<Event>(KIND).ok_or(Skip::Other)?;
    let ev = unsafe { entry.assume_init_mut() };
    fill_header_task(
        &mut ev.header,
        KIND,
        netns,
        in_mask(cfg(&f.task_new), newstate),
    );
    ev.skaddr = skaddr;
    ev.tuple = tuple;
    ev.oldstate = oldstate;
    ev.newstate = newstate;
    // Only the transitions that need the counters (a connection leaving ESTABLISHED or
    // CLOSE_WAIT: was a request pending?) read them.
    if in_mask(cfg(&f.counters_old), oldstate) {
        s.counters(ev);
        // The clock `lrcvtime` / `lsndtime` count in (5.5+).
        ev.jiffies = unsafe { aya_ebpf::helpers::bpf_jiffies64() } as u32;
        // What was held comes with the first step out of ESTABLISHED. Stores only where
        // nothing is held: the classic program is at its verifier's limit on 5.10 and 6.1.
        if hold {
            ev.held = hold::take(skaddr);
        } else {
            nothing_held(ev);
        }
    } else {
        no_counters(ev);
    }
    if failed {
        s.failure(ev);
    } else {
        no_failure(ev);
    }
    // listen() sets the limit before the socket enters LISTEN.
    ev.max_ack_backlog = if in_mask(backlog_new, newstate) {
        s.max_ack_backlog()
    } else {
        0
    };
    submit(entry);
    Ok(kind)
}

/// Before a reset hook's record of `sk`: what was held for it, in a record of its own, so that
/// the agent knows the connection before its reset.
#[inline(always)]
pub fn emit_held_only(sk: u64, netns: Ns, tuple: &Tuple) {
    if !hold::on() {
        return;
    }
    let held = hold::take(sk);
    if held.arrived_ns == 0 {
        return;
    }
    let Some(mut entry) = reserve::<Event>(KIND) else {
        return;
    };
    let ev = unsafe { entry.assume_init_mut() };
    fill_header_task(&mut ev.header, KIND, netns, false);
    ev.skaddr = sk;
    ev.tuple = *tuple;
    ev.oldstate = HELD_ONLY;
    ev.newstate = HELD_ONLY;
    no_counters(ev);
    no_failure(ev);
    ev.max_ack_backlog = 0;
    ev.held = held;
    submit(entry);
}

/// tp_btf: `inet_sock_set_state(const struct sock *sk, int oldstate, int newstate)`.
#[btf_tracepoint(function = "inet_sock_set_state")]
pub fn inet_sock_set_state_btf(ctx: BtfTracePointContext) -> i32 {
    if crate::util::attach_only() {
        return 0;
    }
    let sk: *const u8 = ctx.arg(0);
    let oldstate: i32 = ctx.arg(1);
    let newstate: i32 = ctx.arg(2);
    let f = &CONFIG.inet_sock_set_state;
    let k = &CONFIG.kernel;
    // Before the filters: every socket's last step, whatever it was (`sock_length`'s map).
    if newstate == cfg(&f.close_state) {
        crate::sock_length::on_close(sk as u64);
        // tp_btf only, as the I/O hooks that follow it (`storm_answers`).
        crate::storm_answers::on_close(sk as u64);
    } else if newstate == cfg(&f.last_ack_state) {
        crate::sock_length::on_last_ack(sk as u64);
    } else if newstate == cfg(&f.fin_wait1_state) {
        // Not on the classic tracepoint (at its verifier's limit; sock_length needs tp_btf).
        crate::sock_length::on_proxy_shut(sk as u64);
    } else if newstate == cfg(&f.syn_recv_state) {
        crate::sock_length::on_new_sock(sk as u64);
    }
    if in_mask(cfg(&f.emit_old), oldstate)
        && ld::<u16>(sk, cfg(&k.sock_protocol)) == Some(IPPROTO_TCP)
    {
        let s = Direct { sk, newstate, f };
        emit(&s, f, sk as u64, oldstate, newstate, true);
    }
    // After the step itself, which may be a loopback connect's abort (dropped).
    if loopback::lean() && (newstate == cfg(&f.close_state) || newstate == cfg(&f.syn_recv_state)) {
        loopback::forget(sk as u64);
    }
    0
}

struct Direct {
    sk: *const u8,
    newstate: i32,
    f: &'static Fields,
}

impl Socket for Direct {
    #[inline(always)]
    fn netns(&self) -> Ns {
        btf_sock_netns(self.sk)
    }

    #[inline(always)]
    fn tuple(&self, t: &mut Tuple) {
        btf_sock_tuple(self.sk, t);
        if t.sport == 0 && in_mask(cfg(&self.f.listener_closed_new), self.newstate) {
            t.sport = btf_inet_sport(self.sk);
        }
    }

    #[inline(always)]
    fn counters(&self, ev: &mut Event) {
        let k = &CONFIG.kernel;
        let tp = btf_tcp_sock(self.sk);
        if tp.is_null() {
            no_counters(ev);
            return;
        }
        ev.bytes_received = ld::<u64>(tp, cfg(&k.tcp_bytes_received)).unwrap_or(0);
        ev.bytes_sent = ld::<u64>(tp, cfg(&k.tcp_bytes_sent)).unwrap_or(0);
        ev.rcv_nxt = ld::<u32>(tp, cfg(&k.tcp_rcv_nxt)).unwrap_or(0);
        ev.copied_seq = ld::<u32>(tp, cfg(&k.tcp_copied_seq)).unwrap_or(0);
        ev.lrcvtime = ld::<u32>(tp, cfg(&k.tcp_lrcvtime)).unwrap_or(0);
        ev.lsndtime = ld::<u32>(tp, cfg(&k.tcp_lsndtime)).unwrap_or(0);
        ev.data_segs_in = ld::<u32>(tp, cfg(&k.tcp_data_segs_in)).unwrap_or(0);
        ev.data_segs_out = ld::<u32>(tp, cfg(&k.tcp_data_segs_out)).unwrap_or(0);
        ev.snd_wl1 = ld::<u32>(tp, cfg(&k.tcp_snd_wl1)).unwrap_or(0);
        let una = ld::<u32>(tp, cfg(&k.tcp_snd_una)).unwrap_or(0);
        ev.unacked = ld::<u32>(tp, cfg(&k.tcp_snd_nxt))
            .unwrap_or(0)
            .wrapping_sub(una);
    }

    #[inline(always)]
    fn max_ack_backlog(&self) -> u32 {
        ld::<u32>(self.sk, cfg(&CONFIG.kernel.sock_max_ack_backlog)).unwrap_or(0)
    }

    #[inline(always)]
    fn failure(&self, ev: &mut Event) {
        let k = &CONFIG.kernel;
        let tp = btf_tcp_sock(self.sk);
        ev.syn_ms = if tp.is_null() {
            0
        } else {
            ld::<u32>(tp, cfg(&k.tcp_retrans_stamp)).unwrap_or(0)
        };
        ev.error = ld::<i32>(self.sk, cfg(&k.sock_err)).unwrap_or(0);
    }
}

/// The classic tracepoint, where tp_btf is unavailable.
#[tracepoint]
pub fn inet_sock_set_state(ctx: TracePointContext) -> u32 {
    if crate::util::attach_only() {
        return 0;
    }
    try_inet_sock_set_state(&ctx);
    0
}

fn try_inet_sock_set_state(ctx: &TracePointContext) -> Option<()> {
    let rec = Record::load(ctx, KIND);
    let f: Fields = cfg(&CONFIG.inet_sock_set_state);
    if rec.get::<u16>(f.protocol)? != IPPROTO_TCP {
        return None;
    }
    let oldstate = rec.get::<i32>(f.oldstate).unwrap_or(-1);
    let newstate = rec.get::<i32>(f.newstate).unwrap_or(-1);
    if newstate == f.close_state {
        crate::sock_length::on_close(rec.get::<u64>(f.skaddr).unwrap_or(0));
    } else if newstate == f.last_ack_state {
        crate::sock_length::on_proxy_close(rec.get::<u64>(f.skaddr).unwrap_or(0));
    } else if newstate == f.syn_recv_state {
        crate::sock_length::on_new_sock(rec.get::<u64>(f.skaddr).unwrap_or(0));
    }
    if !in_mask(f.emit_old, oldstate) {
        return None;
    }
    let skaddr = rec.get::<u64>(f.skaddr).unwrap_or(0);
    emit(
        &Probed {
            rec: &rec,
            skaddr,
            f,
        },
        &f,
        skaddr,
        oldstate,
        newstate,
        false,
    )
}

struct Probed<'a> {
    rec: &'a Record<'a>,
    skaddr: u64,
    f: Fields,
}

impl Socket for Probed<'_> {
    #[inline(always)]
    fn netns(&self) -> Ns {
        sock_netns(KIND, self.skaddr)
    }

    #[inline(always)]
    fn tuple(&self, t: &mut Tuple) {
        tp_tuple(self.rec, &self.f.addr, t);
    }

    #[inline(always)]
    fn counters(&self, ev: &mut Event) {
        let (sk, k) = (self.skaddr, &CONFIG.kernel);
        let u64_at = |off: u32| kread::<u64>(KIND, sk, off).unwrap_or(0);
        let u32_at = |off: u32| kread::<u32>(KIND, sk, off).unwrap_or(0);
        ev.bytes_received = u64_at(cfg(&k.tcp_bytes_received));
        ev.bytes_sent = u64_at(cfg(&k.tcp_bytes_sent));
        ev.rcv_nxt = u32_at(cfg(&k.tcp_rcv_nxt));
        ev.copied_seq = u32_at(cfg(&k.tcp_copied_seq));
        ev.lrcvtime = u32_at(cfg(&k.tcp_lrcvtime));
        ev.lsndtime = u32_at(cfg(&k.tcp_lsndtime));
        ev.data_segs_in = u32_at(cfg(&k.tcp_data_segs_in));
        ev.data_segs_out = u32_at(cfg(&k.tcp_data_segs_out));
        // Not read here (this program is at its verifier's limit on 5.10 and 6.1): 0, unknown.
        ev.snd_wl1 = 0;
        ev.unacked = 0;
    }

    #[inline(always)]
    fn max_ack_backlog(&self) -> u32 {
        kread::<u32>(KIND, self.skaddr, cfg(&CONFIG.kernel.sock_max_ack_backlog)).unwrap_or(0)
    }

    /// Never called: failures are read on tp_btf only (this program is at its verifier's
    /// limit on 5.10 and 6.1).
    #[inline(always)]
    fn failure(&self, _ev: &mut Event) {}
}
