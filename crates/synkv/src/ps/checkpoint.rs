//! Checkpoints of the servers' state: one *shard* file per server and a *manifest* per
//! checkpoint directory, both written atomically ([`crate::durable`]), both checksummed and
//! versioned. `docs/checkpoints.md` documents the same layout.
//!
//! A checkpoint is taken at one round boundary across all servers (`store::distributed`:
//! every worker has finished its own operations and waits at a barrier, so no sync round is
//! partly summed anywhere), written into `DIR/ckpt-<id>/shard-<rank>.bin`, and becomes the
//! current one when `DIR/MANIFEST.json` names it; older checkpoint directories are removed
//! after that, so a crash at any moment leaves the previous checkpoint whole.
//!
//! # Shard file (version 1)
//! | offset | size | field | value |
//! | --- | --- | --- | --- |
//! | 0 | 8 | magic | ASCII `SYNKVCKP` |
//! | 8 | 4 | version, u32 LE | `1` |
//! | 12 | 8 | header length `H`, u64 LE | |
//! | 20 | `H` | header, UTF-8 JSON ([`ShardHeader`]) | |
//! | 20 + `H` | … | each entry's value bytes (little-endian elements), in header order, then the optimizer states (`optimizer::format` bytes) | exactly the lengths the header gives |
//! | end − 4 | 4 | CRC-32 (IEEE) of every preceding byte, u32 LE | |
//!
//! Reading checks the magic, the version, every length against the file's size, and the
//! checksum; any mismatch is a typed error naming the file, and nothing is restored from it.
//!
//! # Manifest (`MANIFEST.json`)
//! `{"format": "synkv-checkpoint", "version": 1, "id": N, "dir": "ckpt-N", "round": R,
//! "created_unix": T, "num_servers": S, "num_workers": W, "sync": bool,
//! "shards": [{"rank": r, "file": "shard-r.bin", "bytes": B, "crc32": C}]}` — `round` is the
//! number of `push` calls rank 0 had made when the checkpoint was taken (training steps, in
//! a job that pushes once per step).

use std::fs::File;
use std::io::{self, BufReader, Read, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::durable::write_atomic;

/// The magic of a shard file.
pub const SHARD_MAGIC: &[u8; 8] = b"SYNKVCKP";
/// The shard format version this build writes and reads.
pub const SHARD_VERSION: u32 = 1;
/// The manifest's name in a checkpoint directory.
pub const MANIFEST: &str = "MANIFEST.json";
/// The manifest's `format` field.
const FORMAT: &str = "synkv-checkpoint";

/// Why a checkpoint could not be written or read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckpointError {
    /// The file system refused.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The file is not a whole checkpoint of this format.
    #[error("{path} is not a valid synkv checkpoint file: {problem}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        problem: String,
    },
}

fn corrupt(path: &Path, problem: impl Into<String>) -> CheckpointError {
    CheckpointError::Corrupt { path: path.to_owned(), problem: problem.into() }
}

/// One key part in a shard.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EntryDesc {
    /// The ps key.
    pub ps: u64,
    /// The part's first unit within the key.
    pub offset: u64,
    /// The key's display name.
    pub name: String,
    /// Element type (`f32`, `f64`, `f16`, `bf16`).
    pub dtype: String,
    /// Elements of the part's value.
    pub len: u64,
    /// Row length of a row_sparse key's part.
    pub row_len: Option<u64>,
    /// The sync round being collected when the checkpoint was taken (rounds completed).
    pub round: u64,
}

/// The JSON header of a shard file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShardHeader {
    /// The server's rank.
    pub rank: u32,
    /// Servers in the job.
    pub num_servers: u32,
    /// The checkpoint's id.
    pub id: u64,
    /// Sync (true) or async mode.
    pub sync: bool,
    /// The installed optimizer's JSON, if any.
    pub optimizer: Option<String>,
    /// The key parts, in the order of their values in the file.
    pub entries: Vec<EntryDesc>,
    /// Bytes of the optimizer states after the values (0 without an optimizer).
    pub states_len: u64,
}

