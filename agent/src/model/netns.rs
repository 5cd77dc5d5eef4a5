//! A network namespace as kernel records name it. Its inode is what procfs shows
//! (`/proc/<pid>/ns/net`), but the kernel gives a freed namespace's inode to the next one made:
//! a container replaced at the same address (podman: the old one stopped, the new one started)
//! gets the old one's inode. Its cookie (`net.net_cookie`, 5.12+) is never reused while the
//! kernel runs, so records that carry it tell the two apart; procfs does not show it, so what
//! the agent learns from procfs has only the inode, and the cookie of a container's namespace
//! is learned from the records of its own processes (`enrich::attribute`).

/// A namespace by inode and cookie (0: unknown, as on kernels without one).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Netns {
    pub inum: u32,
    pub cookie: u64,
}

impl Netns {
    pub fn new(inum: u32, cookie: u64) -> Self {
        Self { inum, cookie }
    }

    /// Known by its inode only (procfs, or a kernel without cookies).
    pub fn by_inode(inum: u32) -> Self {
        Self { inum, cookie: 0 }
    }

    pub fn cookie(self) -> Option<u64> {
        (self.cookie != 0).then_some(self.cookie)
    }

    /// Whether a record of `self` may be of `other`: the same inode and, where both cookies
    /// are known, the same cookie.
    pub fn may_be(self, other: Netns) -> bool {
        self.inum == other.inum && cookies_agree(self.cookie, other.cookie)
    }
}

/// Whether two cookies (0: unknown) may name the same namespace.
pub fn cookies_agree(a: u64, b: u64) -> bool {
    a == 0 || b == 0 || a == b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reused_inode_is_another_namespace_once_both_cookies_are_known() {
        let old = Netns::new(4026532174, 41);
        let new = Netns::new(4026532174, 57);
        assert!(!new.may_be(old) && !old.may_be(new));
        assert!(old.may_be(old));
        // Without a cookie on either side, only the inode can tell.
        assert!(Netns::by_inode(4026532174).may_be(old));
        assert!(new.may_be(Netns::by_inode(4026532174)));
        assert!(!Netns::new(4026532175, 57).may_be(new));
        assert_eq!(
            (Netns::by_inode(1).cookie(), new.cookie()),
            (None, Some(57))
        );
    }
}
