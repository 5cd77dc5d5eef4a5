//! The agent's own state that grows with traffic or containers: each collection with its cap
//! and what the cap dropped, for `drainwatch_state_*`.

/// A capped collection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StateMap {
    /// Stop records (settled ones evicted first).
    Stops,
    /// Start records (settled ones evicted first).
    Starts,
    /// Finished reconnect storms.
    Storms,
    /// Refused connects waiting for the listen that names their start.
    RefusalsWaiting,
    /// Proxies' open connections to containers (closed ones leave at their close event).
    Upstreams,
    /// Containers' inbound connections followed to their close.
    InboundSockets,
    /// Connect attempts answered with RST, until their socket closes.
    RefusedAttempts,
    /// Connects to containers' addresses from their SYN to their next step (a failed one is
    /// dated at its SYN; a drop only dates it when it failed instead).
    Connecting,
    /// Processes known to be in no container, until they exit.
    NotContainers,
    /// Connections the exit closed, waiting for their client's return (a lost session).
    SessionsWaiting,
    /// Connects in flight to stopped containers' addresses, which their stops wait for.
    AttemptsInFlight,
}

impl StateMap {
    pub const ALL: [StateMap; 11] = [
        StateMap::Stops,
        StateMap::Starts,
        StateMap::Storms,
        StateMap::RefusalsWaiting,
        StateMap::Upstreams,
        StateMap::InboundSockets,
        StateMap::RefusedAttempts,
        StateMap::Connecting,
        StateMap::NotContainers,
        StateMap::SessionsWaiting,
        StateMap::AttemptsInFlight,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            StateMap::Stops => "stops",
            StateMap::Starts => "starts",
            StateMap::Storms => "storms",
            StateMap::RefusalsWaiting => "refusals_waiting",
            StateMap::Upstreams => "upstreams",
            StateMap::InboundSockets => "inbound_sockets",
            StateMap::RefusedAttempts => "refused_attempts",
            StateMap::Connecting => "connecting",
            StateMap::NotContainers => "not_containers",
            StateMap::SessionsWaiting => "sessions_waiting",
            StateMap::AttemptsInFlight => "attempts_in_flight",
        }
    }
}

/// One collection's size, cap and how many entries the cap dropped so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateStat {
    pub map: StateMap,
    pub entries: usize,
    pub capacity: usize,
    pub dropped: u64,
}

/// Makes room in `map`, at its `cap`, for one more key: drops an entry (any: a hash map has no
/// order; past the cap the likely one outlived its close event, lost on the way), counted in
/// `dropped`. Nothing when `key` is in already.
pub fn make_room<K, V, S>(
    map: &mut std::collections::HashMap<K, V, S>,
    cap: usize,
    key: &K,
    dropped: &mut u64,
) where
    K: Eq + std::hash::Hash + Clone,
    S: std::hash::BuildHasher,
{
    if map.len() < cap || map.contains_key(key) {
        return;
    }
    if let Some(victim) = map.keys().next().cloned() {
        map.remove(&victim);
        *dropped += 1;
    }
}

/// `make_room` for a set.
pub fn make_room_in_set<K, S>(
    set: &mut std::collections::HashSet<K, S>,
    cap: usize,
    key: &K,
    dropped: &mut u64,
) where
    K: Eq + std::hash::Hash + Clone,
    S: std::hash::BuildHasher,
{
    if set.len() < cap || set.contains(key) {
        return;
    }
    if let Some(victim) = set.iter().next().cloned() {
        set.remove(&victim);
        *dropped += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn room_is_made_at_the_cap_only_and_counted() {
        let mut m: std::collections::HashMap<u32, ()> = (0..3).map(|k| (k, ())).collect();
        let mut dropped = 0;
        make_room(&mut m, 4, &9, &mut dropped);
        assert_eq!((m.len(), dropped), (3, 0));
        make_room(&mut m, 3, &1, &mut dropped);
        assert_eq!((m.len(), dropped), (3, 0), "already in");
        make_room(&mut m, 3, &9, &mut dropped);
        assert_eq!((m.len(), dropped), (2, 1));
        let mut s: std::collections::HashSet<u32> = (0..3).collect();
        make_room_in_set(&mut s, 3, &9, &mut dropped);
        assert_eq!((s.len(), dropped), (2, 2));
    }
}
