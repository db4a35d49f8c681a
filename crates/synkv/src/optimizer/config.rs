//! The optimizer as data: a serialisable description (name + hyper-parameters).
//!
//! [`Optimizer`] is what `set_optimizer` receives and what a distributed worker sends to
//! the servers, so it is plain data: a serde enum tagged by `"name"`, one struct per
//! optimizer (in [`params`](super::params)) and a shared [`Common`] block. Defaults are
//! MXNet 1.9.1's; see `docs/optimizers.md` for the table. JSON looks like
//!
//! ```json
//! {"name": "sgd", "momentum": 0.9, "lazy_update": true,
//!  "common": {"learning_rate": 0.1, "wd": 0.0001, "clip_gradient": 5.0}}
//! ```
//!
//! Unknown fields are rejected (a typo must not silently fall back to a default), and
//! [`Optimizer::from_json`] validates every value. This file does no arithmetic.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::error::{Error, Result};
use super::params::{AdaDelta, AdaGrad, Adam, AdamW, Ftrl, Lamb, Nag, RmsProp, Sgd, Signum, TestOptimizer};
use super::scheduler::LrScheduler;

/// Hyper-parameters every optimizer shares (MXNet's `Optimizer.__init__` arguments).
///
/// All scalars are `f64` because MXNet computes them in Python doubles (bias corrections,
/// schedules) and rounds to f32 only when it calls a kernel; synkv does the same.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Common {
    /// Base learning rate; `None` means the optimizer's default (e.g. 0.01 for SGD,
    /// 0.001 for Adam). With a scheduler this is the scheduler's base rate.
    pub learning_rate: Option<f64>,
    /// Weight decay (L2) coefficient, ≥ 0.
    pub wd: f64,
    /// Gradients are multiplied by this before anything else (often `1 / batch_size`).
    pub rescale_grad: f64,
    /// Clip the (rescaled) gradient to `[-c, c]`; `None` disables clipping. Must be > 0.
    pub clip_gradient: Option<f64>,
    /// Per-key learning-rate multipliers, by the key's display form (`"3"`, `"fc1_weight"`).
    pub lr_mult: BTreeMap<String, f64>,
    /// Per-key weight-decay multipliers, by the key's display form.
    pub wd_mult: BTreeMap<String, f64>,
    /// Initial value of every key's update count (and of `num_update`).
    pub begin_num_update: u64,
    /// Keep an f32 master copy of f16/bf16 weights and update that (K6.11).
    pub multi_precision: bool,
    /// Learning-rate schedule evaluated at `num_update`.
    pub lr_scheduler: Option<LrScheduler>,
}

impl Default for Common {
    fn default() -> Self {
        Common {
            learning_rate: None,
            wd: 0.0,
            rescale_grad: 1.0,
            clip_gradient: None,
            lr_mult: BTreeMap::new(),
            wd_mult: BTreeMap::new(),
            begin_num_update: 0,
            multi_precision: false,
            lr_scheduler: None,
        }
    }
}

/// An optimizer description: which algorithm, with which hyper-parameters.
///
/// Build one with a constructor and builder-style setters, or from a struct literal:
///
/// ```
/// # use synkv::optimizer::{Optimizer, Sgd, LrScheduler};
/// let a = Optimizer::sgd().with_learning_rate(0.1).with_wd(1e-4);
/// let b = Optimizer::from(Sgd { momentum: 0.9, ..Sgd::default() })
///     .with_lr_scheduler(LrScheduler::factor(1000, 0.5));
/// let json = b.to_json();
/// assert_eq!(Optimizer::from_json(&json).unwrap(), b);
/// # let _ = a;
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "name", rename_all = "lowercase")]
#[non_exhaustive]
pub enum Optimizer {
    /// SGD with optional momentum (`"sgd"`).
    Sgd(Sgd),
    /// Nesterov accelerated gradient (`"nag"`).
    Nag(Nag),
    /// Signum / signSGD (`"signum"`).
    Signum(Signum),
    /// Adam (`"adam"`).
    Adam(Adam),
    /// Adam with decoupled weight decay (`"adamw"`).
    AdamW(AdamW),
    /// LAMB (`"lamb"`).
    Lamb(Lamb),
    /// AdaGrad (`"adagrad"`).
    AdaGrad(AdaGrad),
    /// RMSProp, plain or centered (`"rmsprop"`).
    RmsProp(RmsProp),
    /// AdaDelta (`"adadelta"`).
    AdaDelta(AdaDelta),
    /// FTRL-proximal (`"ftrl"`).
    Ftrl(Ftrl),
    /// The kvstore test optimizer `w += rescale_grad · g` (`"test"`, K6.13).
    Test(TestOptimizer),
}

