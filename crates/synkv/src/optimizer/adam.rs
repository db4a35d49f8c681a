//! Adam, AdamW and LAMB: fused kernels and dispatch.
//!
//! * Adam — `adam_update` (`AdamUpdateKernel`) with the bias correction folded into the
//!   learning rate in f64 as MXNet's Python does, `lr_t = lr·(√(1−β2ᵗ)/(1−β1ᵗ))`, `t` the
//!   key's update count: `ĝ = clip(g·r + w·wd, c)`, `m ← β1·m + (1−β1)·ĝ`,
//!   `v ← β2·v + (1−β2)·ĝ·ĝ`, `w ← w − lr_t·m/(√v + ε)`. Note that MXNet 1.9.1 clips
//!   *after* adding `wd·w` (K6.12 describes the 2.0 order). The row_sparse kernels
//!   (`AdamDnsRspDnsKernel`, `AdamStdDnsRspDnsKernel`) differ only in how `(1−β2)·ĝ²` is
//!   associated; absent rows in standard mode use `ĝ = clip(w·wd)`.
//! * AdamW — `contrib.adamw_update` driven as MXNet 2.0's `AdamW` drives it (`lr = 1`,
//!   `eta = lr_t`): `ĝ = clip(r·g, c)`, moments as Adam, `w ← w − lr_t·(m/(√v+ε) + wd·w)`,
//!   with `lr_t = lr·√(1−β2ᵗ)/(1−β1ᵗ)` when `correct_bias`.
//! * LAMB — `multi_lamb_update` (the updater's path): phase 1 updates the moments and forms
//!   `d = m̂/(√v̂+ε) + wd·w`; phase 2 scales the learning rate by the trust ratio
//!   `‖w‖/‖d‖` (with `‖w‖` clamped to the bounds; 1 if either norm is 0) and sets
//!   `w ← w − lr·ratio·d`. The norms need a full pass first, so LAMB makes two passes: the
//!   first updates `m`, `v` and sums `w²` and `d²` (in f64), the second recomputes `d` from
//!   the stored moments (bit-identical) and writes the weight.

use rayon::prelude::*;

use super::kernel::{self, clip, ElemKernel, Grad, Hyper, Lane, Real, Target, PAR_MIN_LEN};
use super::params::{Adam, AdamW, Lamb};
use super::sgd::with_clip;
use super::sparse::{by_layout, GradLayout};
use super::state::{OptimizerState, SlotData};