/// A shard read back: its header, each entry's value bytes, the optimizer states.
#[derive(Debug)]
pub struct Shard {
    /// The header.
    pub header: ShardHeader,
    /// Each entry's value bytes, in header order.
    pub values: Vec<Vec<u8>>,
    /// The optimizer states (`optimizer::format`), empty without an optimizer.
    pub states: Vec<u8>,
}

/// A writer that checksums what passes through it.
struct Crc<'a> {
    inner: &'a mut dyn Write,
    hasher: crc32fast::Hasher,
    bytes: u64,
}

impl Write for Crc<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// What a written shard looks like from outside (for the manifest).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShardFile {
    /// The server's rank.
    pub rank: u32,
    /// The file's name in the checkpoint directory.
    pub file: String,
    /// Its size.
    pub bytes: u64,
    /// Its checksum (the last four bytes).
    pub crc32: u32,
}

/// The shard file name of server `rank`.
pub fn shard_name(rank: u32) -> String {
    format!("shard-{rank}.bin")
}

/// Writes server `header.rank`'s shard into `dir` (created if needed), atomically: `values`
/// are the entries' value bytes in header order, `states` the optimizer states.
pub fn write_shard(dir: &Path, header: &ShardHeader, values: &[&[u8]], states: &[u8]) -> Result<ShardFile, CheckpointError> {
    std::fs::create_dir_all(dir).map_err(|source| CheckpointError::Io { action: "creating", path: dir.to_owned(), source })?;
    let name = shard_name(header.rank);
    let path = dir.join(&name);
    let json = serde_json::to_vec(header).map_err(|e| corrupt(&path, format!("the header does not serialise: {e}")))?;
    let written = write_atomic(&path, |w| {
        let mut out = Crc { inner: w, hasher: crc32fast::Hasher::new(), bytes: 0 };
        out.write_all(SHARD_MAGIC)?;
        out.write_all(&SHARD_VERSION.to_le_bytes())?;
        out.write_all(&(json.len() as u64).to_le_bytes())?;
        out.write_all(&json)?;
        for v in values {
            out.write_all(v)?;
        }
        out.write_all(states)?;
        let crc = out.hasher.clone().finalize();
        let bytes = out.bytes + 4;
        out.inner.write_all(&crc.to_le_bytes())?;
        Ok((bytes, crc))
    });
    let (bytes, crc32) = written.map_err(|source| CheckpointError::Io { action: "writing", path: path.clone(), source })?;
    Ok(ShardFile { rank: header.rank, file: name, bytes, crc32 })
}

