//! `sched:sched_process_exit`: the format fields its program reads, and `Exit` (with the
//! decoded wait status, `ExitStatus`), what its records decode to.

use drainwatch_common::sched_process_exit::{Event, Fields};

use crate::capture::{
    event::{DecodeError, KernelNames, Meta, read_record},
    tracefs::Resolver,
};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exit {
    pub meta: Meta,
    pub status: ExitStatus,
}

/// How a process ended, decoded from the kernel's wait status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitStatus {
    Exited(i32),
    Killed {
        signal: i32,
        core: bool,
    },
    /// BTF gave no offset for `task_struct.exit_code`.
    Unknown,
}

impl ExitStatus {
    pub fn from_wait_status(status: i32) -> Self {
        if status == drainwatch_common::ABSENT_U32 as i32 {
            return Self::Unknown;
        }
        match status & 0x7f {
            0 => Self::Exited((status >> 8) & 0xff),
            sig => Self::Killed {
                signal: sig,
                core: status & 0x80 != 0,
            },
        }
    }

    /// The shell's convention: the exit code, or 128 + the killing signal (143 for SIGTERM).
    pub fn shell_code(self) -> Option<i32> {
        match self {
            Self::Exited(c) => Some(c),
            Self::Killed { signal, .. } => Some(128 + signal),
            Self::Unknown => None,
        }
    }
}

/// `group_dead` appeared in 6.x; without it the program uses the group leader's exit.
pub fn fields(r: &mut Resolver) -> Fields {
    let mut f = Fields::ABSENT;
    f.pid = r.required("pid", 4);
    f.group_dead = r.optional("group_dead", 1);
    f
}

pub fn decode(bytes: &[u8], _names: &KernelNames) -> Result<Exit, DecodeError> {
    let e: Event = read_record("sched_process_exit", bytes)?;
    Ok(Exit {
        meta: Meta::from(&e.header),
        status: ExitStatus::from_wait_status(e.exit_code),
    })
}

#[cfg(test)]
mod tests {
    use drainwatch_common::{EventKind, fields::NO_FIELD};

    use super::*;
    use crate::capture::{
        event::tests::{bytes_of, header},
        tracefs::tests::fixture,
    };

    #[test]
    fn fields_on_6_18_and_6_1() {
        let fmt = fixture("6.18", "sched_process_exit");
        let mut r = Resolver::new(&fmt);
        let f = fields(&mut r);
        assert_eq!((f.pid, f.group_dead), (24, 32));
        let old = fixture("6.1", "sched_process_exit");
        let mut r = Resolver::new(&old);
        let f = fields(&mut r);
        assert_eq!((f.pid, f.group_dead), (24, NO_FIELD));
        assert_eq!(r.missing_optional, ["group_dead"]);
    }

    #[test]
    fn decodes_killed_by_sigkill() {
        let e = Event {
            header: header(EventKind::SchedProcessExit),
            exit_code: 9,
            group_dead: 1,
        };
        let d = decode(&bytes_of(&e), &KernelNames::default()).unwrap();
        assert_eq!(
            d.status,
            ExitStatus::Killed {
                signal: 9,
                core: false
            }
        );
        assert_eq!(d.status.shell_code(), Some(137));
    }

    #[test]
    fn exit_status_follows_wait_status_encoding() {
        assert_eq!(ExitStatus::from_wait_status(0), ExitStatus::Exited(0));
        assert_eq!(ExitStatus::from_wait_status(3 << 8), ExitStatus::Exited(3));
        let term = ExitStatus::from_wait_status(15);
        assert_eq!(
            term,
            ExitStatus::Killed {
                signal: 15,
                core: false
            }
        );
        assert_eq!(term.shell_code(), Some(143));
        assert_eq!(ExitStatus::from_wait_status(9).shell_code(), Some(137));
        assert_eq!(
            ExitStatus::from_wait_status(0x80 | 11),
            ExitStatus::Killed {
                signal: 11,
                core: true
            }
        );
        assert_eq!(ExitStatus::from_wait_status(-1), ExitStatus::Unknown);
        assert_eq!(ExitStatus::Unknown.shell_code(), None);
    }
}
