//! [`Data`]: the elements behind a [`Buffer`](super::Buffer) — owned, or borrowed from memory
//! that a front-end owns (a NumPy array, a torch tensor, a C caller's buffer) without copying.
//!
//! This is one of the few modules with `unsafe` code: an external `Data` is a raw pointer and
//! a length. Its constructor is an `unsafe fn` whose contract the front-end upholds (the
//! memory is valid, aligned, not touched by anyone else while the engine may use it, and kept
//! alive by the `owner` guard stored alongside). Everything else reaches the elements through
//! `Deref<Target = [T]>`.

use std::any::Any;
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::Arc;

/// Contiguous elements: an owned `Vec`, or external memory kept alive by an owner guard.
pub struct Data<T> {
    repr: Repr<T>,
}

enum Repr<T> {
    Owned(Vec<T>),
    External(External<T>),
}

struct External<T> {
    ptr: NonNull<T>,
    len: usize,
    _owner: Arc<dyn Any + Send + Sync>,
}

// SAFETY: an `External` is only built by `Data::external`, whose contract makes the memory
// exclusively ours (no other reader or writer while it exists) and valid for `len` elements;
// so moving it to, or sharing it with, another thread is as safe as for a `Vec<T>`.
#[allow(unsafe_code)]
unsafe impl<T: Send> Send for External<T> {}
// SAFETY: as above; shared access only hands out `&[T]`, which is `Sync` when `T` is.
#[allow(unsafe_code)]
unsafe impl<T: Sync> Sync for External<T> {}

impl<T> Data<T> {
    /// Owned elements.
    pub fn owned(v: Vec<T>) -> Data<T> {
        Data { repr: Repr::Owned(v) }
    }

    /// Borrows `len` elements at `ptr` without copying. Returns `None` when `ptr` is null (with
    /// `len > 0`) or not aligned for `T`.
    ///
    /// # Safety
    /// Until the returned `Data` (and every array holding it) is dropped: the memory must stay
    /// valid for reads and writes of `len` elements of `T`, initialised, and must not be read
    /// or written by anything else while the engine may use it (a front-end waits for the
    /// store's operations on the array before handing the memory back to its owner). `owner`
    /// is kept alive as long as the `Data`, so it can hold whatever keeps the memory alive.
    #[allow(unsafe_code)]
    pub unsafe fn external(ptr: *mut T, len: usize, owner: Arc<dyn Any + Send + Sync>) -> Option<Data<T>> {
        let ptr = if len == 0 { NonNull::dangling() } else { NonNull::new(ptr)? };
        if !ptr.as_ptr().is_aligned() {
            return None;
        }
        Some(Data { repr: Repr::External(External { ptr, len, _owner: owner }) })
    }

    /// Whether the elements live in external memory.
    pub fn is_external(&self) -> bool {
        matches!(self.repr, Repr::External(_))
    }
}

impl<T> Deref for Data<T> {
    type Target = [T];

    #[allow(unsafe_code)]
    fn deref(&self) -> &[T] {
        match &self.repr {
            Repr::Owned(v) => v,
            // SAFETY: `Data::external`'s contract: valid, initialised, aligned, `len` elements.
            Repr::External(e) => unsafe { std::slice::from_raw_parts(e.ptr.as_ptr(), e.len) },
        }
    }
}

impl<T> DerefMut for Data<T> {
    #[allow(unsafe_code)]
    fn deref_mut(&mut self) -> &mut [T] {
        match &mut self.repr {
            Repr::Owned(v) => v,
            // SAFETY: as in `deref`, plus exclusivity: `&mut self` and the contract that nothing
            // else touches the memory.
            Repr::External(e) => unsafe { std::slice::from_raw_parts_mut(e.ptr.as_ptr(), e.len) },
        }
    }
}

impl<T> From<Vec<T>> for Data<T> {
    fn from(v: Vec<T>) -> Self {
        Data::owned(v)
    }
}

/// A clone is always owned: cloning external memory copies it.
impl<T: Clone> Clone for Data<T> {
    fn clone(&self) -> Self {
        Data::owned(self.to_vec())
    }
}

impl<T: PartialEq> PartialEq for Data<T> {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl<T: fmt::Debug> fmt::Debug for Data<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

#[cfg(test)]
#[allow(unsafe_code)]
mod tests {
    use super::*;

    #[test]
    fn external_memory_is_read_and_written_in_place() {
        let mut backing = vec![1.0f32, 2.0, 3.0];
        let ptr = backing.as_mut_ptr();
        // SAFETY: `backing` outlives `d` and is not touched while `d` exists.
        let mut d = unsafe { Data::external(ptr, 3, Arc::new(())) }.expect("aligned");
        assert!(d.is_external());
        d[1] = 20.0;
        let copy = d.clone();
        assert!(!copy.is_external());
        drop(d);
        assert_eq!(backing, vec![1.0, 20.0, 3.0]);
        assert_eq!(copy, Data::owned(vec![1.0, 20.0, 3.0]));
    }

    #[test]
    fn misaligned_or_null_is_refused() {
        let mut bytes = [0u8; 16];
        let odd = bytes[1..].as_mut_ptr() as *mut f32;
        // SAFETY: refused before any access.
        assert!(unsafe { Data::external(odd, 2, Arc::new(())) }.is_none());
        // SAFETY: refused before any access.
        assert!(unsafe { Data::<f32>::external(std::ptr::null_mut(), 2, Arc::new(())) }.is_none());
        // SAFETY: zero elements are never accessed.
        assert!(unsafe { Data::<f32>::external(std::ptr::null_mut(), 0, Arc::new(())) }.is_some());
    }
}