macro_rules! each {
    ($self:expr, $p:ident => $body:expr) => {
        match $self {
            Optimizer::Sgd($p) => $body,
            Optimizer::Nag($p) => $body,
            Optimizer::Signum($p) => $body,
            Optimizer::Adam($p) => $body,
            Optimizer::AdamW($p) => $body,
            Optimizer::Lamb($p) => $body,
            Optimizer::AdaGrad($p) => $body,
            Optimizer::RmsProp($p) => $body,
            Optimizer::AdaDelta($p) => $body,
            Optimizer::Ftrl($p) => $body,
            Optimizer::Test($p) => $body,
        }
    };
}
pub(crate) use each;

macro_rules! from_params {
    ($($variant:ident($t:ident)),*) => {$(
        impl From<$t> for Optimizer {
            fn from(p: $t) -> Self {
                Optimizer::$variant(p)
            }
        }
    )*};
}

from_params!(
    Sgd(Sgd),
    Nag(Nag),
    Signum(Signum),
    Adam(Adam),
    AdamW(AdamW),
    Lamb(Lamb),
    AdaGrad(AdaGrad),
    RmsProp(RmsProp),
    AdaDelta(AdaDelta),
    Ftrl(Ftrl),
    Test(TestOptimizer)
);

impl Optimizer {
    /// SGD with MXNet 1.9.1 defaults (lr 0.01, momentum 0, lazy_update true).
    pub fn sgd() -> Self {
        Sgd::default().into()
    }
    /// NAG with MXNet defaults (lr 0.01, momentum 0).
    pub fn nag() -> Self {
        Nag::default().into()
    }
    /// Signum with MXNet defaults (lr 0.01, momentum 0.9, wd_lh 0).
    pub fn signum() -> Self {
        Signum::default().into()
    }
    /// Adam with MXNet defaults (lr 0.001, β1 0.9, β2 0.999, ε 1e-8, lazy_update true).
    pub fn adam() -> Self {
        Adam::default().into()
    }
    /// AdamW with MXNet 2.0 defaults (lr 0.001, β1 0.9, β2 0.999, ε 1e-6, bias correction).
    pub fn adamw() -> Self {
        AdamW::default().into()
    }
    /// LAMB with MXNet defaults (lr 0.001, β1 0.9, β2 0.999, ε 1e-6, bias correction).
    pub fn lamb() -> Self {
        Lamb::default().into()
    }
    /// AdaGrad with MXNet defaults (lr 0.01, ε 1e-7).
    pub fn adagrad() -> Self {
        AdaGrad::default().into()
    }
    /// RMSProp with MXNet defaults (lr 0.001, γ1 0.9, γ2 0.9, ε 1e-8, not centered).
    pub fn rmsprop() -> Self {
        RmsProp::default().into()
    }
    /// AdaDelta with MXNet defaults (ρ 0.9, ε 1e-5; ignores the learning rate).
    pub fn adadelta() -> Self {
        AdaDelta::default().into()
    }
    /// FTRL with MXNet defaults (lr 0.1, λ1 0.01, β 1).
    pub fn ftrl() -> Self {
        Ftrl::default().into()
    }
    /// The test optimizer `w += rescale_grad · g`.
    pub fn test() -> Self {
        TestOptimizer::default().into()
    }

