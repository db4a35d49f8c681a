//! The worker's key registry: what each initialised key is (shape, dtype, storage), where it
//! lives (its ps key and [`Slice`]s), and the engine var that orders its operations.
//!
//! Every worker calls `init` with the same keys (spec K2.4), so every worker can validate a
//! push or pull locally: an uninitialised key, a re-init, a wrong shape or dtype is refused
//! before anything is sent. Str keys map to ps keys by a stable hash (`ps::slicer`), so
//! workers may initialise them in any order; two names with the same hash are refused.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use rustc_hash::FxHashMap;
use smallvec::SmallVec;

use super::held::Held;
use crate::compression::{CompressionType, Residual};
use crate::engine::Var;
use crate::ps::slicer::{self, Slice};
use crate::store::{Error, Key, KeyKind};
use crate::{DType, NDArray, Shape, StorageType};

/// One initialised key.
#[derive(Debug)]
pub(crate) struct KeyInfo {
    pub(crate) key: Key,
    /// The key's display form, shared by its trace spans (`ps::trace`).
    pub(crate) label: Arc<str>,
    pub(crate) ps: u64,
    pub(crate) shape: Shape,
    pub(crate) dtype: DType,
    pub(crate) stype: StorageType,
    /// Per part, the engine var ordering its operations: a push writes it, a pull reads it,
    /// so a pull sees the latest push of this worker (K4.5). A big dense key's push travels
    /// as one operation per part (`ops::push_parts`); an operation on the whole key takes
    /// every part's var.
    pub(crate) vars: SmallVec<[Var; 1]>,
    /// The key's parts, each one entry on its server: elements (dense) or rows (row_sparse).
    /// A server's share (K8.8) larger than the partition bound is cut into several parts.
    pub(crate) slices: Vec<Slice>,
    /// Per part, the round id of its next push: how many pushes of it the server accepted.
    pub(crate) rounds: Vec<AtomicU64>,
    /// Per part, the round count at this worker's last pull of it (`u64::MAX`: never pulled):
    /// a push asks for its value back when a pull came after the previous one (`held.rs`).
    pub(crate) pulled: Vec<AtomicU64>,
    /// Per part, the value the server answered this worker's last push with, if it asked
    /// (`held.rs`): a pull before the next push is answered from it.
    pub(crate) held: SmallVec<[parking_lot::Mutex<Option<Held>>; 1]>,
    /// Per part, the last communication buffer, reused by the next push of the part once the
    /// network dropped it (a whole-key push keeps its buffer in the first part's place).
    pub(crate) spares: SmallVec<[parking_lot::Mutex<Option<bytes::Bytes>>; 1]>,
    /// Gradient-compression state of the key (residual, packed-word buffer).
    pub(crate) packing: Packing,
}

/// A key's gradient-compression state on this worker (spec K7.10): one residual for the key
/// (devices are summed before quantizing), created zeroed at the first compressed push, and
/// the packed words of the last push, whose allocation the next push reuses once the network
/// has dropped every view of it.
#[derive(Debug, Default)]
pub(crate) struct Packing {
    pub(crate) residual: std::sync::OnceLock<Residual>,
    pub(crate) spare: parking_lot::Mutex<Option<Arc<Vec<u32>>>>,
}

impl KeyInfo {
    /// Elements per slice unit: 1 for dense keys, the row length for row_sparse keys.
    pub(crate) fn unit(&self) -> usize {
        match self.stype {
            StorageType::RowSparse => self.shape.row_len(),
            _ => 1,
        }
    }

    /// Whether the key has several parts (split over servers, or cut in pieces).
    pub(crate) fn is_big(&self) -> bool {
        self.slices.len() > 1
    }

    /// A key's info (for tests and the registry): `slices` its parts.
    #[cfg(test)]
    pub(crate) fn for_test(key: Key, shape: Shape, dtype: DType, stype: StorageType, slices: Vec<Slice>) -> KeyInfo {
        let ps = ps_key(&key);
        let rounds = slices.iter().map(|_| AtomicU64::new(0)).collect();
        let label = Arc::from(key.to_string());
        KeyInfo {
            key,
            label,
            ps,
            shape,
            dtype,
            stype,
            vars: (0..slices.len().max(1)).map(|_| Var::new()).collect(),
            spares: (0..slices.len().max(1)).map(|_| Default::default()).collect(),
            pulled: slices.iter().map(|_| AtomicU64::new(u64::MAX)).collect(),
            held: (0..slices.len().max(1)).map(|_| Default::default()).collect(),
            slices,
            rounds,
            packing: Packing::default(),
        }
    }
}

