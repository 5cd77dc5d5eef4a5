use drainwatch_common::sched_process_exit::{Event, Fields};

use crate::capture::{
    event::{DecodeError, Exit, ExitStatus, Meta, read_record},
    tracefs::Resolver,
};

/// `group_dead` appeared in 6.x; without it the program uses the group leader's exit.
pub fn fields(r: &mut Resolver) -> Fields {
    let mut f = Fields::ABSENT;
    f.pid = r.required("pid", 4);
    f.group_dead = r.optional("group_dead", 1);
    f
}

pub fn decode(bytes: &[u8]) -> Result<Exit, DecodeError> {
    let e: Event = read_record("sched_process_exit", bytes)?;
    Ok(Exit {
        meta: Meta::from(&e.header),
        status: ExitStatus::from_wait_status(e.exit_code),
    })
}

#[cfg(test)]
mod tests {
    use drainwatch_common::{EventKind, config::NO_FIELD};

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
        let d = decode(&bytes_of(&e)).unwrap();
        assert_eq!(
            d.status,
            ExitStatus::Killed {
                signal: 9,
                core: false
            }
        );
        assert_eq!(d.status.shell_code(), Some(137));
    }
}