type Slots<'a> = &'a mut [(&'static str, SlotData)];

/// Adam's moment and weight update; `SQ` selects `(1−β2)·(ĝ·ĝ)` over `((1−β2)·ĝ)·ĝ`.
struct AdamK<A, const CLIP: bool, const SQ: bool> {
    beta1: A,
    omb1: A,
    beta2: A,
    omb2: A,
    lr: A,
    epsilon: A,
    wd: A,
    rescale: A,
    clip: A,
}

impl<A: Real, const CLIP: bool, const SQ: bool> ElemKernel<A, 2> for AdamK<A, CLIP, SQ> {
    #[inline(always)]
    fn step(&self, w: A, g: A, s: &mut [A; 2]) -> A {
        let mut gr = g * self.rescale + w * self.wd;
        if CLIP {
            gr = clip(gr, self.clip);
        }
        let m = self.beta1 * s[0] + self.omb1 * gr;
        let v = if SQ { self.beta2 * s[1] + self.omb2 * (gr * gr) } else { self.beta2 * s[1] + self.omb2 * gr * gr };
        s[0] = m;
        s[1] = v;
        w - self.lr * m / (v.sqrt() + self.epsilon)
    }
}

impl<A: Real, const CLIP: bool, const SQ: bool> AdamK<A, CLIP, SQ> {
    fn new(p: &Adam, h: &Hyper) -> Self {
        let t = h.t as f64;
        let coef1 = 1.0 - p.beta1.powf(t);
        let coef2 = 1.0 - p.beta2.powf(t);
        let lr = h.lr * (coef2.sqrt() / coef1);
        let (beta1, beta2) = (A::from_f64(p.beta1), A::from_f64(p.beta2));
        AdamK {
            beta1,
            omb1: A::ONE - beta1,
            beta2,
            omb2: A::ONE - beta2,
            lr: A::from_f64(lr),
            epsilon: A::from_f64(p.epsilon),
            wd: A::from_f64(h.wd),
            rescale: A::from_f64(h.rescale),
            clip: h.clip_bound(),
        }
    }
}

impl Adam {
    pub(crate) fn apply<W: Lane>(&self, h: &Hyper, target: Target<'_, W>, grad: &GradLayout<'_, W>, slots: Slots<'_>) {
        let st = OptimizerState::slots_mut::<W::A, 2>(slots);
        with_clip!(h, C => {
            let dense = AdamK::<W::A, C, false>::new(self, h);
            let lazy = AdamK::<W::A, C, C>::new(self, h);
            let standard = AdamK::<W::A, C, true>::new(self, h);
            by_layout(target, grad, st, &dense, &lazy, &standard)
        })
    }
}

/// `AdamWUpdate` with `lr = 1`, `eta = lr_t`.
struct AdamWK<A> {
    beta1: A,
    omb1: A,
    beta2: A,
    omb2: A,
    eta: A,
    epsilon: A,
    wd: A,
    rescale: A,
    clip: A,
}

impl<A: Real> ElemKernel<A, 2> for AdamWK<A> {
    #[inline(always)]
    fn step(&self, w: A, g: A, s: &mut [A; 2]) -> A {
        let gs = clip(self.rescale * g, self.clip);
        let m = self.beta1 * s[0] + self.omb1 * gs;
        let v = self.beta2 * s[1] + self.omb2 * (gs * gs);
        s[0] = m;
        s[1] = v;
        w - self.eta * (m / (v.sqrt() + self.epsilon) + self.wd * w)
    }
}

impl AdamW {
    pub(crate) fn apply<W: Lane>(&self, h: &Hyper, target: Target<'_, W>, grad: &GradLayout<'_, W>, slots: Slots<'_>) {
        let eta = if self.correct_bias {
            let t = h.t as f64;
            let coef1 = 1.0 - self.beta1.powf(t);
            let coef2 = 1.0 - self.beta2.powf(t);
            h.lr * coef2.sqrt() / coef1
        } else {
            h.lr
        };
        let (beta1, beta2) = (W::A::from_f64(self.beta1), W::A::from_f64(self.beta2));
        let k = AdamWK {
            beta1,
            omb1: W::A::ONE - beta1,
            beta2,
            omb2: W::A::ONE - beta2,
            eta: W::A::from_f64(eta),
            epsilon: W::A::from_f64(self.epsilon),
            wd: W::A::from_f64(h.wd),
            rescale: W::A::from_f64(h.rescale),
            clip: h.clip_bound(),
        };
        let st = OptimizerState::slots_mut::<W::A, 2>(slots);
        by_layout(target, grad, st, &k, &k, &k)
    }
}

/// LAMB's per-element arithmetic (both phases).
struct LambK<A> {
    beta1: A,
    omb1: A,
    beta2: A,
    omb2: A,
    c1: A,
    c2: A,
    bias_correction: bool,
    epsilon: A,
    wd: A,
    rescale: A,
    clip: A,
    /// `lr · trust ratio`, set for phase 2.
    lr_adjusted: A,
}

impl<A: Real> LambK<A> {
    #[inline(always)]
    fn moments(&self, g: A, m: A, v: A) -> (A, A) {
        let sg = clip(g * self.rescale, self.clip);
        (self.beta1 * m + self.omb1 * sg, self.beta2 * v + self.omb2 * sg * sg)
    }

    #[inline(always)]
    fn direction(&self, w: A, m: A, v: A) -> A {
        if self.bias_correction {
            let m_hat = m / self.c1;
            let v_hat = v / self.c2;
            m_hat / (v_hat.sqrt() + self.epsilon) + self.wd * w
        } else {
            m / (v.sqrt() + self.epsilon) + self.wd * w
        }
    }

    /// Phase 1 over one chunk: updates the moments, returns `(Σw², Σd²)`.
    fn phase1<L: Lane<A = A>, G: Lane<A = A>>(&self, w: &[L], g: &[G], m: &mut [A], v: &mut [A]) -> (f64, f64) {
        let n = w.len();
        let (g, m, v) = (&g[..n], &mut m[..n], &mut v[..n]);
        let (mut sw, mut sd) = (0.0f64, 0.0f64);
        for i in 0..n {
            let wi = w[i].load();
            let (mi, vi) = self.moments(g[i].load(), m[i], v[i]);
            m[i] = mi;
            v[i] = vi;
            let d = self.direction(wi, mi, vi).to_f64();
            let wf = wi.to_f64();
            sw += wf * wf;
            sd += d * d;
        }
        (sw, sd)
    }
}

/// Phase 2: `w ← w − lr_adjusted · d` with the moments left as they are.
impl<A: Real> ElemKernel<A, 2> for LambK<A> {
    #[inline(always)]
    fn step(&self, w: A, _g: A, s: &mut [A; 2]) -> A {
        w - self.lr_adjusted * self.direction(w, s[0], s[1])
    }
}

fn lamb_sums<L, G, A>(k: &LambK<A>, w: &[L], g: &[G], m: &mut [A], v: &mut [A]) -> (f64, f64)
where
    A: Real,
    L: Lane<A = A>,
    G: Lane<A = A>,
{
    let n = w.len();
    if n <= PAR_MIN_LEN {
        return k.phase1(w, g, m, v);
    }
    kernel::chunks((w, g, (m, v)), n)
        .into_par_iter()
        .map(|((w, g, (m, v)), _)| k.phase1(w, g, m, v))
        .reduce(|| (0.0, 0.0), |a, b| (a.0 + b.0, a.1 + b.1))
}

impl Lamb {
    pub(crate) fn apply<W: Lane>(&self, h: &Hyper, mut target: Target<'_, W>, grad: &GradLayout<'_, W>, slots: Slots<'_>) {
        let GradLayout::Dense(g) = *grad else { unreachable!("the updater densifies row_sparse gradients for LAMB") };
        let t = W::A::from_f64(h.t as f64);
        let (beta1, beta2) = (W::A::from_f64(self.beta1), W::A::from_f64(self.beta2));
        let mut k = LambK {
            beta1,
            omb1: W::A::ONE - beta1,
            beta2,
            omb2: W::A::ONE - beta2,
            c1: W::A::ONE - beta1.powf(t),
            c2: W::A::ONE - beta2.powf(t),
            bias_correction: self.bias_correction,
            epsilon: W::A::from_f64(self.epsilon),
            wd: W::A::from_f64(h.wd),
            rescale: W::A::from_f64(h.rescale),
            clip: h.clip_bound(),
            lr_adjusted: W::A::ZERO,
        };
        let [m, v] = OptimizerState::slots_mut::<W::A, 2>(slots);
        let (sw, sd) = match &mut target {
            Target::InPlace(w) => lamb_sums(&k, &w[..], g, m, v),
            Target::Master { master, .. } => lamb_sums(&k, &master[..], g, m, v),
        };
        let mut r1 = W::A::from_f64(sw.sqrt());
        let r2 = W::A::from_f64(sd.sqrt());
        if let Some(lb) = self.lower_bound {
            let lb = W::A::from_f64(lb);
            r1 = if r1 < lb { lb } else { r1 };
        }
        if let Some(ub) = self.upper_bound {
            let ub = W::A::from_f64(ub);
            r1 = if r1 > ub { ub } else { r1 };
        }
        let ratio = if r1 == W::A::ZERO || r2 == W::A::ZERO { W::A::ONE } else { r1 / r2 };
        k.lr_adjusted = W::A::from_f64(h.lr) * ratio;
        kernel::run(&k, target, Grad::Zero, [m, v]);
    }
}
