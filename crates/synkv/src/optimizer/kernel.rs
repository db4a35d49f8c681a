//! The machinery every optimizer kernel shares: compute types, storage lanes and the
//! fused, chunked, parallel element loop.
//!
//! An optimizer's arithmetic is written once, per element, as an [`ElemKernel`]: it gets
//! the weight, the gradient and its `K` state values, updates the states and returns the
//! new weight. [`run`] drives that function over whole slices in **one pass** (each of
//! weight, gradient and states is read once and written once), in chunks that rayon runs
//! in parallel once an array has more than [`PAR_MIN_LEN`] elements. The loops index
//! slices that were re-sliced to a common length and the per-element functions use
//! selects instead of branches, so LLVM vectorises them.
//!
//! Compute types ([`Real`]) are `f32` and `f64`. Storage types ([`Lane`]) add `f16` and
//! `bf16`, which are widened to `f32` per element. A [`Target`] is either the weight
//! itself or, with multi-precision, an f32 master copy plus the low-precision weight that
//! receives the rounded result. A [`Grad`] is a gradient slice or implicit zeros (rows a
//! row_sparse gradient does not contain, in standard mode).

use std::fmt::Debug;
use std::ops::{Add, Div, Mul, Neg, Sub};

use half::{bf16, f16, slice::HalfFloatSliceExt};
use rayon::prelude::*;

use super::state::SlotData;
use super::ElemType;

/// Arrays with at most this many elements are updated on the calling thread; longer ones
/// are split into chunks of about this size that run on the rayon pool.
pub const PAR_MIN_LEN: usize = 1 << 16;

/// A compute type: `f32` or `f64`.
pub(crate) trait Real:
    Copy
    + Send
    + Sync
    + Debug
    + PartialOrd
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Neg<Output = Self>
    + Lane<A = Self>
    + 'static
{
    const ZERO: Self;
    const ONE: Self;
    const ELEM: ElemType;
    fn from_f64(x: f64) -> Self;
    fn to_f64(self) -> f64;
    fn sqrt(self) -> Self;
    fn abs(self) -> Self;
    fn powf(self, e: Self) -> Self;
    fn slot_mut(data: &mut SlotData) -> Option<&mut [Self]>;
}

macro_rules! real {
    ($t:ty, $elem:ident) => {
        impl Real for $t {
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            const ELEM: ElemType = ElemType::$elem;
            #[inline(always)]
            fn from_f64(x: f64) -> Self {
                x as $t
            }
            #[inline(always)]
            fn to_f64(self) -> f64 {
                self as f64
            }
            #[inline(always)]
            fn sqrt(self) -> Self {
                <$t>::sqrt(self)
            }
            #[inline(always)]
            fn abs(self) -> Self {
                <$t>::abs(self)
            }
            #[inline(always)]
            fn powf(self, e: Self) -> Self {
                <$t>::powf(self, e)
            }
            fn slot_mut(data: &mut SlotData) -> Option<&mut [Self]> {
                match data {
                    SlotData::$elem(v) => Some(v),
                    _ => None,
                }
            }
        }
    };
}

real!(f32, F32);
real!(f64, F64);

/// A storage type and the compute type it is updated in.
pub(crate) trait Lane: Copy + Send + Sync + 'static {
    type A: Real;
    /// Whether the compute type is wider than the storage type (f16, bf16): such lanes
    /// are converted block-wise with [`Lane::widen`]/[`Lane::narrow`].
    const WIDENS: bool = false;
    fn load(self) -> Self::A;
    fn store(a: Self::A) -> Self;
    /// Converts a block to the compute type.
    #[inline(always)]
    fn widen(src: &[Self], dst: &mut [Self::A]) {
        for (d, s) in dst.iter_mut().zip(src) {
            *d = s.load();
        }
    }
    /// Rounds a block into the storage type.
    #[inline(always)]
    fn narrow(src: &[Self::A], dst: &mut [Self]) {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = Self::store(s);
        }
    }
}

impl Lane for f32 {
    type A = f32;
    #[inline(always)]
    fn load(self) -> f32 {
        self
    }
    #[inline(always)]
    fn store(a: f32) -> f32 {
        a
    }
}

impl Lane for f64 {
    type A = f64;
    #[inline(always)]
    fn load(self) -> f64 {
        self
    }
    #[inline(always)]
    fn store(a: f64) -> f64 {
        a
    }
}

impl Lane for f16 {
    type A = f32;
    const WIDENS: bool = true;
    #[inline(always)]
    fn load(self) -> f32 {
        self.to_f32()
    }
    #[inline(always)]
    fn store(a: f32) -> f16 {
        f16::from_f32(a)
    }
    // `half`'s slice conversions use F16C/NEON when the CPU has them (detected at run
    // time), which per-element conversion in a baseline build cannot.
    fn widen(src: &[f16], dst: &mut [f32]) {
        src.convert_to_f32_slice(dst);
    }
    fn narrow(src: &[f32], dst: &mut [f16]) {
        dst.convert_from_f32_slice(src);
    }
}

