//! [`Buffer`]: an owned, contiguous vector of one dtype.
//!
//! The enum carries the element type at run time; [`with_buffer!`](crate::with_buffer) and
//! [`with_buffer_pair!`](crate::with_buffer_pair) turn it back into a typed slice so that the
//! generic kernels in [`crate::kernels`] run on it.

use half::{bf16, f16};

use super::data::Data;
use super::DType;
use crate::kernels::{self, Element};

/// Bytes per chunk of a fused copy into several outputs: large enough for the kernels to
/// stream (non-temporal stores) and split over threads, small enough to stay in the L3 cache
/// between the copies.
const FUSED_CHUNK_BYTES: usize = 8 << 20;

/// A typed, contiguous vector of elements (owned, or external memory: see [`Data`]).
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Buffer {
    /// `f32` elements.
    F32(Data<f32>),
    /// `f64` elements.
    F64(Data<f64>),
    /// `f16` elements.
    F16(Data<f16>),
    /// `bf16` elements.
    BF16(Data<bf16>),
    /// `i32` elements.
    I32(Data<i32>),
    /// `i64` elements.
    I64(Data<i64>),
}

/// Runs `$body` with `$v` bound to the typed vector inside a [`Buffer`] (by reference, mutable
/// reference or value, following how the buffer expression is given).
#[macro_export]
#[doc(hidden)]
macro_rules! with_buffer {
    ($buf:expr, $v:ident => $body:expr) => {
        match $buf {
            $crate::ndarray::Buffer::F32($v) => $body,
            $crate::ndarray::Buffer::F64($v) => $body,
            $crate::ndarray::Buffer::F16($v) => $body,
            $crate::ndarray::Buffer::BF16($v) => $body,
            $crate::ndarray::Buffer::I32($v) => $body,
            $crate::ndarray::Buffer::I64($v) => $body,
        }
    };
}

/// Runs `$body` with two buffers of the same dtype bound as typed vectors; evaluates `$else`
/// when their dtypes differ.
#[macro_export]
#[doc(hidden)]
macro_rules! with_buffer_pair {
    ($a:expr, $b:expr, ($x:ident, $y:ident) => $body:expr, else => $else:expr) => {
        match ($a, $b) {
            ($crate::ndarray::Buffer::F32($x), $crate::ndarray::Buffer::F32($y)) => $body,
            ($crate::ndarray::Buffer::F64($x), $crate::ndarray::Buffer::F64($y)) => $body,
            ($crate::ndarray::Buffer::F16($x), $crate::ndarray::Buffer::F16($y)) => $body,
            ($crate::ndarray::Buffer::BF16($x), $crate::ndarray::Buffer::BF16($y)) => $body,
            ($crate::ndarray::Buffer::I32($x), $crate::ndarray::Buffer::I32($y)) => $body,
            ($crate::ndarray::Buffer::I64($x), $crate::ndarray::Buffer::I64($y)) => $body,
            #[allow(unreachable_patterns)]
            _ => $else,
        }
    };
}

/// An element type that a [`Buffer`] can hold: ties a Rust type to its [`DType`].
pub trait BufferElement: Element {
    /// The dtype of this Rust type.
    const DTYPE: DType;
    /// Wraps a vector into a buffer.
    fn into_buffer(v: Vec<Self>) -> Buffer;
    /// Wraps owned or external elements into a buffer.
    fn data_into_buffer(d: Data<Self>) -> Buffer;
    /// Borrows the vector inside a buffer of this dtype.
    fn slice_of(b: &Buffer) -> Option<&[Self]>;
    /// Mutably borrows the vector inside a buffer of this dtype.
    fn slice_of_mut(b: &mut Buffer) -> Option<&mut [Self]>;
}

