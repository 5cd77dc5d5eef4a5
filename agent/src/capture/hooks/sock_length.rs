//! `sock_length` (tp_btf on `sock:sock_send_length` and `sock:sock_recv_length`): what a
//! proxy's worker did on an upstream socket around a cut, as `UpstreamIo`. The programs read
//! no format fields: the tracepoints' BTF prototypes give `(sk, ret, flags)`.

use drainwatch_common::sock_length::{Event, Phase};

use crate::capture::event::{DecodeError, KernelNames, Meta, read_record};

use crate::model::Mono;

/// One step of a request on a proxy's upstream socket (see `drainwatch_common::sock_length`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamIo {
    /// `meta.pid` is the worker thread, `meta.tgid` the proxy.
    pub meta: Meta,
    pub skaddr: u64,
    pub step: IoStep,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoStep {
    /// The worker found the connection cut with a request of `bytes` unanswered (`ret`: 0 for
    /// EOF, else -errno).
    Cut {
        bytes: u64,
        started_at: Mono,
        ret: i32,
    },
    /// The worker's next upstream action after the cut on `cut_sock` started a request here.
    RetryStarted {
        cut_sock: u64,
        cut_at: Mono,
        started_at: Mono,
    },
    /// That request was sent whole: `bytes`.
    RetryEnded {
        cut_sock: u64,
        bytes: u64,
        started_at: Mono,
    },
    /// A server's answer on a connection accepted in a storming namespace (`meta.netns`) on
    /// listener `port`: its `index`-th exchange (0 first), answering the client's data at
    /// `data_at` (the accept, if the server spoke first); `meta.ts_ns` is the answer.
    Answered {
        port: u16,
        accepted_at: Mono,
        data_at: Mono,
        index: u32,
    },
}

pub fn decode(bytes: &[u8], _names: &KernelNames) -> Result<UpstreamIo, DecodeError> {
    let e: Event = read_record("sock_length", bytes)?;
    let step = match Phase::from_u32(e.phase) {
        Some(Phase::Cut) => IoStep::Cut {
            bytes: e.req_bytes,
            started_at: e.req_start_ns,
            ret: e.ret,
        },
        Some(Phase::RetryStart) => IoStep::RetryStarted {
            cut_sock: e.cut_sk,
            cut_at: e.cut_at_ns,
            started_at: e.req_start_ns,
        },
        Some(Phase::RetryEnd) => IoStep::RetryEnded {
            cut_sock: e.cut_sk,
            bytes: e.req_bytes,
            started_at: e.req_start_ns,
        },
        Some(Phase::Answered) => IoStep::Answered {
            port: e.cut_sk as u16,
            accepted_at: e.cut_at_ns,
            data_at: e.req_start_ns,
            index: e.req_bytes as u32,
        },
        None => return Err(DecodeError::UnknownPhase(e.phase)),
    };
    Ok(UpstreamIo {
        meta: Meta::from(&e.header),
        skaddr: e.skaddr,
        step,
    })
}

#[cfg(test)]
mod tests {
    use drainwatch_common::EventKind;

    use super::*;
    use crate::capture::event::{
        decode as decode_any,
        tests::{bytes_of, header},
    };

    fn event(phase: u32) -> Event {
        Event {
            header: header(EventKind::SockLength),
            skaddr: 0xe1,
            cut_sk: 0xd0,
            req_bytes: 120,
            req_start_ns: 5_000,
            cut_at_ns: 4_000,
            phase,
            ret: -104,
        }
    }

    #[test]
    fn decodes_each_phase_with_the_worker_thread() {
        let names = KernelNames::default();
        let cut = decode(&bytes_of(&event(Phase::Cut as u32)), &names).unwrap();
        assert_eq!(
            (cut.meta.pid, cut.meta.tgid, cut.skaddr),
            (1001, 1000, 0xe1)
        );
        assert_eq!(
            cut.step,
            IoStep::Cut {
                bytes: 120,
                started_at: 5_000,
                ret: -104
            }
        );
        let start = decode(&bytes_of(&event(Phase::RetryStart as u32)), &names).unwrap();
        assert_eq!(
            start.step,
            IoStep::RetryStarted {
                cut_sock: 0xd0,
                cut_at: 4_000,
                started_at: 5_000
            }
        );
        let end = decode(&bytes_of(&event(Phase::RetryEnd as u32)), &names).unwrap();
        assert_eq!(
            end.step,
            IoStep::RetryEnded {
                cut_sock: 0xd0,
                bytes: 120,
                started_at: 5_000
            }
        );
    }

    #[test]
    fn dispatches_by_kind_and_rejects_unknown_phases() {
        let names = KernelNames::default();
        let any = decode_any(&bytes_of(&event(Phase::Cut as u32)), &names).unwrap();
        assert_eq!(any.kind(), EventKind::SockLength);
        assert_eq!(
            decode(&bytes_of(&event(9)), &names),
            Err(DecodeError::UnknownPhase(9))
        );
    }
}
