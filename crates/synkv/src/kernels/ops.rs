//! The kernels behind the public functions: each takes an explicit [`Plan`], finds the fast
//! path for its element type through [`Element`]'s views, and splits the work with
//! [`for_chunks`]. Tests call these directly to force every ISA level and both store kinds.
//!
//! Callers (the public wrappers) have already checked that the slice lengths agree.

use std::mem::size_of_val;

use super::element::{View, ViewList, ViewMut};
use super::parallel::for_chunks;
use super::simd::{self, Pod};
use super::tuning::Plan;
use super::{reduced, scalar, Element};

const MISMATCH: &str = "Element views disagree: implement only to_f64/from_f64";

/// `dst = Σ srcs` (assign).
pub(crate) fn sum_into<T: Element>(plan: &Plan, dst: &mut [T], srcs: &[&[T]]) {
    if srcs.is_empty() {
        return fill(plan, dst, T::from_f64(0.0));
    }
    let (isa, stream) = (plan.isa, plan.stream(size_of_val(dst)));
    match (T::view_mut(dst), T::view_list(srcs)) {
        (ViewMut::F32(d), ViewList::F32(s)) => for_chunks(plan, d, |c, off| simd::sum_f32(isa, c, s, off, stream)),
        (ViewMut::F64(d), ViewList::F64(s)) => for_chunks(plan, d, |c, off| simd::sum_f64(isa, c, s, off, stream)),
        (ViewMut::F16(d), ViewList::F16(s)) => for_chunks(plan, d, |c, off| reduced::sum(isa, c, s, off, stream)),
        (ViewMut::Bf16(d), ViewList::Bf16(s)) => for_chunks(plan, d, |c, off| reduced::sum(isa, c, s, off, stream)),
        (ViewMut::I32(d), ViewList::I32(s)) => for_chunks(plan, d, |c, off| simd::sum_i32(isa, c, s, off)),
        (ViewMut::I64(d), ViewList::I64(s)) => for_chunks(plan, d, |c, off| simd::sum_i64(isa, c, s, off)),
        (ViewMut::Other(d), ViewList::Other(s)) => for_chunks(plan, d, |c, off| scalar::sum_generic(c, s, off)),
        _ => unreachable!("{MISMATCH}"),
    }
}

/// Runs an element-wise `dst ∘= src` kernel over matching pieces of `dst` and `src`.
#[inline]
fn zip<T: Send + Sync>(plan: &Plan, dst: &mut [T], src: &[T], f: impl Fn(&mut [T], &[T]) + Sync) {
    for_chunks(plan, dst, |c, off| f(c, &src[off..off + c.len()]));
}

/// `dst += src`.
pub(crate) fn add_into<T: Element>(plan: &Plan, dst: &mut [T], src: &[T]) {
    let isa = plan.isa;
    match (T::view_mut(dst), T::view(src)) {
        (ViewMut::F32(d), View::F32(s)) => zip(plan, d, s, |d, s| simd::add_f32(isa, d, s)),
        (ViewMut::F64(d), View::F64(s)) => zip(plan, d, s, |d, s| simd::add_f64(isa, d, s)),
        (ViewMut::F16(d), View::F16(s)) => zip(plan, d, s, |d, s| reduced::add(isa, d, s)),
        (ViewMut::Bf16(d), View::Bf16(s)) => zip(plan, d, s, |d, s| reduced::add(isa, d, s)),
        (ViewMut::I32(d), View::I32(s)) => zip(plan, d, s, |d, s| simd::add_i32(isa, d, s)),
        (ViewMut::I64(d), View::I64(s)) => zip(plan, d, s, |d, s| simd::add_i64(isa, d, s)),
        (ViewMut::Other(d), View::Other(s)) => zip(plan, d, s, scalar::add_generic),
        _ => unreachable!("{MISMATCH}"),
    }
}

/// `dst += a * x`.
pub(crate) fn axpy<T: Element>(plan: &Plan, dst: &mut [T], a: f64, x: &[T]) {
    let isa = plan.isa;
    let a32 = a as f32;
    match (T::view_mut(dst), T::view(x)) {
        (ViewMut::F32(d), View::F32(x)) => zip(plan, d, x, |d, x| simd::axpy_f32(isa, d, a32, x)),
        (ViewMut::F64(d), View::F64(x)) => zip(plan, d, x, |d, x| simd::axpy_f64(isa, d, a, x)),
        (ViewMut::F16(d), View::F16(x)) => zip(plan, d, x, |d, x| reduced::axpy(isa, d, a32, x)),
        (ViewMut::Bf16(d), View::Bf16(x)) => zip(plan, d, x, |d, x| reduced::axpy(isa, d, a32, x)),
        (ViewMut::I32(d), View::I32(x)) => zip(plan, d, x, |d, x| simd::axpy_i32(isa, d, a, x)),
        (ViewMut::I64(d), View::I64(x)) => zip(plan, d, x, |d, x| simd::axpy_i64(isa, d, a, x)),
        (ViewMut::Other(d), View::Other(x)) => zip(plan, d, x, |d, x| scalar::axpy_generic(d, a, x)),
        _ => unreachable!("{MISMATCH}"),
    }
}