/// Reads and verifies a shard file (streaming: the values are read straight into their
/// vectors, the checksum checked at the end).
pub fn read_shard(path: &Path) -> Result<Shard, CheckpointError> {
    let io_err = |source| CheckpointError::Io { action: "reading", path: path.to_owned(), source };
    let file = File::open(path).map_err(io_err)?;
    let size = file.metadata().map_err(io_err)?.len();
    let mut r = BufReader::with_capacity(1 << 20, file);
    let mut hasher = crc32fast::Hasher::new();
    let mut read = |buf: &mut [u8]| -> Result<(), CheckpointError> {
        r.read_exact(buf).map_err(|e| if e.kind() == io::ErrorKind::UnexpectedEof { corrupt(path, "truncated") } else { io_err(e) })?;
        hasher.update(buf);
        Ok(())
    };
    let mut fixed = [0u8; 20];
    if size < 24 {
        return Err(corrupt(path, format!("{size} bytes is shorter than the 24-byte frame")));
    }
    read(&mut fixed)?;
    if &fixed[..8] != SHARD_MAGIC {
        return Err(corrupt(path, "bad magic"));
    }
    let version = u32::from_le_bytes([fixed[8], fixed[9], fixed[10], fixed[11]]);
    if version != SHARD_VERSION {
        return Err(corrupt(path, format!("format version {version}, this build reads {SHARD_VERSION}")));
    }
    let mut h = [0u8; 8];
    h.copy_from_slice(&fixed[12..20]);
    let header_len = u64::from_le_bytes(h);
    if header_len > size - 24 {
        return Err(corrupt(path, format!("a header of {header_len} bytes in a file of {size}")));
    }
    let mut json = vec![0u8; usize::try_from(header_len).map_err(|_| corrupt(path, "header too large"))?];
    read(&mut json)?;
    let header: ShardHeader = serde_json::from_slice(&json).map_err(|e| corrupt(path, format!("header: {e}")))?;
    let mut total = 24 + header_len;
    let mut values = Vec::with_capacity(header.entries.len());
    for e in &header.entries {
        let dtype: crate::DType = e.dtype.parse().map_err(|_| corrupt(path, format!("entry {} has dtype {:?}", e.name, e.dtype)))?;
        let bytes = e.len.checked_mul(dtype.size_of() as u64).ok_or_else(|| corrupt(path, "an entry's length overflows"))?;
        total = total.checked_add(bytes).ok_or_else(|| corrupt(path, "lengths overflow"))?;
        if total > size {
            return Err(corrupt(path, format!("entry {} runs past the end of the file", e.name)));
        }
        let mut v = vec![0u8; usize::try_from(bytes).map_err(|_| corrupt(path, "an entry is too large"))?];
        read(&mut v)?;
        values.push(v);
    }
    total = total.checked_add(header.states_len).ok_or_else(|| corrupt(path, "lengths overflow"))?;
    if total != size {
        return Err(corrupt(path, format!("the header accounts for {total} bytes, the file has {size}")));
    }
    let mut states = vec![0u8; usize::try_from(header.states_len).map_err(|_| corrupt(path, "the states are too large"))?];
    read(&mut states)?;
    let expected = hasher.finalize();
    let mut crc = [0u8; 4];
    r.read_exact(&mut crc).map_err(io_err)?;
    if u32::from_le_bytes(crc) != expected {
        return Err(corrupt(path, "checksum mismatch (the file is damaged)"));
    }
    Ok(Shard { header, values, states })
}

/// The manifest of a checkpoint directory (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// Always `synkv-checkpoint`.
    pub format: String,
    /// The manifest version (1).
    pub version: u32,
    /// The checkpoint's id (increasing).
    pub id: u64,
    /// The checkpoint's directory, relative to the manifest's.
    pub dir: String,
    /// Rank 0's `push` calls before the checkpoint (training steps).
    pub round: u64,
    /// Seconds since the Unix epoch when it was written.
    pub created_unix: u64,
    /// Servers of the job (a restart needs as many).
    pub num_servers: u32,
    /// Workers of the job.
    pub num_workers: u32,
    /// Sync or async mode.
    pub sync: bool,
    /// Every server's shard.
    pub shards: Vec<ShardFile>,
}

impl Manifest {
    /// A manifest for checkpoint `id` of `shards`.
    pub fn new(id: u64, round: u64, num_servers: u32, num_workers: u32, sync: bool, shards: Vec<ShardFile>) -> Manifest {
        let created_unix = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        Manifest {
            format: FORMAT.into(),
            version: 1,
            id,
            dir: checkpoint_dir_name(id),
            round,
            created_unix,
            num_servers,
            num_workers,
            sync,
            shards,
        }
    }

    /// The shard file of server `rank`, as a path under `root`.
    pub fn shard_path(&self, root: &Path, rank: u32) -> Option<PathBuf> {
        self.shards.iter().find(|s| s.rank == rank).map(|s| root.join(&self.dir).join(&s.file))
    }
}

/// The directory name of checkpoint `id`.
pub fn checkpoint_dir_name(id: u64) -> String {
    format!("ckpt-{id:08}")
}

