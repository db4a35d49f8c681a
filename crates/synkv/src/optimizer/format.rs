//! The optimizer-state file format (version 1), written by `Updater::save_states`.
//!
//! | offset | size | field | allowed values |
//! | --- | --- | --- | --- |
//! | 0 | 8 | magic | ASCII `SYNKVOPT` |
//! | 8 | 4 | format version, u32 LE | `1` |
//! | 12 | 8 | header length `H`, u64 LE | `≤ file length − 24` |
//! | 20 | `H` | header, UTF-8 JSON | see below |
//! | 20 + `H` | `B` | slot blobs, raw little-endian | exactly the slots the header lists, in order |
//! | 20 + `H` + `B` | 4 | CRC-32 (IEEE) of all preceding bytes, u32 LE | |
//!
//! Header JSON: `{"optimizer": <optimizer description>, "num_update": u64,
//! "counts": {key: u64}, "states": [{"key", "dtype", "len", "slots": [{"name", "dtype",
//! "len", "offset"}]}]}`. `offset` is in bytes from the start of the blob section and the
//! slots are stored back to back in header order; the f32 master copy of a multi-precision
//! weight is the slot `weight32`. Keys are sorted, so equal states give equal bytes.
//!
//! Decoding checks, in order: length ≥ 24, magic, version, checksum, header length, JSON
//! schema, slot names/types/lengths/offsets, and that the blobs exactly fill their section.
//! Any failure is [`Error::CorruptStateFile`] ("corrupted or not a synkv optimizer-state
//! file: …"). Whether the states fit the *current* optimizer is checked by
//! `check_slots` (slot names, master copies) and, per key, before its next update.
//! `docs/optimizer-states.md` documents the same layout.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use super::config::Optimizer;
use super::error::{Error, Result};
use super::state::{OptimizerState, SlotData, MASTER_SLOT};
use super::updater::Updater;
use super::ElemType;

/// File magic.
pub const MAGIC: &[u8; 8] = b"SYNKVOPT";
/// The format version this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;

const FRAME: usize = 8 + 4 + 8 + 4;

