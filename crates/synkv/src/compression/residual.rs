//! [`Residuals`]: the persistent quantization residuals, one f32 buffer per (key, source).
//!
//! Quantization keeps what it did not send in a residual that is added to the next gradient
//! of the same key from the same source; without it compression would lose every value below
//! the threshold. Who the source is depends on the store:
//! - the `device` store keeps one residual per **(key, source device)** (spec K7.9): every
//!   push, even from a single device, is quantized with the pushing device's residual;
//! - a dist **worker** keeps one per **key** (K7.10): it sums its devices first, then
//!   quantizes the sum once (a big key is quantized whole; the servers get slices of words).
//!
//! The map is generic over its key `K` (any `Eq + Hash` type: `(Key, Context)` for the
//! `device` store, `Key` or the ps-lite `u64` key on a worker), so this layer knows nothing of
//! stores or devices. A buffer is created zeroed on first use and keeps its length for life.
//!
//! # Locking
//! The map has one lock, held only to find or insert an entry. Each buffer has its own lock
//! ([`Residual`] is a shared handle), held for one quantize: pushes of different keys, or of
//! one key from different devices, quantize in parallel; two quantizes of the same (key,
//! source) serialise, which the engine's per-key ordering makes uncontended anyway.
//! Quantization may run on rayon's pool while the buffer lock is held; it never takes another
//! residual's lock, so this cannot deadlock.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;
use std::ops::DerefMut;
use std::sync::Arc;

use parking_lot::Mutex;

use super::error::{check_len, Result};
use super::GradientCompression;

/// One residual buffer: a cheap, shared handle (`Arc`) over f32 values behind a lock.
#[derive(Clone)]
pub struct Residual {
    len: usize,
    data: Arc<Mutex<Vec<f32>>>,
}

impl Residual {
    /// A residual of `len` zeros.
    pub fn zeros(len: usize) -> Residual {
        Residual { len, data: Arc::new(Mutex::new(vec![0.0; len])) }
    }

    /// Its number of elements (fixed for life).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Locks the values for reading or writing.
    pub fn lock(&self) -> impl DerefMut<Target = [f32]> + '_ {
        parking_lot::MutexGuard::map(self.data.lock(), |v| v.as_mut_slice())
    }

    /// A copy of the values.
    pub fn to_vec(&self) -> Vec<f32> {
        self.lock().to_vec()
    }

    /// Quantizes `grad` into `out` with this residual (see
    /// [`GradientCompression::quantize`]), holding its lock for the call.
    ///
    /// # Errors
    /// [`Error::LengthMismatch`](super::Error::LengthMismatch) if `grad` or `out` has the
    /// wrong length.
    pub fn quantize(&self, gc: &GradientCompression, grad: &[f32], out: &mut [u32]) -> Result<()> {
        gc.quantize(grad, &mut self.lock(), out)
    }
}

impl fmt::Debug for Residual {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Residual").field("len", &self.len).finish_non_exhaustive()
    }
}

/// The residuals of one store: a [`Residual`] per key `K`, created zeroed on first use.
pub struct Residuals<K> {
    map: Mutex<HashMap<K, Residual>>,
}

impl<K: Eq + Hash> Residuals<K> {
    /// An empty set.
    pub fn new() -> Self {
        Residuals { map: Mutex::new(HashMap::new()) }
    }

    /// The residual of `key`, created as `len` zeros if it does not exist yet.
    ///
    /// # Errors
    /// [`Error::LengthMismatch`](super::Error::LengthMismatch) if it exists with another
    /// length (a key's size never changes after `init`, so this is a caller bug).
    pub fn get_or_zeros(&self, key: K, len: usize) -> Result<Residual> {
        let r = self.map.lock().entry(key).or_insert_with(|| Residual::zeros(len)).clone();
        check_len("Residuals::get_or_zeros", "the residual", len, r.len())?;
        Ok(r)
    }

    /// The residual of `key`, if it exists.
    pub fn get<Q>(&self, key: &Q) -> Option<Residual>
    where
        K: Borrow<Q>,
        Q: Eq + Hash + ?Sized,
    {
        self.map.lock().get(key).cloned()
    }

    /// Quantizes `grad` into `out` with `key`'s residual, creating it (zeros of `grad.len()`)
    /// on first use.
    ///
    /// # Errors
    /// [`Error::LengthMismatch`](super::Error::LengthMismatch) if `out` has the wrong length
    /// or `key`'s residual exists with another length.
    pub fn quantize(&self, key: K, gc: &GradientCompression, grad: &[f32], out: &mut [u32]) -> Result<()> {
        self.get_or_zeros(key, grad.len())?.quantize(gc, grad, out)
    }

    /// Forgets `key`'s residual, returning it.
    pub fn remove<Q>(&self, key: &Q) -> Option<Residual>
    where
        K: Borrow<Q>,
        Q: Eq + Hash + ?Sized,
    {
        self.map.lock().remove(key)
    }

    /// The number of residuals.
    pub fn len(&self) -> usize {
        self.map.lock().len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.map.lock().is_empty()
    }

    /// Forgets every residual.
    pub fn clear(&self) {
        self.map.lock().clear();
    }
}

impl<K: Eq + Hash> Default for Residuals<K> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K> fmt::Debug for Residuals<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Residuals").field("len", &self.map.lock().len()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compression::{CompressionType, Error};

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn handles_are_send_and_sync() {
        assert_send_sync::<Residual>();
        assert_send_sync::<Residuals<(String, usize)>>();
    }

    #[test]
    fn created_zeroed_and_kept_per_key_and_source() {
        let gc = GradientCompression::new(CompressionType::TwoBit, 0.5).unwrap();
        let res: Residuals<(i32, usize)> = Residuals::new();
        let mut out = [0u32; 1];
        res.quantize((3, 0), &gc, &[0.4; 4], &mut out).unwrap();
        assert_eq!(out, [0]);
        res.quantize((3, 1), &gc, &[0.2; 4], &mut out).unwrap();
        assert_eq!(out, [0]);
        // device 0 crosses the threshold on its second push, device 1 does not
        res.quantize((3, 0), &gc, &[0.2; 4], &mut out).unwrap();
        assert_eq!(out, [0x0000_00ff]);
        assert_eq!(res.get(&(3, 1)).unwrap().to_vec(), vec![0.2; 4]);
        assert_eq!(res.len(), 2);
        assert!(res.remove(&(3, 1)).is_some());
        assert!(res.get(&(3, 1)).is_none());
        res.clear();
        assert!(res.is_empty());
    }

    #[test]
    fn length_is_fixed_for_life() {
        let res: Residuals<String> = Residuals::new();
        let r = res.get_or_zeros("w".to_owned(), 8).unwrap();
        assert_eq!((r.len(), r.to_vec()), (8, vec![0.0; 8]));
        assert!(matches!(res.get_or_zeros("w".to_owned(), 9), Err(Error::LengthMismatch { expected: 9, got: 8, .. })));
        // lookups borrow: a &str finds a String key
        assert!(res.get("w").is_some());
        r.lock()[0] = 1.5;
        assert_eq!(res.get("w").unwrap().to_vec()[0], 1.5);
    }
}
