//! The state directory (`--state-dir`): the correlator's checkpoint (open stops with their
//! timelines, recent records, learned check schedules), so that an agent restarted during a
//! deploy (a DaemonSet update of the agent itself) resumes the stops it had open. Written
//! atomically (a temporary file, fsync, rename) at most once a second and only when it
//! changed. It is encoded under the correlator's lock from borrowed records into one buffer the
//! agent keeps, compared with the last file by hash, and written after the lock is released:
//! no copy of the records and no fresh megabyte-sized buffer a second, which fragmented the
//! heap (the soak's RSS drift). Between writes the file's modification time is brought up to date, so a restart
//! knows when the agent stopped watching. A file that cannot be used (unreadable, corrupt,
//! another format, another boot: kernel monotonic times do not survive a reboot) is set aside
//! as `state.json.discarded` with one log line and a count, never a crash.

use std::{
    borrow::Cow,
    hash::{DefaultHasher, Hasher},
    io::Write,
    path::{Path, PathBuf},
    time::{Duration, SystemTime},
};

use serde::{Deserialize, Serialize};

use crate::{
    correlate::Checkpoint,
    model::{Mono, monotonic_now},
    telemetry::checkpoint::{CheckpointMetrics, Discard},
};

/// The file's format; another is set aside.
pub const FORMAT: u32 = 1;
const FILE: &str = "state.json";
/// How often the checkpoint is looked at.
pub const EVERY: Duration = Duration::from_secs(1);

#[derive(Serialize, Deserialize)]
struct StateFile<'a> {
    format: u32,
    /// `/proc/sys/kernel/random/boot_id`: the times inside are this boot's.
    boot_id: Cow<'a, str>,
    correlator: Checkpoint<'a>,
}

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("state directory {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("encoding the checkpoint: {0}")]
    Encode(#[from] serde_json::Error),
}

/// What a previous run left: its checkpoint, and when it last wrote or touched it.
pub struct Previous {
    pub checkpoint: Checkpoint<'static>,
    pub written_at: Mono,
}

/// Reads a state file's bytes (pure): the checkpoint, or why it cannot be used.
pub fn decode(bytes: &[u8], boot_id: &str) -> Result<Checkpoint<'static>, Discard> {
    #[derive(Deserialize)]
    struct Header {
        format: u32,
        boot_id: String,
    }
    let header: Header = serde_json::from_slice(bytes).map_err(|_| Discard::Corrupt)?;
    if header.format != FORMAT {
        return Err(Discard::Format);
    }
    if header.boot_id != boot_id {
        return Err(Discard::Boot);
    }
    let file: StateFile = serde_json::from_slice(bytes).map_err(|_| Discard::Corrupt)?;
    Ok(file.correlator)
}

