//! `cgroup:cgroup_rmdir`: the format fields its program reads, and `CgroupRemoved`, what its
//! records decode to.

use drainwatch_common::cgroup_rmdir::{Event, Fields};

use crate::capture::{
    event::{DecodeError, KernelNames, Meta, c_string, read_record},
    tracefs::Resolver,
};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupRemoved {
    pub meta: Meta,
    pub id: u64,
    /// Hierarchy id: 0 is cgroup v2.
    pub hierarchy: i32,
    pub level: i32,
    pub path: String,
}

pub fn fields(r: &mut Resolver) -> Fields {
    let mut f = Fields::ABSENT;
    f.id = r.required("id", 8);
    f.path = r.required("path", 4);
    f.root = r.optional("root", 4);
    f.level = r.optional("level", 4);
    f
}

pub fn decode(bytes: &[u8], _names: &KernelNames) -> Result<CgroupRemoved, DecodeError> {
    let e: Event = read_record("cgroup_rmdir", bytes)?;
    let len = (e.path_len as usize).min(e.path.len());
    Ok(CgroupRemoved {
        meta: Meta::from(&e.header),
        id: e.id,
        hierarchy: e.root,
        level: e.level,
        path: c_string(&e.path[..len]),
    })
}

#[cfg(test)]
mod tests {
    use drainwatch_common::{EventKind, cgroup_rmdir::PATH_LEN};

    use super::*;
    use crate::capture::{
        event::tests::{bytes_of, header},
        tracefs::tests::fixture,
    };

    #[test]
    fn fields_on_6_18() {
        let fmt = fixture("6.18", "cgroup_rmdir");
        let mut r = Resolver::new(&fmt);
        let f = fields(&mut r);
        assert_eq!((f.root, f.level, f.id, f.path), (8, 12, 16, 24));
    }

    #[test]
    fn decodes_a_podman_cgroup_path() {
        let p = b"/libpod_parent/libpod-0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
        let mut path = [0u8; PATH_LEN];
        path[..p.len()].copy_from_slice(p);
        let e = Event {
            header: header(EventKind::CgroupRmdir),
            id: 9001,
            root: 0,
            level: 2,
            path_len: p.len() as u32 + 1,
            _pad: 0,
            path,
        };
        let d = decode(&bytes_of(&e), &KernelNames::default()).unwrap();
        assert_eq!(d.path.as_bytes(), p);
        assert_eq!((d.id, d.hierarchy, d.level), (9001, 0, 2));
        // A length past the buffer (corrupt record) is clamped, not trusted.
        let mut bad = e;
        bad.path_len = 10_000;
        assert_eq!(
            decode(&bytes_of(&bad), &KernelNames::default())
                .unwrap()
                .path
                .as_bytes(),
            p
        );
    }
}
