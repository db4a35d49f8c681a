//! Files that are either wholly written or not there at all: [`write_atomic`].
//!
//! A state file or a checkpoint must never be replaced by half of a new one (a crash, a full
//! disk, a kill in the middle of a write). [`write_atomic`] writes into a temporary file next
//! to the target (same directory, so the same file system), flushes it to disk (`fsync`),
//! renames it over the target (atomic on POSIX file systems), then syncs the directory so the
//! rename itself survives a crash. On any error the temporary file is removed and the target
//! is untouched. It knows nothing about what the bytes mean.

use std::fs::{self, File};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// A temporary name next to `path`, unique in this process.
fn temporary(path: &Path) -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let name = path.file_name().map_or_else(|| "file".into(), |n| n.to_string_lossy().into_owned());
    path.with_file_name(format!(".{name}.tmp-{}-{n}", std::process::id()))
}

/// Writes `path` atomically: `write` fills a buffered writer on a temporary file, which is
/// synced and renamed over `path` only if `write` succeeds (see the module docs).
pub fn write_atomic<T>(path: &Path, write: impl FnOnce(&mut dyn Write) -> io::Result<T>) -> io::Result<T> {
    let tmp = temporary(path);
    let result = (|| {
        let file = File::create(&tmp)?;
        let mut out = BufWriter::with_capacity(1 << 20, file);
        let value = write(&mut out)?;
        let file = out.into_inner().map_err(io::IntoInnerError::into_error)?;
        file.sync_all()?;
        drop(file);
        fs::rename(&tmp, path)?;
        Ok(value)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
        return result;
    }
    // The rename is durable once the directory is synced (best effort where a directory
    // cannot be opened).
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        if let Ok(d) = File::open(dir) {
            let _ = d.sync_all();
        }
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("synkv-durable-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_write_replaces_the_file_whole() {
        let d = dir("whole");
        let p = d.join("f.bin");
        write_atomic(&p, |w| w.write_all(b"first")).unwrap();
        write_atomic(&p, |w| w.write_all(b"second version")).unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"second version");
        assert_eq!(fs::read_dir(&d).unwrap().count(), 1, "no temporary file left");
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_failed_write_leaves_the_old_file_and_no_temporary() {
        let d = dir("failed");
        let p = d.join("f.bin");
        write_atomic(&p, |w| w.write_all(b"good")).unwrap();
        let err = write_atomic(&p, |w| {
            w.write_all(b"half of a new ")?;
            Err::<(), _>(io::Error::other("disk full"))
        });
        assert!(err.is_err());
        assert_eq!(fs::read(&p).unwrap(), b"good", "the good file is untouched");
        assert_eq!(fs::read_dir(&d).unwrap().count(), 1, "the temporary file was removed");
        fs::remove_dir_all(&d).unwrap();
    }
}