macro_rules! impl_buffer_element {
    ($t:ty, $variant:ident) => {
        impl BufferElement for $t {
            const DTYPE: DType = DType::$variant;
            fn into_buffer(v: Vec<Self>) -> Buffer {
                Buffer::$variant(Data::owned(v))
            }
            fn data_into_buffer(d: Data<Self>) -> Buffer {
                Buffer::$variant(d)
            }
            fn slice_of(b: &Buffer) -> Option<&[Self]> {
                match b {
                    Buffer::$variant(v) => Some(&v[..]),
                    _ => None,
                }
            }
            fn slice_of_mut(b: &mut Buffer) -> Option<&mut [Self]> {
                match b {
                    Buffer::$variant(v) => Some(&mut v[..]),
                    _ => None,
                }
            }
        }
    };
}
impl_buffer_element!(f32, F32);
impl_buffer_element!(f64, F64);
impl_buffer_element!(f16, F16);
impl_buffer_element!(bf16, BF16);
impl_buffer_element!(i32, I32);
impl_buffer_element!(i64, I64);

impl Buffer {
    /// A buffer owning `v`.
    pub fn from_vec<T: BufferElement>(v: Vec<T>) -> Buffer {
        T::into_buffer(v)
    }

    /// A buffer over `d` (owned or external elements).
    pub fn from_data<T: BufferElement>(d: Data<T>) -> Buffer {
        T::data_into_buffer(d)
    }

    /// Whether the elements live in external memory (see [`Data::external`]).
    pub fn is_external(&self) -> bool {
        with_buffer!(self, v => v.is_external())
    }

    /// A buffer of `len` zeros.
    pub fn zeros(dtype: DType, len: usize) -> Buffer {
        Buffer::filled(dtype, len, 0.0)
    }

    /// A buffer of `len` copies of `value` (converted to the dtype).
    pub fn filled(dtype: DType, len: usize, value: f64) -> Buffer {
        fn make<T: BufferElement>(len: usize, value: f64) -> Buffer {
            T::into_buffer(vec![T::from_f64(value); len])
        }
        match dtype {
            DType::F32 => make::<f32>(len, value),
            DType::F64 => make::<f64>(len, value),
            DType::F16 => make::<f16>(len, value),
            DType::BF16 => make::<bf16>(len, value),
            DType::I32 => make::<i32>(len, value),
            DType::I64 => make::<i64>(len, value),
        }
    }

    /// The dtype of the elements.
    pub fn dtype(&self) -> DType {
        match self {
            Buffer::F32(_) => DType::F32,
            Buffer::F64(_) => DType::F64,
            Buffer::F16(_) => DType::F16,
            Buffer::BF16(_) => DType::BF16,
            Buffer::I32(_) => DType::I32,
            Buffer::I64(_) => DType::I64,
        }
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        with_buffer!(self, v => v.len())
    }

    /// Whether the buffer holds no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The elements converted to `T`.
    pub fn to_vec<T: BufferElement>(&self) -> Vec<T> {
        if let Some(s) = T::slice_of(self) {
            return s.to_vec();
        }
        let mut out = vec![T::default(); self.len()];
        with_buffer!(self, v => kernels::cast(&mut out, v));
        out
    }

    /// A copy of this buffer converted to `dtype` (a plain clone when it already has it).
    pub fn cast(&self, dtype: DType) -> Buffer {
        if dtype == self.dtype() {
            return self.clone();
        }
        let mut out = Buffer::zeros(dtype, self.len());
        out.assign_cast(self);
        out
    }

    /// Copies `src` into `self`, converting dtypes as needed. Lengths must be equal (callers
    /// validate shapes first; a mismatch copies the common prefix only).
    pub fn assign_cast(&mut self, src: &Buffer) {
        if self.dtype() == src.dtype() {
            with_buffer_pair!(&mut *self, src, (d, s) => {
                let n = d.len().min(s.len());
                kernels::copy(&mut d[..n], &s[..n])
            }, else => ());
        } else {
            with_buffer!(&mut *self, d => with_buffer!(src, s => kernels::cast(&mut d[..], &s[..])));
        }
    }

