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
}

impl StateMap {
    pub const ALL: [StateMap; 4] = [
        StateMap::Stops,
        StateMap::Starts,
        StateMap::Storms,
        StateMap::RefusalsWaiting,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            StateMap::Stops => "stops",
            StateMap::Starts => "starts",
            StateMap::Storms => "storms",
            StateMap::RefusalsWaiting => "refusals_waiting",
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