/// `dst *= a`.
pub(crate) fn scale<T: Element>(plan: &Plan, dst: &mut [T], a: f64) {
    let isa = plan.isa;
    let a32 = a as f32;
    match T::view_mut(dst) {
        ViewMut::F32(d) => for_chunks(plan, d, |d, _| simd::scale_f32(isa, d, a32)),
        ViewMut::F64(d) => for_chunks(plan, d, |d, _| simd::scale_f64(isa, d, a)),
        ViewMut::F16(d) => for_chunks(plan, d, |d, _| reduced::scale(isa, d, a32)),
        ViewMut::Bf16(d) => for_chunks(plan, d, |d, _| reduced::scale(isa, d, a32)),
        ViewMut::I32(d) => for_chunks(plan, d, |d, _| simd::scale_i32(isa, d, a)),
        ViewMut::I64(d) => for_chunks(plan, d, |d, _| simd::scale_i64(isa, d, a)),
        ViewMut::Other(d) => for_chunks(plan, d, |d, _| scalar::scale_generic(d, a)),
    }
}

/// Copies a plain-data slice, streaming if the destination is large.
pub(crate) fn copy_pod<P: Pod>(plan: &Plan, dst: &mut [P], src: &[P]) {
    let (isa, stream) = (plan.isa, plan.stream(size_of_val(dst)));
    zip(plan, dst, src, |d, s| {
        if stream {
            simd::copy_stream_unfenced(isa, d, s);
            simd::fence();
        } else {
            d.copy_from_slice(s);
        }
    });
}

/// `dst = src`.
pub(crate) fn copy<T: Element>(plan: &Plan, dst: &mut [T], src: &[T]) {
    match (T::view_mut(dst), T::view(src)) {
        (ViewMut::F32(d), View::F32(s)) => copy_pod(plan, d, s),
        (ViewMut::F64(d), View::F64(s)) => copy_pod(plan, d, s),
        (ViewMut::F16(d), View::F16(s)) => copy_pod(plan, d, s),
        (ViewMut::Bf16(d), View::Bf16(s)) => copy_pod(plan, d, s),
        (ViewMut::I32(d), View::I32(s)) => copy_pod(plan, d, s),
        (ViewMut::I64(d), View::I64(s)) => copy_pod(plan, d, s),
        (ViewMut::Other(d), View::Other(s)) => zip(plan, d, s, <[T]>::copy_from_slice),
        _ => unreachable!("{MISMATCH}"),
    }
}

/// Fills a plain-data slice, streaming if it is large.
fn fill_pod<P: Pod>(plan: &Plan, dst: &mut [P], v: P) {
    let (isa, stream) = (plan.isa, plan.stream(size_of_val(dst)));
    for_chunks(plan, dst, |d, _| {
        if stream {
            simd::fill_stream_unfenced(isa, d, v);
            simd::fence();
        } else {
            d.fill(v);
        }
    });
}

/// `dst[i] = v`.
pub(crate) fn fill<T: Element>(plan: &Plan, dst: &mut [T], v: T) {
    let v = std::slice::from_ref(&v);
    match (T::view_mut(dst), T::view(v)) {
        (ViewMut::F32(d), View::F32(v)) => fill_pod(plan, d, v[0]),
        (ViewMut::F64(d), View::F64(v)) => fill_pod(plan, d, v[0]),
        (ViewMut::F16(d), View::F16(v)) => fill_pod(plan, d, v[0]),
        (ViewMut::Bf16(d), View::Bf16(v)) => fill_pod(plan, d, v[0]),
        (ViewMut::I32(d), View::I32(v)) => fill_pod(plan, d, v[0]),
        (ViewMut::I64(d), View::I64(v)) => fill_pod(plan, d, v[0]),
        (ViewMut::Other(d), View::Other(v)) => for_chunks(plan, d, |d, _| d.fill(v[0])),
        _ => unreachable!("{MISMATCH}"),
    }
}
