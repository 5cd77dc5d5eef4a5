//! Sessions the exit cut: a connection the container's exit closed (the process died with it
//! open: no request pending, quiet or not a stream) whose client connected again to the
//! workload moments later lost its session: a socket client (Socket.IO, a websocket) that
//! reconnects at once, whatever the connection's activity at the cut (a Socket.IO session is
//! quiet between its 25 s pings). Such a close is held until its client comes back (a lost
//! session) or the window passes (an idle close nobody came back for).
//!
//! Every other close by the container in its stop keeps its own kind (a request or a stream
//! cut, a stream ended at its rotation) but is held all the same: its client's return is a
//! first connection of the storm that follows.
//!
//! The client is its address: clients behind one address (a proxy, a NAT) are told apart by
//! count only, each arrival matching one held close. A keep-alive pool that reopens its
//! connections at once after the exit looks the same from the kernel, and counts too.

use std::{collections::VecDeque, net::IpAddr};

use super::Tracker;
use crate::model::{LossKind, Mono, Workload};

/// Closes held at once, beyond which the oldest is counted idle (a cap, counted).
pub const MAX_HELD: usize = 100_000;

#[derive(Debug)]
struct Close {
    key: String,
    workload: Workload,
    peer: IpAddr,
    at: Mono,
    age: Option<Mono>,
    /// Counted already (a request or a stream cut at exit): its client's return is only a
    /// first connection for the storm. None: idle or a lost session, decided by the return.
    counted: Option<LossKind>,
}

/// A client back at its workload: its first attempt after the close it was matched with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Return {
    pub workload: Workload,
    pub at: Mono,
    /// Other closes of the same address were held when it came back: clients behind one
    /// address, told apart by count only (which of them came back is not known).
    pub shared: bool,
}

#[derive(Debug, Default)]
pub(super) struct Sessions {
    /// Oldest first.
    held: VecDeque<Close>,
    /// Closes counted idle at the cap, before their window passed.
    pub(super) dropped: u64,
    /// Clients that came back (a lost session), for the storm they are part of: taken by
    /// the correlator after each observation.
    returns: Vec<Return>,
}

impl Tracker {
    /// Clients that came back since the last call: their workload and when.
    pub fn take_returns(&mut self) -> impl Iterator<Item = Return> + '_ {
        self.sessions.returns.drain(..)
    }

    /// Whether no close waits for its client (nothing to look up).
    pub(super) fn sessions_idle(&self) -> bool {
        self.sessions.held.is_empty()
    }

    /// Closes waiting for their client, and those the cap counted idle early.
    pub fn sessions_waiting(&self) -> (usize, u64) {
        (self.sessions.held.len(), self.sessions.dropped)
    }

    /// A close at exit: held for its client's return. `counted`: the loss it was counted as
    /// already, if any; else it was idle or a lost session.
    pub(super) fn hold_session(
        &mut self,
        key: &str,
        peer: IpAddr,
        at: Mono,
        age: Option<Mono>,
        counted: Option<LossKind>,
    ) {
        let Some(workload) = self.containers.get(key).map(|c| c.identity.workload_key()) else {
            return;
        };
        if self.sessions.held.len() >= MAX_HELD
            && let Some(old) = self.sessions.held.pop_front()
        {
            self.sessions.dropped += 1;
            if old.counted.is_none() {
                self.count(&old.key, LossKind::IdleClosed, None, old.at, old.age);
            }
        }
        self.sessions.held.push_back(Close {
            key: key.to_string(),
            workload,
            peer: peer.to_canonical(),
            at,
            age,
            counted,
        });
    }

    /// A client connected to container `key` at `at`, or tried and was refused there: the
    /// oldest held close of that client on its workload (within the window) was a lost
    /// session. Every inbound connection passes here: nothing is looked up while nothing is
    /// held.
    pub(super) fn session_returned(&mut self, key: &str, peer: IpAddr, at: Mono) {
        if self.sessions.held.is_empty() {
            return;
        }
        if let Some(workload) = self.containers.get(key).map(|c| c.identity.workload_key()) {
            self.returned_to(&workload, peer, at);
        }
    }

    /// A client came back to `workload` at `at` (its first attempt: refused by a replacement
    /// that did not listen yet, or connected).
    pub(super) fn returned_to(&mut self, workload: &Workload, peer: IpAddr, at: Mono) {
        let window = self.config.settle;
        // A dual-stack listener's peers are IPv4-mapped; a RST's are plain IPv4.
        let peer = peer.to_canonical();
        let mine = |c: &Close| {
            c.peer == peer && c.workload == *workload && c.at <= at && at <= c.at + window
        };
        let Some(i) = self.sessions.held.iter().position(mine) else {
            return;
        };
        let shared = self.sessions.held.iter().skip(i + 1).any(mine);
        if let Some(c) = self.sessions.held.remove(i) {
            if c.counted.is_none() {
                self.count(&c.key, LossKind::SessionsCut, None, c.at, c.age);
            }
            self.sessions.returns.push(Return {
                workload: c.workload,
                at,
                shared,
            });
        }
    }

    /// Closes whose window passed by `now` are idle. The window is the settle delay, so a
    /// close (at the latest at the cgroup's removal) is judged before its record settles.
    pub(super) fn expire_sessions(&mut self, now: Mono) {
        let window = self.config.settle;
        while self
            .sessions
            .held
            .front()
            .is_some_and(|c| now >= c.at + window)
        {
            if let Some(c) = self.sessions.held.pop_front()
                && c.counted.is_none()
            {
                self.count(&c.key, LossKind::IdleClosed, None, c.at, c.age);
            }
        }
    }
}