impl Lane for bf16 {
    type A = f32;
    const WIDENS: bool = true;
    #[inline(always)]
    fn load(self) -> f32 {
        self.to_f32()
    }
    #[inline(always)]
    fn store(a: f32) -> bf16 {
        bf16::from_f32(a)
    }
    // `half`'s slice conversions use F16C/NEON when the CPU has them (detected at run
    // time), which per-element conversion in a baseline build cannot.
    fn widen(src: &[bf16], dst: &mut [f32]) {
        src.convert_to_f32_slice(dst);
    }
    fn narrow(src: &[f32], dst: &mut [bf16]) {
        dst.convert_from_f32_slice(src);
    }
}

/// MXNet's `clip::Map`: values above `c` become `c`, below `-c` become `-c`; NaN passes.
#[inline(always)]
pub(crate) fn clip<A: Real>(x: A, c: A) -> A {
    let y = if x > c { c } else { x };
    if x < -c {
        -c
    } else {
        y
    }
}

/// MXNet's `sign`: 1, -1 or 0 (NaN gives 0).
#[inline(always)]
pub(crate) fn sign<A: Real>(x: A) -> A {
    let p = if x > A::ZERO { A::ONE } else { A::ZERO };
    let n = if x < A::ZERO { A::ONE } else { A::ZERO };
    p - n
}

/// One optimizer step for one element with `K` state values.
pub(crate) trait ElemKernel<A: Real, const K: usize>: Sync {
    /// Updates `s` in place and returns the new weight.
    fn step(&self, w: A, g: A, s: &mut [A; K]) -> A;
}

/// Where the new weight goes.
pub(crate) enum Target<'a, W: Lane> {
    /// Update the weight in place (computing in `W::A`).
    InPlace(&'a mut [W]),
    /// Update an f32 master copy and round the result into the low-precision weight.
    Master { master: &'a mut [W::A], out: &'a mut [W] },
}

impl<W: Lane> Target<'_, W> {
    pub(crate) fn len(&self) -> usize {
        match self {
            Target::InPlace(w) => w.len(),
            Target::Master { out, .. } => out.len(),
        }
    }

    /// The sub-target for elements `start..start + len`.
    pub(crate) fn slice(&mut self, start: usize, len: usize) -> Target<'_, W> {
        match self {
            Target::InPlace(w) => Target::InPlace(&mut w[start..start + len]),
            Target::Master { master, out } => Target::Master { master: &mut master[start..start + len], out: &mut out[start..start + len] },
        }
    }
}

/// Gradient source for a run.
#[derive(Clone, Copy)]
pub(crate) enum Grad<'a, W> {
    /// A gradient slice of the target's length.
    Dense(&'a [W]),
    /// All-zero gradient (absent rows of a row_sparse gradient, standard mode).
    Zero,
}

/// Something that can be cut in two at an element index (slices, arrays and tuples of
/// slices), so one chunking routine serves every kernel.
pub(crate) trait Split: Sized + Send {
    fn split(self, mid: usize) -> (Self, Self);
}

impl<T: Send> Split for &mut [T] {
    fn split(self, mid: usize) -> (Self, Self) {
        self.split_at_mut(mid)
    }
}

impl<T: Sync> Split for &[T] {
    fn split(self, mid: usize) -> (Self, Self) {
        self.split_at(mid)
    }
}

impl Split for () {
    fn split(self, _: usize) -> (Self, Self) {
        ((), ())
    }
}

impl<S: Split, const K: usize> Split for [S; K] {
    fn split(self, mid: usize) -> (Self, Self) {
        let mut right = Vec::with_capacity(K);
        let left = self.map(|s| {
            let (l, r) = s.split(mid);
            right.push(r);
            l
        });
        match right.try_into() {
            Ok(right) => (left, right),
            Err(_) => unreachable!("an array of K parts splits into K right halves"),
        }
    }
}

impl<A: Split, B: Split> Split for (A, B) {
    fn split(self, mid: usize) -> (Self, Self) {
        let (a0, a1) = self.0.split(mid);
        let (b0, b1) = self.1.split(mid);
        ((a0, b0), (a1, b1))
    }
}

impl<A: Split, B: Split, C: Split> Split for (A, B, C) {
    fn split(self, mid: usize) -> (Self, Self) {
        let (a0, a1) = self.0.split(mid);
        let (b0, b1) = self.1.split(mid);
        let (c0, c1) = self.2.split(mid);
        ((a0, b0, c0), (a1, b1, c1))
    }
}

/// Cuts `parts` (of `n` elements) into chunks of at most [`PAR_MIN_LEN`] elements.
pub(crate) fn chunks<P: Split>(mut parts: P, mut n: usize) -> Vec<(P, usize)> {
    let mut out = Vec::with_capacity(n / PAR_MIN_LEN + 1);
    while n > PAR_MIN_LEN {
        let (head, tail) = parts.split(PAR_MIN_LEN);
        out.push((head, PAR_MIN_LEN));
        parts = tail;
        n -= PAR_MIN_LEN;
    }
    out.push((parts, n));
    out
}

