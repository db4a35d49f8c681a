//! The [`Element`] trait: the numeric types the kernels work on, and how a generic kernel finds
//! the fast path for its type at compile time.
//!
//! Each built-in type overrides three hidden methods ([`Element::view`], [`Element::view_mut`],
//! [`Element::view_list`]) that hand its slices back as one variant of a closed enum
//! ([`View`], [`ViewMut`], [`ViewList`]). For `T = f32` the override is the identity wrapped in
//! `View::F32`, so after monomorphisation the `match` in a kernel folds away: no `TypeId`, no
//! unsafe casts, no run-time cost. A type implemented outside this module keeps the defaults
//! (`Other`) and gets the generic path, which computes through `f64` like the original stub.

use half::{bf16, f16};

/// A numeric element type the kernels work on.
pub trait Element: Copy + Send + Sync + Default + PartialEq + std::fmt::Debug + 'static {
    /// Converts to f64 (exact for every supported type but i64 beyond 2^53).
    fn to_f64(self) -> f64;
    /// Converts from f64, rounding to nearest (saturating for ints).
    fn from_f64(v: f64) -> Self;

    /// Returns `s` as the built-in type it is, so kernels can pick a fast path. Implementation
    /// detail of the kernels; keep the default when implementing `Element` elsewhere.
    #[doc(hidden)]
    #[inline(always)]
    fn view(s: &[Self]) -> View<'_, Self> {
        View::Other(s)
    }
    /// Mutable counterpart of [`Element::view`]; keep the default.
    #[doc(hidden)]
    #[inline(always)]
    fn view_mut(s: &mut [Self]) -> ViewMut<'_, Self> {
        ViewMut::Other(s)
    }
    /// List counterpart of [`Element::view`]; keep the default.
    #[doc(hidden)]
    #[inline(always)]
    fn view_list<'a, 'b>(s: &'a [&'b [Self]]) -> ViewList<'a, 'b, Self> {
        ViewList::Other(s)
    }
}

/// A shared slice seen as the built-in element type it is (see [`Element::view`]).
#[doc(hidden)]
#[derive(Debug)]
pub enum View<'a, T> {
    /// `f32` elements.
    F32(&'a [f32]),
    /// `f64` elements.
    F64(&'a [f64]),
    /// IEEE half elements.
    F16(&'a [f16]),
    /// bfloat16 elements.
    Bf16(&'a [bf16]),
    /// `i32` elements.
    I32(&'a [i32]),
    /// `i64` elements.
    I64(&'a [i64]),
    /// Any other element type: the generic path.
    Other(&'a [T]),
}

/// A mutable slice seen as the built-in element type it is (see [`Element::view_mut`]).
#[doc(hidden)]
#[derive(Debug)]
pub enum ViewMut<'a, T> {
    /// `f32` elements.
    F32(&'a mut [f32]),
    /// `f64` elements.
    F64(&'a mut [f64]),
    /// IEEE half elements.
    F16(&'a mut [f16]),
    /// bfloat16 elements.
    Bf16(&'a mut [bf16]),
    /// `i32` elements.
    I32(&'a mut [i32]),
    /// `i64` elements.
    I64(&'a mut [i64]),
    /// Any other element type: the generic path.
    Other(&'a mut [T]),
}

/// A list of slices seen as the built-in element type they are (see [`Element::view_list`]).
#[doc(hidden)]
#[derive(Debug)]
pub enum ViewList<'a, 'b, T> {
    /// `f32` elements.
    F32(&'a [&'b [f32]]),
    /// `f64` elements.
    F64(&'a [&'b [f64]]),
    /// IEEE half elements.
    F16(&'a [&'b [f16]]),
    /// bfloat16 elements.
    Bf16(&'a [&'b [bf16]]),
    /// `i32` elements.
    I32(&'a [&'b [i32]]),
    /// `i64` elements.
    I64(&'a [&'b [i64]]),
    /// Any other element type: the generic path.
    Other(&'a [&'b [T]]),
}

macro_rules! views {
    ($variant:ident) => {
        #[inline(always)]
        fn view(s: &[Self]) -> View<'_, Self> {
            View::$variant(s)
        }
        #[inline(always)]
        fn view_mut(s: &mut [Self]) -> ViewMut<'_, Self> {
            ViewMut::$variant(s)
        }
        #[inline(always)]
        fn view_list<'a, 'b>(s: &'a [&'b [Self]]) -> ViewList<'a, 'b, Self> {
            ViewList::$variant(s)
        }
    };
}

impl Element for f32 {
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self as f64
    }
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        v as f32
    }
    views!(F32);
}

impl Element for f64 {
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self
    }
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        v
    }
    views!(F64);
}

macro_rules! impl_element_int {
    ($t:ty, $variant:ident) => {
        /// Integers: `from_f64` rounds to nearest (ties away from zero), saturates at the
        /// type's bounds and maps NaN to 0.
        impl Element for $t {
            #[inline(always)]
            fn to_f64(self) -> f64 {
                self as f64
            }
            #[inline(always)]
            fn from_f64(v: f64) -> Self {
                // `as` saturates and maps NaN to 0; `round` supplies round-to-nearest.
                v.round() as $t
            }
            views!($variant);
        }
    };
}
impl_element_int!(i32, I32);
impl_element_int!(i64, I64);

/// f64 → f32 rounding to odd: truncate toward zero, then set the last bit if anything was cut
/// off. Rounding that result again, to a format at least two bits narrower (f16, bf16), gives
/// the correctly rounded (nearest-even) value of the original f64 — no double-rounding error.
/// Values exact in f32 pass through unchanged.
#[inline]
pub(crate) fn f64_to_f32_odd(v: f64) -> f32 {
    let f = v as f32;
    if f.is_nan() || f64::from(f) == v {
        return f;
    }
    let mut bits = f.to_bits();
    if f64::from(f).abs() > v.abs() {
        // Rounded away from zero (possibly to infinity): step back toward zero.
        bits -= 1;
    }
    f32::from_bits(bits | 1)
}

/// IEEE half: `from_f64` is correctly rounded (nearest even) on every machine. (`half`'s own
/// `f16::from_f64` rounds twice on CPUs with F16C, so it can differ in rare halfway cases.)
impl Element for f16 {
    #[inline(always)]
    fn to_f64(self) -> f64 {
        f16::to_f64(self)
    }
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        f16::from_f32(f64_to_f32_odd(v))
    }
    views!(F16);
}

/// bfloat16: `from_f64` is correctly rounded (nearest even). (`half` 2.7's `bf16::from_f64`
/// ignores the low 32 mantissa bits when rounding, so it can round a value just above a
/// halfway point down.)
impl Element for bf16 {
    #[inline(always)]
    fn to_f64(self) -> f64 {
        bf16::to_f64(self)
    }
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        bf16::from_f32(f64_to_f32_odd(v))
    }
    views!(Bf16);
}