    /// `self = Σ srcs` in one pass (the store's fused reduction). Sources of another dtype
    /// are converted first. `srcs` must not be empty and every source has `self.len()` elements.
    pub(crate) fn assign_sum(&mut self, srcs: &[&Buffer]) {
        fn typed<T: BufferElement>(dst: &mut [T], srcs: &[&Buffer]) -> bool {
            let mut slices: smallvec::SmallVec<[&[T]; 8]> = smallvec::SmallVec::with_capacity(srcs.len());
            for s in srcs {
                match T::slice_of(s) {
                    Some(sl) => slices.push(sl),
                    None => return false,
                }
            }
            // Callers validate shapes; a short source only shortens what is written.
            let n = slices.iter().map(|s| s.len()).fold(dst.len(), usize::min);
            let dst = &mut dst[..n];
            if slices.len() == 1 {
                kernels::copy(dst, &slices[0][..n]);
            } else if !slices.is_empty() {
                kernels::sum_into(dst, &slices);
            }
            true
        }
        let done = with_buffer!(self, d => typed(&mut d[..], srcs));
        if !done {
            let dtype = self.dtype();
            let cast: Vec<Buffer> = srcs.iter().map(|s| s.cast(dtype)).collect();
            let refs: Vec<&Buffer> = cast.iter().collect();
            with_buffer!(self, d => typed(&mut d[..], &refs));
        }
    }

    /// `self[dst_off..dst_off+len] += src[src_off..src_off+len]`, converting dtypes.
    pub(crate) fn add_range_from(&mut self, dst_off: usize, src: &Buffer, src_off: usize, len: usize) {
        if self.dtype() == src.dtype() {
            with_buffer_pair!(&mut *self, src, (d, s) => kernels::add_into(&mut d[dst_off..dst_off + len], &s[src_off..src_off + len]), else => ());
        } else {
            let part = Buffer::from_range(src, src_off, len).cast(self.dtype());
            self.add_range_from(dst_off, &part, 0, len);
        }
    }

    /// A copy of `src[off..off+len]`.
    pub(crate) fn from_range(src: &Buffer, off: usize, len: usize) -> Buffer {
        with_buffer!(src, s => BufferElement::into_buffer(s[off..off + len].to_vec()))
    }

    /// Copies `self` into every buffer of `dsts` (all of this dtype and length) reading `self`
    /// once: chunk by chunk, so the second and later copies of a chunk read it from cache. A
    /// pull into K outputs then costs one read of the stored value instead of K.
    pub(crate) fn copy_into_many(&self, dsts: &mut [&mut Buffer]) {
        fn typed<T: BufferElement>(src: &[T], dsts: &mut [&mut Buffer]) {
            let chunk = (FUSED_CHUNK_BYTES / std::mem::size_of::<T>()).max(1);
            let mut outs: smallvec::SmallVec<[&mut [T]; 8]> = dsts.iter_mut().filter_map(|d| T::slice_of_mut(d)).collect();
            let mut start = 0;
            while start < src.len() {
                let end = (start + chunk).min(src.len());
                for out in outs.iter_mut() {
                    if out.len() >= end {
                        kernels::copy(&mut out[start..end], &src[start..end]);
                    }
                }
                start = end;
            }
        }
        with_buffer!(self, s => typed(&s[..], dsts));
    }

    /// Copies `src[src_off..src_off+len]` into `self[dst_off..dst_off+len]`, converting dtypes.
    pub(crate) fn copy_range_from(&mut self, dst_off: usize, src: &Buffer, src_off: usize, len: usize) {
        if self.dtype() == src.dtype() {
            with_buffer_pair!(&mut *self, src, (d, s) => kernels::copy(&mut d[dst_off..dst_off + len], &s[src_off..src_off + len]), else => ());
        } else {
            with_buffer!(&mut *self, d => with_buffer!(src, s => kernels::cast(&mut d[dst_off..dst_off + len], &s[src_off..src_off + len])));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn casts_between_dtypes() {
        let b = Buffer::from_vec(vec![1.5f32, -2.0, 3.25]);
        assert_eq!(b.cast(DType::F64), Buffer::from_vec(vec![1.5f64, -2.0, 3.25]));
        assert_eq!(b.to_vec::<f16>(), vec![f16::from_f32(1.5), f16::from_f32(-2.0), f16::from_f32(3.25)]);
        assert_eq!(Buffer::filled(DType::I64, 2, 7.0), Buffer::from_vec(vec![7i64, 7]));
        assert_eq!(b.dtype(), DType::F32);
        assert_eq!(b.len(), 3);
    }
}