/// Runs `body` over `parts` on this thread when short, else chunked on the rayon pool.
pub(crate) fn for_each_chunk<P: Split>(parts: P, n: usize, body: impl Fn(P) + Sync) {
    if n <= PAR_MIN_LEN {
        body(parts);
    } else {
        chunks(parts, n).into_par_iter().for_each(|(p, _)| body(p));
    }
}

/// Applies `kn` to every element of `target` in one fused pass.
///
/// `states` must all have the target's length (the updater checks this before calling).
pub(crate) fn run<W, Kn, const K: usize>(kn: &Kn, target: Target<'_, W>, grad: Grad<'_, W>, states: [&mut [W::A]; K])
where
    W: Lane,
    Kn: ElemKernel<W::A, K>,
{
    let n = target.len();
    match (target, grad) {
        (Target::InPlace(w), Grad::Dense(g)) => for_each_chunk((w, g, states), n, |(w, g, s)| inplace(kn, w, Some(g), s)),
        (Target::InPlace(w), Grad::Zero) => for_each_chunk((w, states), n, |(w, s)| inplace(kn, w, None, s)),
        (Target::Master { master, out }, Grad::Dense(g)) => {
            for_each_chunk(((master, out), g, states), n, |((m, o), g, s)| mastered(kn, m, o, Some(g), s))
        }
        (Target::Master { master, out }, Grad::Zero) => {
            for_each_chunk(((master, out), states), n, |((m, o), s)| mastered(kn, m, o, None, s))
        }
    }
}

/// Elements converted per block when the storage type is narrower than the compute type.
const BLOCK: usize = 256;

#[inline(always)]
fn inplace<W, Kn, const K: usize>(kn: &Kn, w: &mut [W], g: Option<&[W]>, states: [&mut [W::A]; K])
where
    W: Lane,
    Kn: ElemKernel<W::A, K>,
{
    let n = w.len();
    let st = states.map(|s| &mut s[..n]);
    if W::WIDENS {
        let mut wb = [W::A::ZERO; BLOCK];
        let mut gb = [W::A::ZERO; BLOCK];
        let mut start = 0;
        while start < n {
            let len = BLOCK.min(n - start);
            let (wb, gb) = (&mut wb[..len], &mut gb[..len]);
            W::widen(&w[start..start + len], wb);
            match g {
                Some(g) => W::widen(&g[start..start + len], gb),
                None => gb.fill(W::A::ZERO),
            }
            for i in 0..len {
                let j = start + i;
                let mut s: [W::A; K] = std::array::from_fn(|k| st[k][j]);
                wb[i] = kn.step(wb[i], gb[i], &mut s);
                for k in 0..K {
                    st[k][j] = s[k];
                }
            }
            W::narrow(wb, &mut w[start..start + len]);
            start += len;
        }
        return;
    }
    match g {
        Some(g) => {
            let g = &g[..n];
            for i in 0..n {
                let mut s: [W::A; K] = std::array::from_fn(|k| st[k][i]);
                let nw = kn.step(w[i].load(), g[i].load(), &mut s);
                for k in 0..K {
                    st[k][i] = s[k];
                }
                w[i] = W::store(nw);
            }
        }
        None => {
            for i in 0..n {
                let mut s: [W::A; K] = std::array::from_fn(|k| st[k][i]);
                let nw = kn.step(w[i].load(), W::A::ZERO, &mut s);
                for k in 0..K {
                    st[k][i] = s[k];
                }
                w[i] = W::store(nw);
            }
        }
    }
}

#[inline(always)]
fn mastered<W, Kn, const K: usize>(kn: &Kn, master: &mut [W::A], out: &mut [W], g: Option<&[W]>, states: [&mut [W::A]; K])
where
    W: Lane,
    Kn: ElemKernel<W::A, K>,
{
    let n = out.len();
    let master = &mut master[..n];
    let st = states.map(|s| &mut s[..n]);
    let mut gb = [W::A::ZERO; BLOCK];
    let mut start = 0;
    while start < n {
        let len = BLOCK.min(n - start);
        let gb = &mut gb[..len];
        match g {
            Some(g) => W::widen(&g[start..start + len], gb),
            None => gb.fill(W::A::ZERO),
        }
        let mb = &mut master[start..start + len];
        for i in 0..len {
            let j = start + i;
            let mut s: [W::A; K] = std::array::from_fn(|k| st[k][j]);
            mb[i] = kn.step(mb[i], gb[i], &mut s);
            for k in 0..K {
                st[k][j] = s[k];
            }
        }
        W::narrow(mb, &mut out[start..start + len]);
        start += len;
    }
}

/// Per-update scalars the updater resolves for one key before calling a kernel: the
/// scheduled, `lr_mult`-scaled learning rate, the `wd_mult`-scaled weight decay and the
/// key's update count `t` (already incremented for this update).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Hyper {
    pub lr: f64,
    pub wd: f64,
    pub t: u64,
    pub rescale: f64,
    pub clip: Option<f64>,
}

impl Hyper {
    /// The clip bound as a kernel value; no clipping is an infinite bound, for which
    /// [`clip`] returns its input unchanged.
    pub(crate) fn clip_bound<A: Real>(&self) -> A {
        A::from_f64(self.clip.unwrap_or(f64::INFINITY))
    }
}
