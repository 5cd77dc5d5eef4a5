//! A newc (SVR4, no CRC) cpio archive, the format the kernel unpacks an initramfs from
//! (`Documentation/driver-api/early-userspace/buffer-format.rst`): written here so the matrix
//! needs no `cpio` binary. Only what an initramfs needs: directories, files, symlinks and
//! character devices, owned by root, mtime 0 (the archive is reproducible).

use std::io::{self, Write};

/// One archive member.
pub enum Entry<'a> {
    Dir {
        path: &'a str,
    },
    File {
        path: &'a str,
        mode: u32,
        data: &'a [u8],
    },
    Symlink {
        path: &'a str,
        target: &'a str,
    },
    CharDev {
        path: &'a str,
        major: u32,
        minor: u32,
    },
}

pub struct Writer<W: Write> {
    out: W,
    written: u64,
    ino: u32,
}

impl<W: Write> Writer<W> {
    pub fn new(out: W) -> Self {
        Self {
            out,
            written: 0,
            ino: 1,
        }
    }

    pub fn add(&mut self, e: &Entry<'_>) -> io::Result<()> {
        let (path, mode, data, rdev) = match e {
            Entry::Dir { path } => (*path, 0o040_755, &[][..], (0, 0)),
            Entry::File { path, mode, data } => (*path, 0o100_000 | (mode & 0o7777), *data, (0, 0)),
            Entry::Symlink { path, target } => (*path, 0o120_777, target.as_bytes(), (0, 0)),
            Entry::CharDev { path, major, minor } => (*path, 0o020_600, &[][..], (*major, *minor)),
        };
        let nlink = if matches!(e, Entry::Dir { .. }) { 2 } else { 1 };
        self.member(path.trim_start_matches('/'), mode, nlink, data, rdev)
    }

    fn member(
        &mut self,
        name: &str,
        mode: u32,
        nlink: u32,
        data: &[u8],
        (rmaj, rmin): (u32, u32),
    ) -> io::Result<()> {
        let size = u32::try_from(data.len())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "member over 4 GiB"))?;
        let namesize = u32::try_from(name.len() + 1)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "name too long"))?;
        let ino = self.ino;
        self.ino += 1;
        let fields = [
            ino, mode, 0, 0, nlink, 0, size, 0, 0, rmaj, rmin, namesize, 0,
        ];
        let mut header = String::from("070701");
        for f in fields {
            header.push_str(&format!("{f:08x}"));
        }
        self.put(header.as_bytes())?;
        self.put(name.as_bytes())?;
        self.put(&[0])?;
        self.pad()?;
        self.put(data)?;
        self.pad()
    }

    fn put(&mut self, b: &[u8]) -> io::Result<()> {
        self.out.write_all(b)?;
        self.written += b.len() as u64;
        Ok(())
    }

    /// Header plus name, and data, each end on a 4-byte boundary.
    fn pad(&mut self) -> io::Result<()> {
        let n = (4 - self.written % 4) % 4;
        self.put(&[0; 3][..n as usize])
    }

    /// Writes the trailer and hands the output back.
    pub fn finish(mut self) -> io::Result<W> {
        self.member("TRAILER!!!", 0, 1, &[], (0, 0))?;
        self.out.flush()?;
        Ok(self.out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_are_newc_and_four_byte_aligned() {
        let mut w = Writer::new(Vec::new());
        w.add(&Entry::Dir { path: "/bin" }).unwrap();
        w.add(&Entry::File {
            path: "/bin/x",
            mode: 0o755,
            data: b"hello",
        })
        .unwrap();
        w.add(&Entry::Symlink {
            path: "/bin/sh",
            target: "busybox",
        })
        .unwrap();
        let out = w.finish().unwrap();
        assert_eq!(out.len() % 4, 0);
        // First header: magic, inode 1, directory mode, name "bin" (namesize 4).
        let h = std::str::from_utf8(&out[..110]).unwrap();
        assert!(h.starts_with("070701"));
        assert_eq!(&h[6..14], "00000001");
        assert_eq!(&h[14..22], "000041ed");
        assert_eq!(&h[94..102], "00000004");
        assert_eq!(&out[110..114], b"bin\0");
        // The file's data follows its 4-aligned name.
        let file = out.windows(5).position(|w| w == b"hello").unwrap();
        assert_eq!(file % 4, 0);
        let text = String::from_utf8_lossy(&out);
        assert!(text.contains("bin/sh\0"));
        assert!(text.contains("TRAILER!!!\0"));
        // The archive round-trips through busybox's reader (installed by setup).
        let dir = std::env::temp_dir().join(format!("dw-cpio-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut child = std::process::Command::new("busybox")
            .args(["cpio", "-i", "-d"])
            .current_dir(&dir)
            .stdin(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(&out).unwrap();
        assert!(child.wait().unwrap().success());
        assert_eq!(std::fs::read(dir.join("bin/x")).unwrap(), b"hello");
        assert_eq!(
            std::fs::read_link(dir.join("bin/sh")).unwrap(),
            std::path::Path::new("busybox")
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
