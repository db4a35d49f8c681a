//! Lent views: a dense array's element bytes handed to the network as [`Bytes`] without a
//! copy (a distributed push sends from the caller's memory, issue 13 item 2).
//!
//! [`lend_bytes`] takes the array's data lock for reading and keeps it, together with a
//! handle on the array and a `keep` guard (the engine's [`ReadLease`] of the push), inside the
//! returned `Bytes`' owner; the lock is released when the last `Bytes` sharing that owner is
//! dropped — once the writer has copied them into a shared-memory slot or onto the socket.
//! So neither the engine (the lease holds the array's var for reading) nor any code of this
//! crate (the data lock: every writer takes it exclusively) can change or free the memory
//! while it is lent, and a racing writer from another thread waits instead of tearing it.
//!
//! This module and `data.rs` are the `ndarray` modules with `unsafe` code.
//!
//! [`ReadLease`]: crate::engine::ReadLease
#![allow(unsafe_code)]

use std::any::Any;
use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;

use super::{Buffer, NDArray};

/// Owns a read lock on an array's data and lends `len` bytes at `ptr` inside it.
struct Lent {
    array: NDArray,
    ptr: *const u8,
    len: usize,
    /// Dropped after the data lock is released (fields drop after `Drop::drop`).
    _keep: Arc<dyn Any + Send + Sync>,
}

// SAFETY: `ptr` points into the storage of `array`, which this value keeps alive (the handle)
// and unchanged (the read lock it holds, forgotten as a guard, released in `drop`); reading
// those bytes from any thread is as safe as reading a `Vec<u8>` shared by `&`. parking_lot's
// raw lock may be released from another thread than the one that took it.
unsafe impl Send for Lent {}

impl AsRef<[u8]> for Lent {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: see `unsafe impl Send`: `len` bytes at `ptr`, inside a buffer that cannot be
        // written, moved or freed while the read lock is held, and `Bytes` hands out the slice
        // only while it holds this owner.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        // SAFETY: `lend_bytes` took exactly one read lock for this value and forgot its guard;
        // this releases that one lock, once.
        unsafe { self.array.data_lock().force_unlock_read() }
    }
}

/// The bytes `range` of `array`'s dense elements, lent without a copy while `keep` (and the
/// array's data lock) are held; `None` when the array is not dense or `range` is not inside
/// its elements (the caller then copies).
pub(crate) fn lend_bytes(array: &NDArray, range: Range<usize>, keep: Arc<dyn Any + Send + Sync>) -> Option<Bytes> {
    let guard = array.storage();
    let buf: &Buffer = guard.dense()?;
    let all: &[u8] = crate::with_buffer!(buf, v => bytemuck::cast_slice(&v[..]));
    let bytes = all.get(range)?;
    let (ptr, len) = (bytes.as_ptr(), bytes.len());
    // Keep the read lock past the guard: `Lent::drop` releases it.
    std::mem::forget(guard);
    Some(Bytes::from_owner(Lent { array: array.clone(), ptr, len, _keep: keep }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lent_bytes_are_the_elements_and_hold_the_data_lock_until_the_last_slice_drops() {
        let a = NDArray::from_vec([4], vec![1.0f32, 2.0, 3.0, 4.0]).unwrap();
        let keep: Arc<dyn Any + Send + Sync> = Arc::new(());
        let lent = lend_bytes(&a, 4..12, Arc::clone(&keep)).expect("dense");
        assert_eq!(lent.as_ref(), bytemuck::cast_slice::<f32, u8>(&[2.0, 3.0]));
        let half = lent.slice(4..8);
        drop(lent);
        assert!(a.data_lock().try_write().is_none(), "the lock is held while a slice lives");
        assert_eq!(Arc::strong_count(&keep), 2);
        // From another thread, as the network writer does.
        std::thread::spawn(move || assert_eq!(half.as_ref(), bytemuck::cast_slice::<f32, u8>(&[3.0]))).join().unwrap();
        assert!(a.data_lock().try_write().is_some(), "the last slice released the lock");
        assert_eq!(Arc::strong_count(&keep), 1);
    }

    #[test]
    fn a_range_outside_the_elements_is_not_lent() {
        let a = NDArray::from_vec([2], vec![1.0f32, 2.0]).unwrap();
        let keep: Arc<dyn Any + Send + Sync> = Arc::new(());
        assert!(lend_bytes(&a, 4..12, Arc::clone(&keep)).is_none());
        assert!(a.data_lock().try_write().is_some(), "a refused loan holds nothing");
    }
}
