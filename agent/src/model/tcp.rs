//! TCP states, resolved once when an event is decoded (from the names this kernel's tracefs
//! symbol tables give its numbers), so that nothing downstream compares strings.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TcpState {
    Established,
    SynSent,
    SynRecv,
    FinWait1,
    FinWait2,
    TimeWait,
    Close,
    CloseWait,
    LastAck,
    Listen,
    Closing,
    NewSynRecv,
    /// A state this build has no name for (a newer kernel's), by its number.
    Other(u32),
}

impl TcpState {
    const NAMED: [(TcpState, &'static str); 12] = [
        (TcpState::Established, "TCP_ESTABLISHED"),
        (TcpState::SynSent, "TCP_SYN_SENT"),
        (TcpState::SynRecv, "TCP_SYN_RECV"),
        (TcpState::FinWait1, "TCP_FIN_WAIT1"),
        (TcpState::FinWait2, "TCP_FIN_WAIT2"),
        (TcpState::TimeWait, "TCP_TIME_WAIT"),
        (TcpState::Close, "TCP_CLOSE"),
        (TcpState::CloseWait, "TCP_CLOSE_WAIT"),
        (TcpState::LastAck, "TCP_LAST_ACK"),
        (TcpState::Listen, "TCP_LISTEN"),
        (TcpState::Closing, "TCP_CLOSING"),
        (TcpState::NewSynRecv, "TCP_NEW_SYN_RECV"),
    ];

    /// The state a kernel symbol name stands for; `value` is its number on this kernel.
    pub fn from_kernel_name(name: Option<&str>, value: u32) -> Self {
        name.and_then(|n| Self::NAMED.iter().find(|(_, k)| *k == n))
            .map_or(TcpState::Other(value), |(s, _)| *s)
    }

    /// The kernel's name (`TCP_ESTABLISHED`), or None for a state without one here.
    pub fn name(self) -> Option<&'static str> {
        Self::NAMED
            .iter()
            .find(|(s, _)| *s == self)
            .map(|(_, n)| *n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_names_round_trip_and_unknown_names_keep_their_number() {
        for (s, n) in TcpState::NAMED {
            assert_eq!(TcpState::from_kernel_name(Some(n), 0), s);
            assert_eq!(s.name(), Some(n));
        }
        assert_eq!(
            TcpState::from_kernel_name(Some("TCP_BOUND_INACTIVE"), 13),
            TcpState::Other(13)
        );
        assert_eq!(TcpState::from_kernel_name(None, 7), TcpState::Other(7));
        assert_eq!(TcpState::Other(13).name(), None);
    }
}