pub struct StateDir {
    dir: PathBuf,
    boot_id: String,
    metrics: CheckpointMetrics,
    /// The file's bytes as last encoded; kept, so encoding allocates only when it grows.
    buf: Vec<u8>,
    /// The hash of the file last written, to write only what changed.
    last: Option<u64>,
    /// What `flush` has to do.
    pending: Pending,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Pending {
    Nothing,
    /// `buf` is the same as the file: bring its time up to date.
    Touch,
    /// `buf` differs from the file, whose hash is this.
    Write(u64),
}

impl StateDir {
    /// Creates the directory if need be; `procfs_root` gives the boot id.
    pub fn open(
        dir: &Path,
        procfs_root: &Path,
        metrics: CheckpointMetrics,
    ) -> Result<Self, CheckpointError> {
        let io = |source| CheckpointError::Io {
            path: dir.to_path_buf(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(io)?;
        let boot = procfs_root.join("sys/kernel/random/boot_id");
        let boot_id = std::fs::read_to_string(&boot)
            .map_err(|source| CheckpointError::Io { path: boot, source })?
            .trim()
            .to_string();
        Ok(Self {
            dir: dir.to_path_buf(),
            boot_id,
            metrics,
            buf: Vec::new(),
            last: None,
            pending: Pending::Nothing,
        })
    }

    fn path(&self) -> PathBuf {
        self.dir.join(FILE)
    }

    /// The previous run's checkpoint, if there is a usable one; an unusable one is set aside.
    pub fn load(&self) -> Option<Previous> {
        let path = self.path();
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(error) => {
                tracing::warn!(path = %path.display(), %error, "checkpoint unreadable; starting afresh");
                self.metrics.discarded(Discard::Unreadable);
                return None;
            }
        };
        match decode(&bytes, &self.boot_id) {
            Ok(checkpoint) => {
                let written_at = modified_mono(&path).unwrap_or_else(monotonic_now);
                Some(Previous {
                    checkpoint,
                    written_at,
                })
            }
            Err(reason) => {
                let aside = self.dir.join(format!("{FILE}.discarded"));
                let moved = std::fs::rename(&path, &aside).is_ok();
                tracing::warn!(path = %path.display(), reason = reason.as_str(), moved_to = %aside.display(), moved, "checkpoint set aside; starting afresh");
                self.metrics.discarded(reason);
                None
            }
        }
    }

    /// Encodes `cp` for the next `flush` (cheap: meant to run under the correlator's lock).
    pub fn encode(&mut self, cp: Checkpoint<'_>) -> Result<(), CheckpointError> {
        let file = StateFile {
            format: FORMAT,
            boot_id: Cow::Borrowed(&self.boot_id),
            correlator: cp,
        };
        self.buf.clear();
        self.pending = Pending::Nothing;
        serde_json::to_writer(&mut self.buf, &file)?;
        let mut h = DefaultHasher::new();
        h.write(&self.buf);
        let hash = h.finish();
        self.pending = if self.last == Some(hash) {
            Pending::Touch
        } else {
            Pending::Write(hash)
        };
        Ok(())
    }

    /// Writes what `encode` made if it changed since the last write, else brings the file's
    /// time up to date.
    pub fn flush(&mut self) -> Result<(), CheckpointError> {
        let path = self.path();
        let io = |source| CheckpointError::Io {
            path: path.clone(),
            source,
        };
        match std::mem::replace(&mut self.pending, Pending::Nothing) {
            Pending::Nothing => Ok(()),
            Pending::Touch => {
                let f = std::fs::File::options()
                    .write(true)
                    .open(&path)
                    .map_err(io)?;
                f.set_modified(SystemTime::now()).map_err(io)
            }
            Pending::Write(hash) => {
                let tmp = self.dir.join(format!("{FILE}.tmp"));
                let mut f = std::fs::File::create(&tmp).map_err(io)?;
                f.write_all(&self.buf).map_err(io)?;
                f.sync_all().map_err(io)?;
                drop(f);
                std::fs::rename(&tmp, &path).map_err(io)?;
                self.metrics.written(self.buf.len());
                self.last = Some(hash);
                Ok(())
            }
        }
    }

    /// `encode` then `flush`.
    pub fn save(&mut self, cp: Checkpoint<'_>) -> Result<(), CheckpointError> {
        self.encode(cp)?;
        self.flush()
    }

    /// Failures are logged and counted.
    pub fn logged(&mut self, result: Result<(), CheckpointError>) {
        if let Err(error) = result {
            self.metrics.write_failed();
            tracing::warn!(%error, "checkpoint not written");
        }
    }
}

/// A file's modification time on the kernel's monotonic clock (through the wall clock now).
fn modified_mono(path: &Path) -> Option<Mono> {
    let modified = std::fs::metadata(path).ok()?.modified().ok()?;
    let ago = SystemTime::now()
        .duration_since(modified)
        .unwrap_or_default();
    let ago = u64::try_from(ago.as_nanos()).unwrap_or(u64::MAX);
    Some(monotonic_now().saturating_sub(ago))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(format: u32, boot: &str) -> Vec<u8> {
        serde_json::to_vec(&StateFile {
            format,
            boot_id: boot.into(),
            correlator: Checkpoint::default(),
        })
        .unwrap()
    }

    #[test]
    fn a_file_of_another_boot_format_or_shape_is_refused_with_its_reason() {
        assert_eq!(decode(&file(FORMAT, "b1"), "b1"), Ok(Checkpoint::default()));
        assert_eq!(decode(&file(FORMAT, "b0"), "b1"), Err(Discard::Boot));
        assert_eq!(decode(&file(FORMAT + 1, "b1"), "b1"), Err(Discard::Format));
        assert_eq!(decode(b"{\"format\": 1", "b1"), Err(Discard::Corrupt));
        assert_eq!(decode(b"", "b1"), Err(Discard::Corrupt));
        let wrong = br#"{"format": 1, "boot_id": "b1", "correlator": {"tracker": 7}}"#;
        assert_eq!(decode(wrong, "b1"), Err(Discard::Corrupt));
    }

    #[test]
    fn saves_atomically_reloads_and_sets_a_corrupt_file_aside() {
        let dir = std::env::temp_dir().join(format!("dw-cp-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let proc_root = dir.join("proc");
        std::fs::create_dir_all(proc_root.join("sys/kernel/random")).unwrap();
        std::fs::write(proc_root.join("sys/kernel/random/boot_id"), "b1\n").unwrap();
        let metrics = || CheckpointMetrics::register(&mut Default::default());
        let state = dir.join("state");
        let mut sd = StateDir::open(&state, &proc_root, metrics()).unwrap();
        assert!(sd.load().is_none(), "nothing yet");
        use std::os::unix::fs::MetadataExt as _;
        let inode = || std::fs::metadata(state.join(FILE)).unwrap().ino();
        let cp = Checkpoint::default();
        sd.save(cp.clone()).unwrap();
        let first = inode();
        sd.save(cp.clone()).unwrap();
        assert_eq!(inode(), first, "unchanged: only touched, not written again");
        let mut changed = cp.clone();
        let stop = crate::model::stop::Stop::new("s-1".into(), Default::default());
        changed.tracker.stops.push(Cow::Owned(stop));
        sd.save(changed.clone()).unwrap();
        assert_ne!(inode(), first, "changed: a new file renamed in place");
        let back = sd.load().expect("reloads");
        assert_eq!(back.checkpoint, changed);
        assert!(back.written_at <= monotonic_now());
        std::fs::write(state.join(FILE), b"garbage").unwrap();
        assert!(sd.load().is_none());
        assert!(state.join("state.json.discarded").exists());
        assert!(!state.join(FILE).exists());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
