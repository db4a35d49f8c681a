//! Row-sparse gradients on dense weights: the lazy and the standard walk.
//!
//! A row_sparse gradient is a sorted list of distinct row ids plus one row of data per id.
//! The weight (and every state slot) is dense, `rows × row_len`.
//!
//! * **Lazy** ([`lazy_rows`]): only the rows present in the gradient are touched; weight
//!   decay, momentum decay and state updates of the other rows are skipped (MXNet's
//!   `lazy_update=True` kernels).
//! * **Standard** ([`standard_rows`]): every row is updated; absent rows are updated as if
//!   their gradient were zero (MXNet's `lazy_update=False` kernels), without building the
//!   dense gradient: runs of absent rows go through the kernel with [`Grad::Zero`].
//!
//! Optimizers without a sparse kernel never get here: the updater densifies the gradient
//! and runs their dense update (see [`GradLayout`]).

use rayon::prelude::*;

use super::kernel::{self, ElemKernel, Grad, Lane, Split, Target, PAR_MIN_LEN};

/// How the gradient is laid out for one update.
pub(crate) enum GradLayout<'a, W> {
    /// A dense gradient with the weight's length.
    Dense(&'a [W]),
    /// A row_sparse gradient; `rows` are validated (sorted, distinct, in range).
    Rows { row_len: usize, rows: &'a [usize], data: &'a [W], lazy: bool },
}

/// Runs the kernel that matches the layout: `dense` on a dense gradient, `lazy` on the
/// present rows of a lazy sparse update, `standard` over all rows otherwise.
pub(crate) fn by_layout<W, D, L, S, const K: usize>(
    target: Target<'_, W>,
    grad: &GradLayout<'_, W>,
    states: [&mut [W::A]; K],
    dense: &D,
    lazy: &L,
    standard: &S,
) where
    W: Lane,
    D: ElemKernel<W::A, K>,
    L: ElemKernel<W::A, K>,
    S: ElemKernel<W::A, K>,
{
    match *grad {
        GradLayout::Dense(g) => kernel::run(dense, target, Grad::Dense(g), states),
        GradLayout::Rows { row_len, rows, data, lazy: true } => lazy_rows(lazy, target, row_len, rows, data, states),
        GradLayout::Rows { row_len, rows, data, lazy: false } => standard_rows(standard, target, row_len, rows, data, states),
    }
}

/// Updates only the rows listed in `rows` (lazy update).
pub(crate) fn lazy_rows<W, Kn, const K: usize>(
    kn: &Kn,
    target: Target<'_, W>,
    row_len: usize,
    rows: &[usize],
    data: &[W],
    states: [&mut [W::A]; K],
) where
    W: Lane,
    Kn: ElemKernel<W::A, K>,
{
    if row_len == 0 || rows.is_empty() {
        return;
    }
    match target {
        Target::InPlace(w) => each_row(row_parts((w, states), row_len, rows), data, row_len, |(w, s), g| {
            kernel::run(kn, Target::InPlace(w), Grad::Dense(g), s)
        }),
        Target::Master { master, out } => {
            each_row(row_parts(((master, out), states), row_len, rows), data, row_len, |((master, out), s), g| {
                kernel::run(kn, Target::Master { master, out }, Grad::Dense(g), s)
            })
        }
    }
}

/// Calls `body` with each row's parts and gradient row, on the rayon pool when the rows
/// hold more than [`PAR_MIN_LEN`] elements in total.
fn each_row<P: Send, W: Sync>(parts: Vec<P>, data: &[W], row_len: usize, body: impl Fn(P, &[W]) + Sync + Send) {
    if parts.len() * row_len > PAR_MIN_LEN {
        parts.into_par_iter().zip(data.par_chunks(row_len)).for_each(|(p, g)| body(p, g));
    } else {
        parts.into_iter().zip(data.chunks(row_len)).for_each(|(p, g)| body(p, g));
    }
}

/// Cuts the row of every id out of `parts` (ids sorted and distinct).
fn row_parts<P: Split>(parts: P, row_len: usize, rows: &[usize]) -> Vec<P> {
    let mut out = Vec::with_capacity(rows.len());
    let mut rest = parts;
    let mut pos = 0;
    for &r in rows {
        let start = r * row_len;
        let (_, tail) = rest.split(start - pos);
        let (row, tail) = tail.split(row_len);
        out.push(row);
        rest = tail;
        pos = start + row_len;
    }
    out
}

/// Updates every row; rows absent from the gradient see a zero gradient (standard update).
pub(crate) fn standard_rows<W, Kn, const K: usize>(
    kn: &Kn,
    mut target: Target<'_, W>,
    row_len: usize,
    rows: &[usize],
    data: &[W],
    mut states: [&mut [W::A]; K],
) where
    W: Lane,
    Kn: ElemKernel<W::A, K>,
{
    let n = target.len();
    let mut segment = |start: usize, len: usize, g: Grad<'_, W>| {
        let t = target.slice(start, len);
        let s = states.each_mut().map(|s| &mut s[start..start + len]);
        kernel::run(kn, t, g, s);
    };
    let mut pos = 0;
    for (i, &r) in rows.iter().enumerate() {
        let start = r * row_len;
        if start > pos {
            segment(pos, start - pos, Grad::Zero);
        }
        segment(start, row_len, Grad::Dense(&data[i * row_len..(i + 1) * row_len]));
        pos = start + row_len;
    }
    if pos < n {
        segment(pos, n - pos, Grad::Zero);
    }
}

/// Scatters a row_sparse gradient into a dense one (for optimizers without a sparse kernel).
pub(crate) fn densify<W: Lane>(n: usize, row_len: usize, rows: &[usize], data: &[W]) -> Vec<W> {
    let zero = W::store(<W::A as kernel::Real>::ZERO);
    let mut dense = vec![zero; n];
    for (i, &r) in rows.iter().enumerate() {
        dense[r * row_len..(r + 1) * row_len].copy_from_slice(&data[i * row_len..(i + 1) * row_len]);
    }
    dense
}