/// Where a store's keys go: the servers, MXNet's split bound and the partition bound.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Layout {
    pub(crate) servers: u32,
    /// `MXNET_KVSTORE_BIGARRAY_BOUND` (elements).
    pub(crate) bound: u64,
    /// `SYNKV_PARTITION_BYTES`.
    pub(crate) partition_bytes: u64,
}

/// A key of one call with the arrays given for it (values or outputs), in call order.
pub(crate) struct Group<'a> {
    pub(crate) info: Arc<KeyInfo>,
    pub(crate) arrays: SmallVec<[&'a NDArray; 4]>,
}

/// Keys and the store's key kind.
#[derive(Default)]
pub(crate) struct Registry {
    kind: Option<KeyKind>,
    keys: FxHashMap<Key, Arc<KeyInfo>>,
    by_ps: FxHashMap<u64, Key>,
}

/// The ps key of a user key.
pub(crate) fn ps_key(key: &Key) -> u64 {
    match key {
        Key::Int(i) => slicer::int_key(*i),
        Key::Str(s) => slicer::str_key(s),
    }
}

impl Registry {
    /// Checks that every key has the store's kind (or one kind, if none is fixed yet).
    pub(crate) fn check_kinds<'k>(&self, op: &'static str, keys: impl Iterator<Item = &'k Key>) -> Result<Option<KeyKind>, Error> {
        let mut kind = self.kind;
        for key in keys {
            match kind {
                None => kind = Some(key.kind()),
                Some(k) if k != key.kind() => return Err(Error::MixedKeyKinds { op, store: k, got: key.kind(), key: key.clone() }),
                Some(_) => {}
            }
        }
        Ok(kind)
    }

    /// Registers new keys after checking every one (all or nothing).
    ///
    /// With `compression` set, a big dense f32 key is split in units of packed words (spec
    /// K7.11) so every server but the last gets a whole number of words; other keys are split
    /// as K8.8 says. (Keys registered before compression was set keep their K8.8 split; their
    /// slices are then quantized one by one, which gives the same values.) Then every share
    /// larger than `partition_bytes` is cut into near-equal parts no larger than that.
    pub(crate) fn register(
        &mut self,
        pairs: &[(Key, &NDArray)],
        layout: Layout,
        store_type: &str,
        compression: Option<CompressionType>,
    ) -> Result<Vec<Arc<KeyInfo>>, Error> {
        let Layout { servers, bound, partition_bytes } = layout;
        let kind = self.check_kinds("init", pairs.iter().map(|p| &p.0))?;
        let mut infos = Vec::with_capacity(pairs.len());
        // Keys and ps keys of this call so far (a call may hold hundreds of thousands).
        let mut seen: FxHashMap<&Key, ()> = FxHashMap::default();
        let mut seen_ps: FxHashMap<u64, &Key> = FxHashMap::default();
        for (key, value) in pairs {
            if self.keys.contains_key(key) || seen.insert(key, ()).is_some() {
                return Err(Error::DuplicateInit { key: key.clone() });
            }
            if !matches!(value.dtype(), DType::F32 | DType::F64 | DType::F16 | DType::BF16) {
                return Err(Error::Unsupported {
                    op: "init",
                    store_type: store_type.to_owned(),
                    reason: format!("key {key} has {} values; distributed keys hold f32, f64, f16 or bf16", value.dtype()),
                });
            }
            let ps = ps_key(key);
            if let Some(other) = self.by_ps.get(&ps).or_else(|| seen_ps.get(&ps).copied()) {
                return Err(Error::Unsupported {
                    op: "init",
                    store_type: store_type.to_owned(),
                    reason: format!("keys {other} and {key} hash to the same server key; rename one of them"),
                });
            }
            seen_ps.insert(ps, key);
            let shape = value.shape().clone();
            let stype = value.storage_type();
            let (units, unit) = match stype {
                StorageType::RowSparse => (shape.rows(), shape.row_len()),
                _ => (shape.size(), 1),
            };
            let packed = compression.filter(|_| stype == StorageType::Dense && value.dtype() == DType::F32);
            let shares = match packed {
                Some(kind) => packed_slices(ps, kind, units, servers, bound),
                None => slicer::slices(ps, units, unit, servers, bound),
            };
            let unit_bytes = u64::try_from(unit.max(1) * value.dtype().size_of()).unwrap_or(u64::MAX);
            let max_units = usize::try_from((partition_bytes / unit_bytes).max(1)).unwrap_or(usize::MAX);
            let slices = slicer::cut(&shares, max_units);
            infos.push(KeyInfo {
                key: key.clone(),
                label: Arc::from(key.to_string()),
                ps,
                shape,
                dtype: value.dtype(),
                stype,
                vars: (0..slices.len().max(1)).map(|_| Var::new()).collect(),
                spares: (0..slices.len().max(1)).map(|_| Default::default()).collect(),
                pulled: slices.iter().map(|_| AtomicU64::new(u64::MAX)).collect(),
                held: (0..slices.len().max(1)).map(|_| Default::default()).collect(),
                rounds: slices.iter().map(|_| AtomicU64::new(0)).collect(),
                slices,
                packing: Packing::default(),
            });
        }
        self.kind = kind;
        let infos: Vec<Arc<KeyInfo>> = infos.into_iter().map(Arc::new).collect();
        for info in &infos {
            self.by_ps.insert(info.ps, info.key.clone());
            self.keys.insert(info.key.clone(), Arc::clone(info));
        }
        Ok(infos)
    }

    /// Looks up every key of a call and groups repeated keys, in ascending key order (the
    /// arrays of one key keep their call order). Fixes the key kind on the first call.
    pub(crate) fn group<'a>(&mut self, op: &'static str, pairs: Vec<(Key, &'a NDArray)>) -> Result<Vec<Group<'a>>, Error> {
        let kind = self.check_kinds(op, pairs.iter().map(|p| &p.0))?;
        let mut found: Vec<(Arc<KeyInfo>, &'a NDArray)> = Vec::with_capacity(pairs.len());
        for (key, arr) in pairs {
            let info = self.keys.get(&key).ok_or_else(|| Error::NotInitialized { op, key: key.clone() })?;
            found.push((Arc::clone(info), arr));
        }
        found.sort_by(|a, b| a.0.key.cmp(&b.0.key));
        let mut groups: Vec<Group<'a>> = Vec::with_capacity(found.len());
        for (info, arr) in found {
            match groups.last_mut() {
                Some(g) if g.info.key == info.key => g.arrays.push(arr),
                _ => groups.push(Group { info, arrays: smallvec::smallvec![arr] }),
            }
        }
        if self.kind.is_none() {
            self.kind = kind;
        }
        Ok(groups)
    }

    /// The info of one key.
    pub(crate) fn get(&self, op: &'static str, key: &Key) -> Result<Arc<KeyInfo>, Error> {
        self.keys.get(key).cloned().ok_or_else(|| Error::NotInitialized { op, key: key.clone() })
    }

    /// Every registered key.
    pub(crate) fn all(&self) -> impl Iterator<Item = &Arc<KeyInfo>> {
        self.keys.values()
    }
}

/// The slices of a dense f32 key of `n` elements on a compressing store: K8.8's placement for a
/// small key, K7.11's split in units of packed words for a big one.
fn packed_slices(ps: u64, kind: CompressionType, n: usize, servers: u32, bound: u64) -> Vec<Slice> {
    let elems = u64::try_from(n).unwrap_or(u64::MAX);
    if elems < bound || servers <= 1 {
        return slicer::slices(ps, n, 1, servers, bound);
    }
    let mut offset = 0;
    let mut out = Vec::new();
    for (server, (len, _words)) in (0u32..).zip(kind.partition_words(n, usize::try_from(servers).unwrap_or(1))) {
        if len > 0 {
            out.push(Slice { server, offset, len });
        }
        offset += len;
    }
    out
}

/// Checks that `arr` has the key's shape (and, with `same_dtype`, its dtype).
pub(crate) fn check_array(op: &'static str, info: &KeyInfo, arr: &NDArray, same_dtype: bool) -> Result<(), Error> {
    if arr.shape() != &info.shape {
        return Err(Error::ShapeMismatch { op, key: info.key.clone(), expected: info.shape.clone(), got: arr.shape().clone() });
    }
    if same_dtype && arr.dtype() != info.dtype {
        return Err(Error::DTypeMismatch { op, key: info.key.clone(), expected: info.dtype, got: arr.dtype() });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_big_key_on_a_compressing_store_is_split_in_words_k7_11() {
        let lens =
            |n, servers| -> Vec<usize> { packed_slices(0, CompressionType::TwoBit, n, servers, 1_000_000).iter().map(|s| s.len).collect() };
        assert_eq!(lens(1_466_521, 3), vec![488_848, 488_832, 488_841]);
        let s = packed_slices(0, CompressionType::TwoBit, 1_466_521, 3, 1_000_000);
        assert_eq!((s[1].offset, s[2].offset), (488_848, 488_848 + 488_832));
        assert_eq!(lens(10, 3), vec![10], "a small key stays whole");
        assert_eq!(lens(1_466_521, 1), vec![1_466_521]);
    }
}