/// Every slot name any optimizer uses (plus the master copy).
const KNOWN_SLOTS: &[&str] = &["momentum", "mean", "var", "history", "n", "g", "delta", "acc_g", "acc_delta", "z", MASTER_SLOT];

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Header {
    optimizer: Optimizer,
    num_update: u64,
    counts: BTreeMap<String, u64>,
    states: Vec<KeyDesc>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyDesc {
    key: String,
    dtype: ElemType,
    len: u64,
    slots: Vec<SlotDesc>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SlotDesc {
    name: String,
    dtype: ElemType,
    len: u64,
    offset: u64,
}

/// The content of a decoded file.
pub(crate) struct Decoded {
    pub optimizer: Optimizer,
    pub num_update: u64,
    pub counts: HashMap<String, u64>,
    pub states: HashMap<String, OptimizerState>,
}

fn push_blob(blob: &mut Vec<u8>, data: &SlotData) {
    match data {
        SlotData::F32(v) => v.iter().for_each(|x| blob.extend_from_slice(&x.to_le_bytes())),
        SlotData::F64(v) => v.iter().for_each(|x| blob.extend_from_slice(&x.to_le_bytes())),
    }
}

/// Serialises an updater's counts, states and optimizer description; with `only`, the states
/// (and counts) of those keys alone.
pub(crate) fn encode(u: &Updater, only: Option<&[&str]>) -> Vec<u8> {
    let mut keys: Vec<&String> = match only {
        None => u.states.keys().collect(),
        Some(only) => only.iter().filter_map(|k| u.states.get_key_value(*k).map(|(k, _)| k)).collect(),
    };
    keys.sort();
    keys.dedup();
    let mut blob = Vec::new();
    let mut states = Vec::with_capacity(keys.len());
    for key in keys {
        let st = &u.states[key];
        let named = st.slots.iter().map(|(n, d)| (*n, d)).chain(st.master.iter().map(|d| (MASTER_SLOT, d)));
        let mut slots = Vec::new();
        for (name, data) in named {
            slots.push(SlotDesc { name: name.to_owned(), dtype: data.elem_type(), len: data.len() as u64, offset: blob.len() as u64 });
            push_blob(&mut blob, data);
        }
        states.push(KeyDesc { key: key.clone(), dtype: st.dtype, len: st.len as u64, slots });
    }
    let header = Header {
        optimizer: u.opt.clone(),
        num_update: u.num_update,
        counts: match only {
            None => u.counts.iter().map(|(k, v)| (k.clone(), *v)).collect(),
            Some(only) => only.iter().filter_map(|k| u.counts.get_key_value(*k)).map(|(k, v)| (k.clone(), *v)).collect(),
        },
        states,
    };
    let json = match serde_json::to_vec(&header) {
        Ok(j) => j,
        Err(e) => unreachable!("state header serialises: {e}"),
    };
    let mut out = Vec::with_capacity(FRAME + json.len() + blob.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&(json.len() as u64).to_le_bytes());
    out.extend_from_slice(&json);
    out.extend_from_slice(&blob);
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

fn le_u32(b: &[u8]) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[..4]);
    u32::from_le_bytes(a)
}

fn le_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

/// Parses and verifies a state file.
pub(crate) fn decode(bytes: &[u8]) -> Result<Decoded> {
    if bytes.len() < FRAME {
        return Err(Error::corrupt(format!("truncated: {} bytes is shorter than the {FRAME}-byte frame", bytes.len())));
    }
    if &bytes[..8] != MAGIC {
        return Err(Error::corrupt("bad magic (expected \"SYNKVOPT\")"));
    }
    let version = le_u32(&bytes[8..12]);
    if version != FORMAT_VERSION {
        return Err(Error::corrupt(format!("unsupported format version {version}; this build reads version {FORMAT_VERSION}")));
    }
    let body = &bytes[..bytes.len() - 4];
    let stored = le_u32(&bytes[bytes.len() - 4..]);
    let actual = crc32fast::hash(body);
    if stored != actual {
        return Err(Error::corrupt(format!(
            "checksum mismatch (stored {stored:#010x}, computed {actual:#010x}); the file is \
             damaged or truncated"
        )));
    }
    let header_len = le_u64(&bytes[12..20]);
    let rest = &body[20..];
    let header_len = usize::try_from(header_len)
        .ok()
        .filter(|&h| h <= rest.len())
        .ok_or_else(|| Error::corrupt(format!("header length {header_len} exceeds the {} bytes available", rest.len())))?;
    let (json, blob) = rest.split_at(header_len);
    let header: Header = serde_json::from_slice(json).map_err(|e| Error::corrupt(format!("invalid header: {e}")))?;

    let mut states = HashMap::with_capacity(header.states.len());
    let mut pos = 0usize;
    for desc in header.states {
        let key = desc.key;
        let len = to_usize(desc.len, &key)?;
        if desc.dtype != ElemType::F32 && desc.dtype != ElemType::F64 {
            return Err(Error::corrupt(format!("key {key}: state dtype {} is not f32 or f64", desc.dtype)));
        }
        let mut slots = Vec::new();
        let mut master = None;
        for s in desc.slots {
            let name = KNOWN_SLOTS
                .iter()
                .copied()
                .find(|&n| n == s.name)
                .ok_or_else(|| Error::corrupt(format!("key {key}: unknown slot {:?}", s.name)))?;
            let expected = if name == MASTER_SLOT { ElemType::F32 } else { desc.dtype };
            if s.dtype != expected || to_usize(s.len, &key)? != len {
                return Err(Error::corrupt(format!(
                    "key {key}: slot {name} is {} × {} but the key's state is {expected} × {len}",
                    s.dtype, s.len
                )));
            }
            if s.offset != pos as u64 {
                return Err(Error::corrupt(format!(
                    "key {key}: slot {name} starts at byte {} but the previous slot ends at {pos}",
                    s.offset
                )));
            }
            let size = len
                .checked_mul(expected.size())
                .filter(|&size| pos.checked_add(size).is_some_and(|end| end <= blob.len()))
                .ok_or_else(|| Error::corrupt(format!("key {key}: slot {name} runs past the end of the file")))?;
            let raw = &blob[pos..pos + size];
            pos += size;
            let data = match expected {
                ElemType::F64 => SlotData::F64(raw.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().unwrap_or([0; 8]))).collect()),
                _ => SlotData::F32(raw.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap_or([0; 4]))).collect()),
            };
            if name == MASTER_SLOT {
                if master.replace(data).is_some() {
                    return Err(Error::corrupt(format!("key {key}: two master copies")));
                }
            } else {
                slots.push((name, data));
            }
        }
        let state = OptimizerState { slots, master, dtype: desc.dtype, len };
        if states.insert(key.clone(), state).is_some() {
            return Err(Error::corrupt(format!("key {key} appears twice")));
        }
    }
    if pos != blob.len() {
        return Err(Error::corrupt(format!("{} bytes after the last slot", blob.len() - pos)));
    }
    Ok(Decoded { optimizer: header.optimizer, num_update: header.num_update, counts: header.counts.into_iter().collect(), states })
}

fn to_usize(v: u64, key: &str) -> Result<usize> {
    usize::try_from(v).map_err(|_| Error::corrupt(format!("key {key}: length {v} is too large")))
}

/// Checks that loaded states have the slots `opt` keeps (names in order; a master copy
/// only with multi-precision). Lengths and dtypes are checked per key at its next update.
pub(crate) fn check_slots(opt: &Optimizer, states: &HashMap<String, OptimizerState>) -> Result<()> {
    let expected = opt.state_slots();
    let mut keys: Vec<&String> = states.keys().collect();
    keys.sort();
    for key in keys {
        let st = &states[key];
        let names: Vec<&str> = st.slot_names().collect();
        if names != expected {
            return Err(Error::state(
                key,
                format!(
                    "the file has slots {names:?} but `{}` with these settings keeps {expected:?}; \
                     load it into an optimizer configured as when it was saved",
                    opt.name()
                ),
            ));
        }
        if st.master.is_some() && !opt.common().multi_precision {
            return Err(Error::state(
                key,
                "the file has an f32 master copy but multi_precision is off; enable \
                 multi_precision to resume from it",
            ));
        }
    }
    Ok(())
}