/// Writes `root/MANIFEST.json` atomically, then removes the checkpoint directories it does
/// not name (older ones, or ones left half-written by a crash).
pub fn publish(root: &Path, manifest: &Manifest) -> Result<(), CheckpointError> {
    let path = root.join(MANIFEST);
    let json = serde_json::to_vec_pretty(manifest).map_err(|e| corrupt(&path, e.to_string()))?;
    write_atomic(&path, |w| w.write_all(&json)).map_err(|source| CheckpointError::Io { action: "writing", path: path.clone(), source })?;
    if let Ok(listing) = std::fs::read_dir(root) {
        for entry in listing.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with("ckpt-") && name != manifest.dir {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
    Ok(())
}

/// The manifest of `root`, if it has one.
pub fn read_manifest(root: &Path) -> Result<Option<Manifest>, CheckpointError> {
    let path = root.join(MANIFEST);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(CheckpointError::Io { action: "reading", path, source }),
    };
    let m: Manifest = serde_json::from_slice(&bytes).map_err(|e| corrupt(&path, e.to_string()))?;
    if m.format != FORMAT || m.version != 1 {
        return Err(corrupt(&path, format!("format {:?} version {}, this build reads {FORMAT} version 1", m.format, m.version)));
    }
    Ok(Some(m))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("synkv-ckpt-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    fn header() -> ShardHeader {
        ShardHeader {
            rank: 1,
            num_servers: 2,
            id: 7,
            sync: true,
            optimizer: Some("{\"sgd\":{}}".into()),
            entries: vec![
                EntryDesc { ps: 3, offset: 0, name: "3".into(), dtype: "f32".into(), len: 2, row_len: None, round: 5 },
                EntryDesc { ps: 9, offset: 4, name: "w".into(), dtype: "f16".into(), len: 3, row_len: Some(1), round: 0 },
            ],
            states_len: 4,
        }
    }

    #[test]
    fn a_shard_round_trips_and_is_listed_in_a_manifest() {
        let root = dir("trip");
        let sub = root.join(checkpoint_dir_name(7));
        let values: [&[u8]; 2] = [&[1, 2, 3, 4, 5, 6, 7, 8], &[9, 9, 8, 8, 7, 7]];
        let written = write_shard(&sub, &header(), &values, b"STAT").unwrap();
        let back = read_shard(&sub.join(&written.file)).unwrap();
        assert_eq!(back.header, header());
        assert_eq!(back.values, vec![values[0].to_vec(), values[1].to_vec()]);
        assert_eq!(back.states, b"STAT");
        let m = Manifest::new(7, 120, 2, 3, true, vec![written.clone()]);
        // An older checkpoint directory is removed once the manifest names the new one.
        std::fs::create_dir_all(root.join(checkpoint_dir_name(6))).unwrap();
        publish(&root, &m).unwrap();
        assert_eq!(read_manifest(&root).unwrap(), Some(m.clone()));
        assert!(!root.join(checkpoint_dir_name(6)).exists());
        assert_eq!(m.shard_path(&root, 1), Some(sub.join("shard-1.bin")));
        assert_eq!(std::fs::metadata(sub.join("shard-1.bin")).unwrap().len(), written.bytes);
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn damaged_or_truncated_shards_are_refused() {
        let root = dir("damaged");
        let values: [&[u8]; 2] = [&[1, 2, 3, 4, 5, 6, 7, 8], &[9, 9, 8, 8, 7, 7]];
        let written = write_shard(&root, &header(), &values, b"STAT").unwrap();
        let path = root.join(&written.file);
        let good = std::fs::read(&path).unwrap();
        let mut flipped = good.clone();
        let at = flipped.len() - 10;
        flipped[at] ^= 1;
        std::fs::write(&path, &flipped).unwrap();
        assert!(read_shard(&path).unwrap_err().to_string().contains("checksum"));
        std::fs::write(&path, &good[..good.len() - 7]).unwrap();
        assert!(matches!(read_shard(&path), Err(CheckpointError::Corrupt { .. })));
        let mut magic = good.clone();
        magic[0] = b'X';
        std::fs::write(&path, &magic).unwrap();
        assert!(read_shard(&path).unwrap_err().to_string().contains("magic"));
        assert_eq!(read_manifest(&root).unwrap(), None, "no manifest: no checkpoint");
        std::fs::remove_dir_all(&root).unwrap();
    }
}
