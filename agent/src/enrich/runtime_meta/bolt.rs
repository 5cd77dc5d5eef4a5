//! A read-only reader for the one thing asked of a bbolt database (podman's
//! `bolt_state.db`): the value under a key inside nested buckets. It follows the B+tree from
//! the newest valid meta page, so pages that older transactions freed (which still hold
//! removed containers' configs) are never seen. Every offset is bounds-checked: the file may be
//! torn or not bbolt at all.

const MAGIC: u32 = 0xED0C_DAED;
const VERSION: u32 = 2;
const PAGE_HEADER: usize = 16;
const ELEMENT: usize = 16;
const BRANCH_PAGE: u16 = 0x01;
const LEAF_PAGE: u16 = 0x02;
const BUCKET_LEAF: u32 = 0x01;
/// B+trees this deep would hold far more than any state file; deeper means a cycle.
const MAX_DEPTH: usize = 32;

/// An opened database: the file's bytes and where its newest root bucket is.
pub struct Db<'a> {
    data: &'a [u8],
    page_size: usize,
    root: u64,
}

/// Where a B+tree node lives: a file page, or inline in its parent bucket's value.
#[derive(Clone, Copy)]
enum Node<'a> {
    Page(u64),
    Inline(&'a [u8]),
}

impl<'a> Db<'a> {
    /// Reads the two meta pages and keeps the valid one of the newest transaction.
    pub fn open(data: &'a [u8]) -> Result<Self, &'static str> {
        // Page 0's meta says the page size that locates page 1's.
        let page_size = meta(data, 0)
            .map(|m| m.page_size)
            .ok_or("no valid meta page")?;
        [0, page_size]
            .into_iter()
            .filter_map(|offset| meta(data, offset))
            .filter(|m| m.page_size == page_size)
            .max_by_key(|m| m.txid)
            .map(|m| Db {
                data,
                page_size,
                root: m.root,
            })
            .ok_or("no valid meta page")
    }

    /// The value of `key` in the bucket reached through `buckets`, None when absent.
    pub fn get(&self, buckets: &[&[u8]], key: &[u8]) -> Result<Option<&'a [u8]>, &'static str> {
        let mut node = Node::Page(self.root);
        for name in buckets {
            match self.find(node, name, 0)? {
                Some((flags, value)) if flags & BUCKET_LEAF != 0 => node = bucket_root(value)?,
                _ => return Ok(None),
            }
        }
        Ok(self
            .find(node, key, 0)?
            .filter(|(flags, _)| flags & BUCKET_LEAF == 0)
            .map(|(_, v)| v))
    }

    fn page(&self, id: u64) -> Result<&'a [u8], &'static str> {
        let start = usize::try_from(id)
            .ok()
            .and_then(|id| id.checked_mul(self.page_size))
            .ok_or("page id out of range")?;
        let header = self
            .data
            .get(start..start + PAGE_HEADER)
            .ok_or("page beyond the file")?;
        let overflow = u32_at(header, 12).ok_or("short page header")? as usize;
        let len = overflow
            .checked_add(1)
            .and_then(|n| n.checked_mul(self.page_size))
            .ok_or("page too large")?;
        // The last page of a file may be shorter than its overflow claims if torn.
        let end = start.saturating_add(len).min(self.data.len());
        self.data.get(start..end).ok_or("page beyond the file")
    }

    /// Finds `key` in the B+tree at `node`: its leaf flags and value.
    fn find(
        &self,
        node: Node<'a>,
        key: &[u8],
        depth: usize,
    ) -> Result<Option<(u32, &'a [u8])>, &'static str> {
        if depth > MAX_DEPTH {
            return Err("tree too deep");
        }
        let page = match node {
            Node::Page(id) => self.page(id)?,
            Node::Inline(bytes) => bytes,
        };
        let flags = u16_at(page, 8).ok_or("short page header")?;
        let count = usize::from(u16_at(page, 10).ok_or("short page header")?);
        if flags & LEAF_PAGE != 0 {
            for i in 0..count {
                let at = PAGE_HEADER + i * ELEMENT;
                let (eflags, pos, ksize, vsize) = (
                    u32_at(page, at),
                    u32_at(page, at + 4),
                    u32_at(page, at + 8),
                    u32_at(page, at + 12),
                );
                let (Some(eflags), Some(pos), Some(ksize), Some(vsize)) =
                    (eflags, pos, ksize, vsize)
                else {
                    return Err("short leaf element");
                };
                let k_start = at + pos as usize;
                let k_end = k_start + ksize as usize;
                let k = page.get(k_start..k_end).ok_or("leaf key beyond the page")?;
                if k == key {
                    let value = page
                        .get(k_end..k_end + vsize as usize)
                        .ok_or("leaf value beyond the page")?;
                    return Ok(Some((eflags, value)));
                }
            }
            return Ok(None);
        }
        if flags & BRANCH_PAGE == 0 || matches!(node, Node::Inline(_)) {
            return Err("neither a branch nor a leaf page");
        }
        // The child to descend into is the last whose first key is <= key (bbolt's rule).
        let mut child = None;
        for i in 0..count {
            let at = PAGE_HEADER + i * ELEMENT;
            let (Some(pos), Some(ksize), Some(pgid)) =
                (u32_at(page, at), u32_at(page, at + 4), u64_at(page, at + 8))
            else {
                return Err("short branch element");
            };
            let k_start = at + pos as usize;
            let k = page
                .get(k_start..k_start + ksize as usize)
                .ok_or("branch key beyond the page")?;
            if i > 0 && k > key {
                break;
            }
            child = Some(pgid);
        }
        match child {
            Some(pgid) => self.find(Node::Page(pgid), key, depth + 1),
            None => Ok(None),
        }
    }
}

/// A bucket value: its root page, or (root 0) an inline page right after the header.
fn bucket_root(value: &[u8]) -> Result<Node<'_>, &'static str> {
    match u64_at(value, 0).ok_or("short bucket header")? {
        0 => Ok(Node::Inline(value.get(16..).ok_or("short inline bucket")?)),
        root => Ok(Node::Page(root)),
    }
}

struct Meta {
    page_size: usize,
    root: u64,
    txid: u64,
}

/// The meta page at `offset`, None unless its magic, version and checksum hold.
fn meta(data: &[u8], offset: usize) -> Option<Meta> {
    let m = data.get(offset + PAGE_HEADER..offset + PAGE_HEADER + 64)?;
    let valid =
        u32_at(m, 0)? == MAGIC && u32_at(m, 4)? == VERSION && u64_at(m, 56)? == fnv1a64(&m[..56]);
    let page_size = u32_at(m, 8)? as usize;
    (valid && page_size >= 512).then_some(Meta {
        page_size,
        root: u64_at(m, 16)?,
        txid: u64_at(m, 48)?,
    })
}

fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

// bbolt writes native-endian integers; every platform podman runs on is little-endian.
fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}
fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}
fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use crate::enrich::runtime_meta::{bolt, from_podman, test_support::*};

    #[test]
    fn bolt_reader_sees_live_containers_only() {
        let db = fixture_bytes("podman/bolt_state.db");
        let Ok(db) = bolt::Db::open(&db) else {
            panic!("fixture database does not open")
        };
        let labels = |id: &str| {
            db.get(&[b"ctr", id.as_bytes()], b"config")
                .ok()
                .flatten()
                .and_then(|c| serde_json::from_slice::<Value>(c).ok())
                .and_then(|c| c.get("labels").cloned())
        };
        assert_eq!(labels(PODMAN_WEB), Some(serde_json::json!({"app": "web"})));
        assert_eq!(labels(PODMAN_REMOVED), None);
        // A key that is a bucket is not a value, and the other way round.
        assert_eq!(db.get(&[], b"ctr").ok(), Some(None));
        assert_eq!(
            db.get(&[b"ctr", PODMAN_WEB.as_bytes(), b"config"], b"x")
                .ok(),
            Some(None)
        );
    }

    #[test]
    fn bolt_reader_survives_garbage() {
        let db = fixture_bytes("podman/bolt_state.db");
        assert!(bolt::Db::open(&[]).is_err());
        // The first meta page fits in 100 bytes; the tree it points to does not.
        if let Ok(d) = bolt::Db::open(&db[..100]) {
            assert!(d.get(&[b"ctr", PODMAN_WEB.as_bytes()], b"config").is_err());
        }
        assert!(bolt::Db::open(b"{\"not\":\"bolt\"}").is_err());
        // Truncated after the meta pages, and every single-byte corruption of the first pages:
        // errors or answers, never a panic.
        for len in [8192, 12288, 20000, db.len() / 2] {
            if let Ok(d) = bolt::Db::open(&db[..len]) {
                let _ = d.get(&[b"ctr", PODMAN_WEB.as_bytes()], b"config");
            }
        }
        let mut bad = db.clone();
        for at in (8192..bad.len()).step_by(97) {
            let saved = bad[at];
            bad[at] = saved.wrapping_add(0x5b);
            if let Ok(d) = bolt::Db::open(&bad) {
                let _ = d.get(&[b"ctr", PODMAN_WEB.as_bytes()], b"config");
            }
            bad[at] = saved;
        }
        assert!(
            from_podman(
                &fixture("podman/containers.json"),
                PODMAN_WEB,
                Some(&db[..5000])
            )
            .is_ok()
        );
        assert!(from_podman("[{\"id\":", PODMAN_WEB, None).is_err());
    }
}
