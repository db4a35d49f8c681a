//! SGD, NAG, Signum/signSGD and the test optimizer: fused kernels and dispatch.
//!
//! Each kernel is MXNet 1.9.1's operator, with the same operation order so f32 results
//! match bit for bit where MXNet's build does not contract to FMA (it does not):
//!
//! * dense SGD, with or without momentum — `multi_sgd(_mom)_update` (`MultiSGDKernel`), the
//!   path `mx.optimizer.SGD` takes through the updater:
//!   `m ← μ·m − (lr·wd)·w − lr·clip(r·g, c)` (without clipping `− (lr·r)·g`), `w ← w + m`;
//! * row_sparse SGD with momentum, lazy and standard — `SGDMomDnsRspDnsKernel` /
//!   `SGDMomStdDnsRspDnsKernel`, the same formula on present rows / all rows;
//! * row_sparse SGD without momentum — `SGDDnsRspKernel`:
//!   `w ← (1 − lr·wd)·w − lr·clip(r·g, c)`; standard mode first decays every row, which is
//!   the same formula with `g = 0` on absent rows;
//! * NAG — `nag_mom_update`: `m₁ = μ·m`, `w ← w − m₁ + (μ+1)·(m₁ − lr·(clip(r·g) + wd·w))`,
//!   `m ← m₁ − lr·(clip(r·g) + wd·w_new)` — the kernel runs in place, so MXNet's momentum
//!   line reads the weight it has just written; reproduced here. Without momentum
//!   `sgd_update` (`SGDKernel`);
//! * Signum — `signum_update`: `m ← μ·m − (1−μ)·wd·w − (1−μ)·clip(r·g)`,
//!   `w ← (1 − lr·wd_lh)·w + lr·sign(m)`; signSGD (μ = 0) — `signsgd_update`:
//!   `w ← (1 − lr·wd)·w − lr·sign(g)` (MXNet ignores rescale and clipping there);
//! * test — `w ← w + g·r` (K6.13, 1.x semantics).

use super::kernel::{clip, sign, ElemKernel, Hyper, Lane, Real, Target};
use super::params::{Nag, Sgd, Signum, TestOptimizer};
use super::sparse::{by_layout, GradLayout};
use super::state::{OptimizerState, SlotData};

/// Runs `$body` with a `const $c: bool` telling whether gradient clipping is on.
macro_rules! with_clip {
    ($h:expr, $c:ident => $body:expr) => {
        if $h.clip.is_some() {
            const $c: bool = true;
            $body
        } else {
            const $c: bool = false;
            $body
        }
    };
}
pub(crate) use with_clip;

