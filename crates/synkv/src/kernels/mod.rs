//! Kernels: vectorised, parallel loops over slices. CONTRACT STUB — being implemented.
use half::{bf16, f16};

/// A numeric element type the kernels work on.
pub trait Element: Copy + Send + Sync + Default + PartialEq + std::fmt::Debug + 'static {
    /// Converts to f64 (exact for every supported type but i64 beyond 2^53).
    fn to_f64(self) -> f64;
    /// Converts from f64, rounding to nearest (saturating for ints).
    fn from_f64(v: f64) -> Self;
}
macro_rules! impl_element_float {
    ($t:ty) => {
        impl Element for $t {
            fn to_f64(self) -> f64 {
                self as f64
            }
            fn from_f64(v: f64) -> Self {
                v as $t
            }
        }
    };
}
impl_element_float!(f32);
impl_element_float!(f64);
impl_element_float!(i32);
impl_element_float!(i64);
impl Element for f16 {
    fn to_f64(self) -> f64 {
        f16::to_f64(self)
    }
    fn from_f64(v: f64) -> Self {
        f16::from_f64(v)
    }
}
impl Element for bf16 {
    fn to_f64(self) -> f64 {
        bf16::to_f64(self)
    }
    fn from_f64(v: f64) -> Self {
        bf16::from_f64(v)
    }
}

/// `dst = Σ srcs` (assign). Every slice has `dst.len()` elements; `srcs` is not empty.
pub fn sum_into<T: Element>(dst: &mut [T], srcs: &[&[T]]) {
    for (i, d) in dst.iter_mut().enumerate() {
        let mut acc = 0.0;
        for s in srcs {
            acc += s[i].to_f64();
        }
        *d = T::from_f64(acc);
    }
}

/// `dst += src`.
pub fn add_into<T: Element>(dst: &mut [T], src: &[T]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d = T::from_f64(d.to_f64() + s.to_f64());
    }
}

/// `dst = src`.
pub fn copy<T: Element>(dst: &mut [T], src: &[T]) {
    dst.copy_from_slice(src);
}

/// `dst += a * x`.
pub fn axpy<T: Element>(dst: &mut [T], a: f64, x: &[T]) {
    for (d, s) in dst.iter_mut().zip(x) {
        *d = T::from_f64(d.to_f64() + a * s.to_f64());
    }
}

/// `dst *= a`.
pub fn scale<T: Element>(dst: &mut [T], a: f64) {
    for d in dst.iter_mut() {
        *d = T::from_f64(d.to_f64() * a);
    }
}

/// `dst[i] = v` for every i.
pub fn fill<T: Element>(dst: &mut [T], v: T) {
    for d in dst.iter_mut() {
        *d = v;
    }
}

/// `dst[i] = src[i] as U`.
pub fn cast<T: Element, U: Element>(dst: &mut [U], src: &[T]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d = U::from_f64(s.to_f64());
    }
}
