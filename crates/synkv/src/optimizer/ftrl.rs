//! FTRL-proximal: fused kernel and dispatch.
//!
//! MXNet 1.9.1 `ftrl_update` (`FtrlUpdateKernel`; the row_sparse `FtrlDnsRspDnsKernel` is
//! the same formula on the present rows). States `z` and `n` start at 0:
//!
//! `ĝ = clip(g·r, c)`, `z ← z + ĝ − (√(n + ĝ²) − √n)·w/lr`, `n ← n + ĝ²`,
//! `w ← (sign(z)·λ1 − z) / ((β + √n)/lr + wd) · [|z| > λ1]`.
//!
//! Row_sparse: MXNet updates lazily only when the weight itself is row_sparse; a dense
//! weight falls back to the dense kernel on the densified gradient. synkv's `lazy_update`
//! chooses between the two (default lazy, the row_sparse-weight behaviour).

use super::kernel::{clip, sign, ElemKernel, Hyper, Lane, Real, Target};
use super::params::Ftrl;
use super::sparse::{by_layout, GradLayout};
use super::state::{OptimizerState, SlotData};

struct FtrlK<A> {
    lr: A,
    wd: A,
    lamda1: A,
    beta: A,
    rescale: A,
    clip: A,
}

impl<A: Real> ElemKernel<A, 2> for FtrlK<A> {
    #[inline(always)]
    fn step(&self, w: A, g: A, s: &mut [A; 2]) -> A {
        let gr = clip(g * self.rescale, self.clip);
        let (z0, n0) = (s[0], s[1]);
        let z = z0 + (gr - ((n0 + gr * gr).sqrt() - n0.sqrt()) * w / self.lr);
        let n = n0 + gr * gr;
        s[0] = z;
        s[1] = n;
        let active = if z.abs() > self.lamda1 { A::ONE } else { A::ZERO };
        (sign(z) * self.lamda1 - z) / ((self.beta + n.sqrt()) / self.lr + self.wd) * active
    }
}

impl Ftrl {
    pub(crate) fn apply<W: Lane>(
        &self,
        h: &Hyper,
        target: Target<'_, W>,
        grad: &GradLayout<'_, W>,
        slots: &mut [(&'static str, SlotData)],
    ) {
        let k = FtrlK {
            lr: W::A::from_f64(h.lr),
            wd: W::A::from_f64(h.wd),
            lamda1: W::A::from_f64(self.lamda1),
            beta: W::A::from_f64(self.beta),
            rescale: W::A::from_f64(h.rescale),
            clip: h.clip_bound(),
        };
        let st = OptimizerState::slots_mut::<W::A, 2>(slots);
        by_layout(target, grad, st, &k, &k, &k)
    }
}