type Slots<'a> = &'a mut [(&'static str, SlotData)];

/// `MultiSGDKernel`: momentum SGD (K = 1) or, with `m = 0`, plain SGD (K = 0).
struct SgdMom<A, const CLIP: bool> {
    momentum: A,
    lr: A,
    lrwd: A,
    lr_rescale: A,
    rescale: A,
    clip: A,
}

impl<A: Real, const CLIP: bool> SgdMom<A, CLIP> {
    fn new(momentum: f64, h: &Hyper) -> Self {
        let (lr, wd, rescale) = (A::from_f64(h.lr), A::from_f64(h.wd), A::from_f64(h.rescale));
        SgdMom { momentum: A::from_f64(momentum), lr, lrwd: lr * wd, lr_rescale: lr * rescale, rescale, clip: h.clip_bound() }
    }

    #[inline(always)]
    fn mom(&self, m: A, w: A, g: A) -> A {
        let step = if CLIP { self.lr * clip(self.rescale * g, self.clip) } else { self.lr_rescale * g };
        self.momentum * m - self.lrwd * w - step
    }
}

impl<A: Real, const CLIP: bool> ElemKernel<A, 1> for SgdMom<A, CLIP> {
    #[inline(always)]
    fn step(&self, w: A, g: A, s: &mut [A; 1]) -> A {
        let m = self.mom(s[0], w, g);
        s[0] = m;
        w + m
    }
}

impl<A: Real, const CLIP: bool> ElemKernel<A, 0> for SgdMom<A, CLIP> {
    #[inline(always)]
    fn step(&self, w: A, g: A, _: &mut [A; 0]) -> A {
        w + self.mom(A::ZERO, w, g)
    }
}

/// `SGDKernel` / `SGDDnsRspKernel`: `w ← (1 − lr·wd)·w − lr·clip(r·g)`.
struct SgdDecay<A, const CLIP: bool> {
    decay: A,
    lr: A,
    lr_rescale: A,
    rescale: A,
    clip: A,
}

impl<A: Real, const CLIP: bool> SgdDecay<A, CLIP> {
    fn new(h: &Hyper) -> Self {
        let (lr, wd, rescale) = (A::from_f64(h.lr), A::from_f64(h.wd), A::from_f64(h.rescale));
        SgdDecay { decay: A::ONE - lr * wd, lr, lr_rescale: lr * rescale, rescale, clip: h.clip_bound() }
    }
}

impl<A: Real, const CLIP: bool> ElemKernel<A, 0> for SgdDecay<A, CLIP> {
    #[inline(always)]
    fn step(&self, w: A, g: A, _: &mut [A; 0]) -> A {
        if CLIP {
            self.decay * w - self.lr * clip(self.rescale * g, self.clip)
        } else {
            self.decay * w - self.lr_rescale * g
        }
    }
}

impl Sgd {
    pub(crate) fn apply<W: Lane>(&self, h: &Hyper, target: Target<'_, W>, grad: &GradLayout<'_, W>, slots: Slots<'_>) {
        if self.momentum != 0.0 {
            let st = OptimizerState::slots_mut::<W::A, 1>(slots);
            with_clip!(h, C => {
                let k = SgdMom::<W::A, C>::new(self.momentum, h);
                by_layout(target, grad, st, &k, &k, &k)
            })
        } else {
            let st = OptimizerState::slots_mut::<W::A, 0>(slots);
            with_clip!(h, C => {
                let dense = SgdMom::<W::A, C>::new(0.0, h);
                let rows = SgdDecay::<W::A, C>::new(h);
                by_layout(target, grad, st, &dense, &rows, &rows)
            })
        }
    }
}

/// `NAGMomKernel`.
struct NagMom<A> {
    momentum: A,
    momentum_p1: A,
    lr: A,
    wd: A,
    rescale: A,
    clip: A,
}

impl<A: Real> ElemKernel<A, 1> for NagMom<A> {
    #[inline(always)]
    fn step(&self, w: A, g: A, s: &mut [A; 1]) -> A {
        let cg = clip(self.rescale * g, self.clip);
        let m1 = self.momentum * s[0];
        let nw = w - m1 + self.momentum_p1 * (m1 - self.lr * (cg + self.wd * w));
        // MXNet runs the kernel in place (`out=weight`): the momentum line reads the
        // weight it has just written.
        s[0] = m1 - self.lr * (cg + self.wd * nw);
        nw
    }
}

impl Nag {
    pub(crate) fn apply<W: Lane>(&self, h: &Hyper, target: Target<'_, W>, grad: &GradLayout<'_, W>, slots: Slots<'_>) {
        if self.momentum != 0.0 {
            let momentum = W::A::from_f64(self.momentum);
            let k = NagMom {
                momentum,
                momentum_p1: momentum + W::A::ONE,
                lr: W::A::from_f64(h.lr),
                wd: W::A::from_f64(h.wd),
                rescale: W::A::from_f64(h.rescale),
                clip: h.clip_bound(),
            };
            let st = OptimizerState::slots_mut::<W::A, 1>(slots);
            by_layout(target, grad, st, &k, &k, &k)
        } else {
            let st = OptimizerState::slots_mut::<W::A, 0>(slots);
            with_clip!(h, C => {
                let k = SgdDecay::<W::A, C>::new(h);
                by_layout(target, grad, st, &k, &k, &k)
            })
        }
    }
}

/// `SignumKernel`.
struct SignumMom<A, const CLIP: bool> {
    momentum: A,
    omm: A,
    omm_wd: A,
    omm_rescale: A,
    rescale: A,
    clip: A,
    decay: A,
    lr: A,
}

impl<A: Real, const CLIP: bool> ElemKernel<A, 1> for SignumMom<A, CLIP> {
    #[inline(always)]
    fn step(&self, w: A, g: A, s: &mut [A; 1]) -> A {
        let step = if CLIP { self.omm * clip(self.rescale * g, self.clip) } else { self.omm_rescale * g };
        let m = self.momentum * s[0] - self.omm_wd * w - step;
        s[0] = m;
        self.decay * w + self.lr * sign(m)
    }
}

/// `SignSGDKernel`.
struct SignSgd<A> {
    decay: A,
    lr: A,
}

impl<A: Real> ElemKernel<A, 0> for SignSgd<A> {
    #[inline(always)]
    fn step(&self, w: A, g: A, _: &mut [A; 0]) -> A {
        self.decay * w - self.lr * sign(g)
    }
}

impl Signum {
    pub(crate) fn apply<W: Lane>(&self, h: &Hyper, target: Target<'_, W>, grad: &GradLayout<'_, W>, slots: Slots<'_>) {
        let lr = W::A::from_f64(h.lr);
        let wd = W::A::from_f64(h.wd);
        if self.momentum != 0.0 {
            let momentum = W::A::from_f64(self.momentum);
            let omm = W::A::ONE - momentum;
            let rescale = W::A::from_f64(h.rescale);
            let st = OptimizerState::slots_mut::<W::A, 1>(slots);
            with_clip!(h, C => {
                let k = SignumMom::<W::A, C> {
                    momentum,
                    omm,
                    omm_wd: omm * wd,
                    omm_rescale: omm * rescale,
                    rescale,
                    clip: h.clip_bound(),
                    decay: W::A::ONE - lr * W::A::from_f64(self.wd_lh),
                    lr,
                };
                by_layout(target, grad, st, &k, &k, &k)
            })
        } else {
            let k = SignSgd { decay: W::A::ONE - lr * wd, lr };
            let st = OptimizerState::slots_mut::<W::A, 0>(slots);
            by_layout(target, grad, st, &k, &k, &k)
        }
    }
}

/// The 1.x test optimizer: `w ← w + g·r`.
struct AddScaled<A> {
    rescale: A,
}

impl<A: Real> ElemKernel<A, 0> for AddScaled<A> {
    #[inline(always)]
    fn step(&self, w: A, g: A, _: &mut [A; 0]) -> A {
        w + g * self.rescale
    }
}

impl TestOptimizer {
    pub(crate) fn apply<W: Lane>(&self, h: &Hyper, target: Target<'_, W>, grad: &GradLayout<'_, W>, slots: Slots<'_>) {
        let k = AddScaled { rescale: W::A::from_f64(h.rescale) };
        let st = OptimizerState::slots_mut::<W::A, 0>(slots);
        by_layout(target, grad, st, &k, &k, &k)
    }
}
