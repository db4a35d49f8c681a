//! Borrowed weight and gradient buffers, and their element types.
//!
//! The optimizer works on plain slices, so it needs no array type of its own: the store
//! lends it the weight mutably ([`WeightMut`]) and the merged gradient immutably
//! ([`GradRef`]). Both are enums over the four floating-point element types synkv keeps;
//! weight and gradient must have the same element type and length. `of` borrows one from an
//! array buffer (`None` for a buffer of integers).

use std::fmt;

use half::{bf16, f16};

use crate::ndarray::Buffer;
use serde::{Deserialize, Serialize};

/// Floating-point element types the optimizer understands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum ElemType {
    /// IEEE binary32.
    F32,
    /// IEEE binary64.
    F64,
    /// IEEE binary16.
    F16,
    /// bfloat16.
    BF16,
}

impl ElemType {
    /// Size of one element in bytes.
    pub fn size(self) -> usize {
        match self {
            ElemType::F32 => 4,
            ElemType::F64 => 8,
            ElemType::F16 | ElemType::BF16 => 2,
        }
    }

    /// The name used in state files and messages (`"f32"`, `"f64"`, `"f16"`, `"bf16"`).
    pub fn name(self) -> &'static str {
        match self {
            ElemType::F32 => "f32",
            ElemType::F64 => "f64",
            ElemType::F16 => "f16",
            ElemType::BF16 => "bf16",
        }
    }
}

impl fmt::Display for ElemType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A weight buffer the optimizer updates in place.
#[derive(Debug)]
#[non_exhaustive]
pub enum WeightMut<'a> {
    /// float32 weights.
    F32(&'a mut [f32]),
    /// float64 weights.
    F64(&'a mut [f64]),
    /// float16 weights.
    F16(&'a mut [f16]),
    /// bfloat16 weights.
    BF16(&'a mut [bf16]),
}

/// A gradient buffer the optimizer reads.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub enum GradRef<'a> {
    /// float32 gradient.
    F32(&'a [f32]),
    /// float64 gradient.
    F64(&'a [f64]),
    /// float16 gradient.
    F16(&'a [f16]),
    /// bfloat16 gradient.
    BF16(&'a [bf16]),
}

impl<'a> WeightMut<'a> {
    /// The elements of a float buffer, to update in place; `None` for other element types.
    pub fn of(b: &'a mut Buffer) -> Option<WeightMut<'a>> {
        match b {
            Buffer::F32(v) => Some(WeightMut::F32(&mut v[..])),
            Buffer::F64(v) => Some(WeightMut::F64(&mut v[..])),
            Buffer::F16(v) => Some(WeightMut::F16(&mut v[..])),
            Buffer::BF16(v) => Some(WeightMut::BF16(&mut v[..])),
            _ => None,
        }
    }

    /// Element type of the buffer.
    pub fn elem_type(&self) -> ElemType {
        match self {
            WeightMut::F32(_) => ElemType::F32,
            WeightMut::F64(_) => ElemType::F64,
            WeightMut::F16(_) => ElemType::F16,
            WeightMut::BF16(_) => ElemType::BF16,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            WeightMut::F32(w) => w.len(),
            WeightMut::F64(w) => w.len(),
            WeightMut::F16(w) => w.len(),
            WeightMut::BF16(w) => w.len(),
        }
    }

    /// Whether the buffer has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The weight widened to f32 (f64 is rounded); used to create master copies.
    pub(crate) fn to_f32_vec(&self) -> Vec<f32> {
        match self {
            WeightMut::F32(w) => w.to_vec(),
            WeightMut::F64(w) => w.iter().map(|&x| x as f32).collect(),
            WeightMut::F16(w) => w.iter().map(|x| x.to_f32()).collect(),
            WeightMut::BF16(w) => w.iter().map(|x| x.to_f32()).collect(),
        }
    }
}

impl<'a> GradRef<'a> {
    /// The elements of a float buffer; `None` for other element types.
    pub fn of(b: &'a Buffer) -> Option<GradRef<'a>> {
        match b {
            Buffer::F32(v) => Some(GradRef::F32(&v[..])),
            Buffer::F64(v) => Some(GradRef::F64(&v[..])),
            Buffer::F16(v) => Some(GradRef::F16(&v[..])),
            Buffer::BF16(v) => Some(GradRef::BF16(&v[..])),
            _ => None,
        }
    }

    /// Element type of the buffer.
    pub fn elem_type(&self) -> ElemType {
        match self {
            GradRef::F32(_) => ElemType::F32,
            GradRef::F64(_) => ElemType::F64,
            GradRef::F16(_) => ElemType::F16,
            GradRef::BF16(_) => ElemType::BF16,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            GradRef::F32(g) => g.len(),
            GradRef::F64(g) => g.len(),
            GradRef::F16(g) => g.len(),
            GradRef::BF16(g) => g.len(),
        }
    }

    /// Whether the buffer has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

macro_rules! conversions {
    ($($variant:ident => $t:ty),*) => {$(
        impl<'a> From<&'a mut [$t]> for WeightMut<'a> {
            fn from(w: &'a mut [$t]) -> Self {
                WeightMut::$variant(w)
            }
        }
        impl<'a> From<&'a mut Vec<$t>> for WeightMut<'a> {
            fn from(w: &'a mut Vec<$t>) -> Self {
                WeightMut::$variant(w.as_mut_slice())
            }
        }
        impl<'a> From<&'a [$t]> for GradRef<'a> {
            fn from(g: &'a [$t]) -> Self {
                GradRef::$variant(g)
            }
        }
        impl<'a> From<&'a Vec<$t>> for GradRef<'a> {
            fn from(g: &'a Vec<$t>) -> Self {
                GradRef::$variant(g.as_slice())
            }
        }
    )*};
}

conversions!(F32 => f32, F64 => f64, F16 => f16, BF16 => bf16);
