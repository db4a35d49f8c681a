//! RMSProp (plain and centered) and AdaDelta: fused kernels and dispatch.
//!
//! * RMSProp — `rmsprop_update` (`RMSPropUpdateKernel`), state `n`:
//!   `ĝ = clip(r·g + wd·w, c)`, `n ← (1−γ1)·ĝ² + γ1·n`, `w ← w − lr·(ĝ/√(n + ε))`,
//!   then `w` clipped to `±clip_weights` if set.
//! * Centered RMSProp — `rmspropalex_update` (Graves 2013), states `n`, `g`, `delta`:
//!   `n ← (1−γ1)·ĝ·ĝ + γ1·n`, `g ← (1−γ1)·ĝ + γ1·g`,
//!   `delta ← γ2·delta − lr·ĝ/√(n − g² + ε)`, `w ← w + delta` (clipped likewise).
//! * AdaDelta — MXNet 1.9.1 runs it as f32 NDArray operations (reproduced in order; the
//!   learning rate is not used), states `acc_g`, `acc_delta`:
//!   `ĝ = clip(g·r, c)`, `acc_g ← acc_g·ρ + (1−ρ)·ĝ·ĝ`,
//!   `δ = √(acc_delta + ε)/√(acc_g + ε)·ĝ`, `acc_delta ← acc_delta·ρ + (1−ρ)·δ·δ`,
//!   `w ← w − (δ + w·wd)`.
//!
//! None of them has a row_sparse kernel in MXNet; the updater densifies such gradients.

use super::kernel::{clip, ElemKernel, Hyper, Lane, Real, Target};
use super::params::{AdaDelta, RmsProp};
use super::sparse::{by_layout, GradLayout};
use super::state::{OptimizerState, SlotData};

type Slots<'a> = &'a mut [(&'static str, SlotData)];

struct RmsPropK<A> {
    gamma1: A,
    omg1: A,
    gamma2: A,
    lr: A,
    wd: A,
    epsilon: A,
    rescale: A,
    clip: A,
    clip_weights: A,
}

impl<A: Real> RmsPropK<A> {
    #[inline(always)]
    fn grad(&self, w: A, g: A) -> A {
        clip(self.rescale * g + self.wd * w, self.clip)
    }
}

impl<A: Real> ElemKernel<A, 1> for RmsPropK<A> {
    #[inline(always)]
    fn step(&self, w: A, g: A, s: &mut [A; 1]) -> A {
        let gr = self.grad(w, g);
        let n = self.omg1 * (gr * gr) + self.gamma1 * s[0];
        s[0] = n;
        clip(w - self.lr * (gr / (n + self.epsilon).sqrt()), self.clip_weights)
    }
}

impl<A: Real> ElemKernel<A, 3> for RmsPropK<A> {
    #[inline(always)]
    fn step(&self, w: A, g: A, s: &mut [A; 3]) -> A {
        let gr = self.grad(w, g);
        let n = self.omg1 * gr * gr + self.gamma1 * s[0];
        let gs = self.omg1 * gr + self.gamma1 * s[1];
        let delta = self.gamma2 * s[2] - self.lr * gr / (n - gs * gs + self.epsilon).sqrt();
        s[0] = n;
        s[1] = gs;
        s[2] = delta;
        clip(w + delta, self.clip_weights)
    }
}

impl RmsProp {
    pub(crate) fn apply<W: Lane>(&self, h: &Hyper, target: Target<'_, W>, grad: &GradLayout<'_, W>, slots: Slots<'_>) {
        let gamma1 = W::A::from_f64(self.gamma1);
        let k = RmsPropK {
            gamma1,
            omg1: W::A::ONE - gamma1,
            gamma2: W::A::from_f64(self.gamma2),
            lr: W::A::from_f64(h.lr),
            wd: W::A::from_f64(h.wd),
            epsilon: W::A::from_f64(self.epsilon),
            rescale: W::A::from_f64(h.rescale),
            clip: h.clip_bound(),
            clip_weights: W::A::from_f64(self.clip_weights.unwrap_or(f64::INFINITY)),
        };
        if self.centered {
            let st = OptimizerState::slots_mut::<W::A, 3>(slots);
            by_layout(target, grad, st, &k, &k, &k)
        } else {
            let st = OptimizerState::slots_mut::<W::A, 1>(slots);
            by_layout(target, grad, st, &k, &k, &k)
        }
    }
}

struct AdaDeltaK<A> {
    rho: A,
    omr: A,
    epsilon: A,
    wd: A,
    rescale: A,
    clip: A,
}

impl<A: Real> ElemKernel<A, 2> for AdaDeltaK<A> {
    #[inline(always)]
    fn step(&self, w: A, g: A, s: &mut [A; 2]) -> A {
        let gs = clip(g * self.rescale, self.clip);
        let acc_g = s[0] * self.rho + self.omr * gs * gs;
        let delta = (s[1] + self.epsilon).sqrt() / (acc_g + self.epsilon).sqrt() * gs;
        let acc_delta = s[1] * self.rho + self.omr * delta * delta;
        s[0] = acc_g;
        s[1] = acc_delta;
        w - (delta + w * self.wd)
    }
}

impl AdaDelta {
    pub(crate) fn apply<W: Lane>(&self, h: &Hyper, target: Target<'_, W>, grad: &GradLayout<'_, W>, slots: Slots<'_>) {
        let k = AdaDeltaK {
            rho: W::A::from_f64(self.rho),
            // MXNet computes `1 - rho` in Python (f64) before the f32 array operation.
            omr: W::A::from_f64(1.0 - self.rho),
            epsilon: W::A::from_f64(self.epsilon),
            wd: W::A::from_f64(h.wd),
            rescale: W::A::from_f64(h.rescale),
            clip: h.clip_bound(),
        };
        let st = OptimizerState::slots_mut::<W::A, 2>(slots);
        by_layout(target, grad, st, &k, &k, &k)
    }
}