    /// The optimizer's name as used in JSON and state files (`"sgd"`, `"adam"`, …).
    pub fn name(&self) -> &'static str {
        match self {
            Optimizer::Sgd(_) => "sgd",
            Optimizer::Nag(_) => "nag",
            Optimizer::Signum(_) => "signum",
            Optimizer::Adam(_) => "adam",
            Optimizer::AdamW(_) => "adamw",
            Optimizer::Lamb(_) => "lamb",
            Optimizer::AdaGrad(_) => "adagrad",
            Optimizer::RmsProp(_) => "rmsprop",
            Optimizer::AdaDelta(_) => "adadelta",
            Optimizer::Ftrl(_) => "ftrl",
            Optimizer::Test(_) => "test",
        }
    }

    /// The shared hyper-parameters.
    pub fn common(&self) -> &Common {
        each!(self, p => &p.common)
    }

    /// The shared hyper-parameters, mutably.
    pub fn common_mut(&mut self) -> &mut Common {
        each!(self, p => &mut p.common)
    }

    /// MXNet's default learning rate for this optimizer.
    pub fn default_learning_rate(&self) -> f64 {
        match self {
            Optimizer::Adam(_) | Optimizer::AdamW(_) | Optimizer::Lamb(_) | Optimizer::RmsProp(_) => 0.001,
            Optimizer::Ftrl(_) => 0.1,
            _ => 0.01,
        }
    }

    /// The base learning rate: `common.learning_rate` or the optimizer's default.
    pub fn learning_rate(&self) -> f64 {
        self.common().learning_rate.unwrap_or_else(|| self.default_learning_rate())
    }

    /// Names of the per-key state slots this optimizer keeps, in order (a master copy for
    /// multi-precision is kept separately as `"weight32"`).
    pub fn state_slots(&self) -> &'static [&'static str] {
        match self {
            Optimizer::Sgd(p) if p.momentum != 0.0 => &["momentum"],
            Optimizer::Nag(p) if p.momentum != 0.0 => &["momentum"],
            Optimizer::Signum(p) if p.momentum != 0.0 => &["momentum"],
            Optimizer::Adam(_) | Optimizer::AdamW(_) | Optimizer::Lamb(_) => &["mean", "var"],
            Optimizer::AdaGrad(_) => &["history"],
            Optimizer::RmsProp(p) if p.centered => &["n", "g", "delta"],
            Optimizer::RmsProp(_) => &["n"],
            Optimizer::AdaDelta(_) => &["acc_g", "acc_delta"],
            Optimizer::Ftrl(_) => &["z", "n"],
            _ => &[],
        }
    }

    /// Whether a row_sparse gradient has a native (lazy/standard) kernel; the others are
    /// updated by densifying the gradient.
    pub fn supports_row_sparse(&self) -> bool {
        matches!(self, Optimizer::Sgd(_) | Optimizer::Adam(_) | Optimizer::AdaGrad(_) | Optimizer::Ftrl(_))
    }

    /// Checks every hyper-parameter; the error names the parameter and the allowed range.
    pub fn validate(&self) -> Result<()> {
        let name = self.name();
        let c = self.common();
        let lr = self.learning_rate();
        check(name, "learning_rate", lr, Range::NonNegative)?;
        check(name, "wd", c.wd, Range::NonNegative)?;
        check(name, "rescale_grad", c.rescale_grad, Range::Finite)?;
        if let Some(clip) = c.clip_gradient {
            if !(clip.is_finite() && clip > 0.0) {
                return Err(Error::invalid(
                    name,
                    "clip_gradient",
                    clip,
                    "must be a positive finite bound; use null (None) to disable clipping",
                ));
            }
        }
        for (key, &m) in &c.lr_mult {
            check(name, format!("lr_mult[{key:?}]"), m, Range::NonNegative)?;
        }
        for (key, &m) in &c.wd_mult {
            check(name, format!("wd_mult[{key:?}]"), m, Range::NonNegative)?;
        }
        if let Some(s) = &c.lr_scheduler {
            s.check(lr).map_err(|(field, value, reason)| Error::invalid(name, field, value, reason))?;
        }
        each!(self, p => p.validate())
    }

    /// The description as JSON (round-trips through [`Optimizer::from_json`]).
    pub fn to_json(&self) -> String {
        match serde_json::to_string(self) {
            Ok(s) => s,
            // Plain data with string map keys always serialises.
            Err(e) => unreachable!("optimizer config serialises: {e}"),
        }
    }

    /// Parses and validates a JSON description.
    pub fn from_json(json: &str) -> Result<Self> {
        let opt: Optimizer = serde_json::from_str(json).map_err(|source| Error::Json { source })?;
        opt.validate()?;
        Ok(opt)
    }

    /// Sets the base learning rate.
    pub fn with_learning_rate(mut self, lr: f64) -> Self {
        self.common_mut().learning_rate = Some(lr);
        self
    }
    /// Sets the weight decay.
    pub fn with_wd(mut self, wd: f64) -> Self {
        self.common_mut().wd = wd;
        self
    }
    /// Sets the gradient rescaling factor.
    pub fn with_rescale_grad(mut self, rescale_grad: f64) -> Self {
        self.common_mut().rescale_grad = rescale_grad;
        self
    }
    /// Clips rescaled gradients to `[-bound, bound]`.
    pub fn with_clip_gradient(mut self, bound: f64) -> Self {
        self.common_mut().clip_gradient = Some(bound);
        self
    }
    /// Sets the learning-rate multiplier of one key (by its display form).
    pub fn with_lr_mult(mut self, key: impl Into<String>, mult: f64) -> Self {
        self.common_mut().lr_mult.insert(key.into(), mult);
        self
    }
    /// Sets the weight-decay multiplier of one key (by its display form).
    pub fn with_wd_mult(mut self, key: impl Into<String>, mult: f64) -> Self {
        self.common_mut().wd_mult.insert(key.into(), mult);
        self
    }
    /// Sets the initial update count.
    pub fn with_begin_num_update(mut self, n: u64) -> Self {
        self.common_mut().begin_num_update = n;
        self
    }
    /// Turns multi-precision (f32 master copies for f16/bf16 weights) on or off.
    pub fn with_multi_precision(mut self, on: bool) -> Self {
        self.common_mut().multi_precision = on;
        self
    }
    /// Sets the learning-rate scheduler.
    pub fn with_lr_scheduler(mut self, scheduler: LrScheduler) -> Self {
        self.common_mut().lr_scheduler = Some(scheduler);
        self
    }
}

/// Allowed ranges for [`check`].
#[derive(Clone, Copy)]
pub(crate) enum Range {
    /// Any finite value.
    Finite,
    /// Finite and ≥ 0.
    NonNegative,
    /// Finite and > 0.
    Positive,
    /// In `[0, 1)`.
    UnitOpen,
    /// In `[0, 1]`.
    UnitClosed,
}

/// Validates one scalar hyper-parameter.
pub(crate) fn check(optimizer: &'static str, param: impl Into<String>, value: f64, range: Range) -> Result<()> {
    let (ok, reason) = match range {
        Range::Finite => (value.is_finite(), "must be finite"),
        Range::NonNegative => (value.is_finite() && value >= 0.0, "must be finite and ≥ 0"),
        Range::Positive => (value.is_finite() && value > 0.0, "must be finite and > 0"),
        Range::UnitOpen => ((0.0..1.0).contains(&value), "must be in [0, 1)"),
        Range::UnitClosed => ((0.0..=1.0).contains(&value), "must be in [0, 1]"),
    };
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(optimizer, param, value, reason))
    }
}
