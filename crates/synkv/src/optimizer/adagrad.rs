//! AdaGrad: fused kernel and dispatch.
//!
//! MXNet 1.9.1 runs dense AdaGrad as a chain of f32 NDArray operations and row_sparse
//! AdaGrad with `AdagradDnsRspDnsKernel`; both reduce to the same per-element formula,
//! fused here into one pass (`h` is the `history` slot, initially 0):
//!
//! `ĝ = clip(g·r, c)`, `h ← h + ĝ²`, `d = ĝ/√(h + ε)`, `w ← w + (d + w·wd)·(−lr)`.
//!
//! Row_sparse: MXNet's kernel is always lazy and refuses `wd ≠ 0`; synkv's lazy mode
//! applies the dense formula to the present rows (identical when `wd = 0`, and a natural
//! extension otherwise). `lazy_update = false` runs the dense update on the densified
//! gradient (absent rows see `ĝ = 0`, so only weight decay moves them).

use super::kernel::{clip, ElemKernel, Hyper, Lane, Real, Target};
use super::params::AdaGrad;
use super::sparse::{by_layout, GradLayout};
use super::state::{OptimizerState, SlotData};

struct AdaGradK<A> {
    neg_lr: A,
    wd: A,
    epsilon: A,
    rescale: A,
    clip: A,
}

impl<A: Real> ElemKernel<A, 1> for AdaGradK<A> {
    #[inline(always)]
    fn step(&self, w: A, g: A, s: &mut [A; 1]) -> A {
        let gs = clip(g * self.rescale, self.clip);
        let h = s[0] + gs * gs;
        s[0] = h;
        let div = gs / (h + self.epsilon).sqrt();
        w + (div + w * self.wd) * self.neg_lr
    }
}

impl AdaGrad {
    pub(crate) fn apply<W: Lane>(
        &self,
        h: &Hyper,
        target: Target<'_, W>,
        grad: &GradLayout<'_, W>,
        slots: &mut [(&'static str, SlotData)],
    ) {
        let k = AdaGradK {
            neg_lr: W::A::from_f64(-h.lr),
            wd: W::A::from_f64(h.wd),
            epsilon: W::A::from_f64(self.epsilon),
            rescale: W::A::from_f64(h.rescale),
            clip: h.clip_bound(),
        };
        let st = OptimizerState::slots_mut::<W::A, 1>(slots);
        by_layout(target, grad, st, &k, &k, &k)
    }
}
