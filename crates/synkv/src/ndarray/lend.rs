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
//! [`loan_ranges`] is the other direction, for a distributed pull's answer read straight from
//! the socket into the output: it takes the array's data lock for *writing* and keeps it
//! until the last of the returned [`Dest`]s — disjoint byte ranges of the elements, each
//! writable through `&mut` alone — is dropped.
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

/// Holds a write lock on an array's data: the dense elements' `len` bytes at `ptr`.
struct WriteLoan {
    array: NDArray,
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the loan keeps the array alive (the handle) and its storage unmoved and untouched by
// anyone else (the write lock it holds, forgotten as a guard, released in `drop`); the bytes
// are only reached through `Dest`s, which are disjoint. parking_lot's raw lock may be released
// from another thread than the one that took it.
unsafe impl Send for WriteLoan {}
// SAFETY: a shared `WriteLoan` hands out nothing; only `Dest`s (one per disjoint range) touch
// the bytes.
unsafe impl Sync for WriteLoan {}

impl Drop for WriteLoan {
    fn drop(&mut self) {
        // SAFETY: `loan_ranges` took exactly one write lock for this value and forgot its
        // guard; this releases that one lock, once.
        unsafe { self.array.data_lock().force_unlock_write() }
    }
}

/// One range of a loaned array's element bytes, written and read through `&mut`/`&` of this
/// value alone: the ranges of one loan never overlap.
pub(crate) struct Dest {
    loan: Arc<WriteLoan>,
    ptr: *mut u8,
    len: usize,
}

impl std::fmt::Debug for Dest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let start = (self.ptr as usize).wrapping_sub(self.loan.ptr as usize);
        f.debug_struct("Dest").field("bytes", &(start..start + self.len)).field("of", &self.loan.len).finish()
    }
}

// SAFETY: `ptr..ptr + len` lies inside the loan's bytes, which the `Arc` keeps locked and
// alive, and no other `Dest` covers any of it; moving the value to another thread moves the
// only access to those bytes.
unsafe impl Send for Dest {}

impl AsRef<[u8]> for Dest {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: see `unsafe impl Send for Dest`; `&self` excludes writes through this value.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl AsMut<[u8]> for Dest {
    fn as_mut(&mut self) -> &mut [u8] {
        // SAFETY: see `unsafe impl Send for Dest`; `&mut self` makes this the only access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

/// The byte `ranges` of `array`'s dense elements as [`Dest`]s, in order, holding the array's
/// data lock for writing until the last is dropped. `None` (and nothing held) when the array
/// is not dense, its lock is held by anyone (this never waits), or a range is empty, outside
/// the elements or overlaps another.
pub(crate) fn loan_ranges(array: &NDArray, ranges: &[Range<usize>]) -> Option<Vec<Dest>> {
    let mut sorted: Vec<&Range<usize>> = ranges.iter().collect();
    sorted.sort_by_key(|r| r.start);
    if sorted.iter().any(|r| r.start >= r.end) || sorted.windows(2).any(|w| w[0].end > w[1].start) {
        return None;
    }
    let mut guard = array.data_lock().try_write()?;
    let buf: &mut Buffer = guard.dense_mut()?;
    let all: &mut [u8] = crate::with_buffer!(buf, v => bytemuck::cast_slice_mut(&mut v[..]));
    if sorted.last().is_some_and(|r| r.end > all.len()) {
        return None;
    }
    let (ptr, len) = (all.as_mut_ptr(), all.len());
    // Keep the write lock past the guard: `WriteLoan::drop` releases it.
    std::mem::forget(guard);
    let loan = Arc::new(WriteLoan { array: array.clone(), ptr, len });
    // SAFETY (of `add`): every range lies inside the `len` bytes at `ptr` (checked above).
    Some(ranges.iter().map(|r| Dest { loan: Arc::clone(&loan), ptr: unsafe { ptr.add(r.start) }, len: r.end - r.start }).collect())
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
    fn loaned_ranges_write_the_elements_and_hold_the_lock_until_the_last_drops() {
        let a = NDArray::from_vec([4], vec![1.0f32, 2.0, 3.0, 4.0]).unwrap();
        let mut dests = loan_ranges(&a, &[8..16, 0..4]).expect("dense, disjoint");
        assert!(a.data_lock().try_read().is_none(), "the write lock is held");
        assert!(loan_ranges(&a, std::slice::from_ref(&(0..4))).is_none(), "a second loan never waits for the first");
        let mut second = dests.pop().unwrap();
        let first = dests.pop().unwrap();
        std::thread::spawn(move || {
            let mut first = first;
            first.as_mut().copy_from_slice(bytemuck::cast_slice(&[30.0f32, 40.0]));
            assert_eq!(first.as_ref(), bytemuck::cast_slice::<f32, u8>(&[30.0, 40.0]));
        })
        .join()
        .unwrap();
        assert!(a.data_lock().try_read().is_none(), "the remaining range still holds the lock");
        second.as_mut().copy_from_slice(bytemuck::cast_slice(&[10.0f32]));
        drop(second);
        assert_eq!(a.to_vec::<f32>().unwrap(), vec![10.0, 2.0, 30.0, 40.0]);
    }

    #[test]
    fn overlapping_empty_or_outside_ranges_are_not_loaned() {
        let a = NDArray::from_vec([4], vec![1.0f32, 2.0, 3.0, 4.0]).unwrap();
        assert!(loan_ranges(&a, &[0..8, 4..12]).is_none());
        assert!(loan_ranges(&a, std::slice::from_ref(&(4..4))).is_none());
        assert!(loan_ranges(&a, std::slice::from_ref(&(8..20))).is_none());
        assert!(a.data_lock().try_write().is_some(), "a refused loan holds nothing");
    }

    #[test]
    fn a_range_outside_the_elements_is_not_lent() {
        let a = NDArray::from_vec([2], vec![1.0f32, 2.0]).unwrap();
        let keep: Arc<dyn Any + Send + Sync> = Arc::new(());
        assert!(lend_bytes(&a, 4..12, Arc::clone(&keep)).is_none());
        assert!(a.data_lock().try_write().is_some(), "a refused loan holds nothing");
    }
}
