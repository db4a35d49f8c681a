//! One hyper-parameter struct per optimizer, with MXNet 1.9.1's defaults.
//!
//! Each struct is a variant payload of [`Optimizer`](super::Optimizer): its own fields
//! plus the shared [`Common`] block under `"common"`. `Default` gives MXNet's constructor
//! defaults; `validate` enforces the ranges documented on each field. The arithmetic that
//! uses these values lives in the optimizer-family files (`sgd.rs`, `adam.rs`, …).

use serde::{Deserialize, Serialize};

use super::config::{check, Common, Range};
use super::error::{Error, Result};

macro_rules! params {
    (
        $(#[$meta:meta])*
        $name:ident {
            $( $(#[$fmeta:meta])* $field:ident : $ty:ty = $default:expr ),* $(,)?
        }
        validate($p:ident) $validate:block
    ) => {
        $(#[$meta])*
        #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
        #[serde(default, deny_unknown_fields)]
        pub struct $name {
            /// Hyper-parameters shared by all optimizers.
            pub common: Common,
            $( $(#[$fmeta])* pub $field: $ty, )*
        }

        impl Default for $name {
            fn default() -> Self {
                $name { common: Common::default(), $( $field: $default, )* }
            }
        }

        impl $name {
            #[allow(unused_variables)]
            pub(crate) fn validate(&self) -> Result<()> {
                let $p = self;
                $validate
                Ok(())
            }
        }
    };
}

fn opt_bound(optimizer: &'static str, param: &str, value: Option<f64>) -> Result<()> {
    match value {
        Some(v) if !(v.is_finite() && v > 0.0) => {
            Err(Error::invalid(optimizer, param, v, "must be a positive finite bound; use null (None) to disable it"))
        }
        _ => Ok(()),
    }
}

params! {
    /// SGD (`mx.optimizer.SGD`): `m ← momentum·m − lr·(clip(rescale·g) + wd·w)`, `w ← w + m`.
    Sgd {
        /// Momentum in `[0, 1)`; 0 keeps no state.
        momentum: f64 = 0.0,
        /// Row_sparse gradients update only their rows (MXNet 1.x default `true`).
        lazy_update: bool = true,
    }
    validate(p) { check("sgd", "momentum", p.momentum, Range::UnitOpen)?; }
}

params! {
    /// Nesterov accelerated gradient (`mx.optimizer.NAG`).
    Nag {
        /// Momentum in `[0, 1)`; 0 makes it plain SGD.
        momentum: f64 = 0.0,
    }
    validate(p) { check("nag", "momentum", p.momentum, Range::UnitOpen)?; }
}

params! {
    /// Signum / signSGD (`mx.optimizer.Signum`); momentum 0 gives signSGD.
    Signum {
        /// Momentum in `[0, 1)`.
        momentum: f64 = 0.9,
        /// Decoupled weight decay (Loshchilov & Hutter), ≥ 0.
        wd_lh: f64 = 0.0,
    }
    validate(p) {
        check("signum", "momentum", p.momentum, Range::UnitOpen)?;
        check("signum", "wd_lh", p.wd_lh, Range::NonNegative)?;
    }
}

params! {
    /// Adam (`mx.optimizer.Adam`), bias-corrected learning rate per key.
    Adam {
        /// First-moment decay in `[0, 1)`.
        beta1: f64 = 0.9,
        /// Second-moment decay in `[0, 1)`.
        beta2: f64 = 0.999,
        /// Denominator guard, > 0.
        epsilon: f64 = 1e-8,
        /// Row_sparse gradients update only their rows (MXNet 1.x default `true`).
        lazy_update: bool = true,
    }
    validate(p) {
        check("adam", "beta1", p.beta1, Range::UnitOpen)?;
        check("adam", "beta2", p.beta2, Range::UnitOpen)?;
        check("adam", "epsilon", p.epsilon, Range::Positive)?;
    }
}

params! {
    /// AdamW with decoupled weight decay: MXNet 2.0's `AdamW` on the 1.9.1
    /// `contrib.adamw_update` kernel (`w ← w − lr_t·(m/(√v+ε) + wd·w)`).
    AdamW {
        /// First-moment decay in `[0, 1)`.
        beta1: f64 = 0.9,
        /// Second-moment decay in `[0, 1)`.
        beta2: f64 = 0.999,
        /// Denominator guard, > 0.
        epsilon: f64 = 1e-6,
        /// Scale the learning rate by `√(1−β2ᵗ)/(1−β1ᵗ)`.
        correct_bias: bool = true,
    }
    validate(p) {
        check("adamw", "beta1", p.beta1, Range::UnitOpen)?;
        check("adamw", "beta2", p.beta2, Range::UnitOpen)?;
        check("adamw", "epsilon", p.epsilon, Range::Positive)?;
    }
}

params! {
    /// LAMB (`mx.optimizer.LAMB`, the `multi_lamb_update` path the updater takes).
    Lamb {
        /// First-moment decay in `[0, 1)`.
        beta1: f64 = 0.9,
        /// Second-moment decay in `[0, 1)`.
        beta2: f64 = 0.999,
        /// Denominator guard, > 0.
        epsilon: f64 = 1e-6,
        /// Lower bound on the weight norm in the trust ratio (`None`: unbounded).
        lower_bound: Option<f64> = None,
        /// Upper bound on the weight norm in the trust ratio (`None`: unbounded).
        upper_bound: Option<f64> = None,
        /// Divide the moments by `1 − βᵗ`.
        bias_correction: bool = true,
    }
    validate(p) {
        check("lamb", "beta1", p.beta1, Range::UnitOpen)?;
        check("lamb", "beta2", p.beta2, Range::UnitOpen)?;
        check("lamb", "epsilon", p.epsilon, Range::Positive)?;
        opt_bound("lamb", "lower_bound", p.lower_bound)?;
        opt_bound("lamb", "upper_bound", p.upper_bound)?;
    }
}

params! {
    /// AdaGrad (`mx.optimizer.AdaGrad`; MXNet calls `epsilon` `eps`).
    AdaGrad {
        /// Added to the history under the square root, > 0.
        epsilon: f64 = 1e-7,
        /// Row_sparse gradients update only their rows (MXNet's only sparse mode);
        /// `false` runs the dense update on the densified gradient.
        lazy_update: bool = true,
    }
    validate(p) { check("adagrad", "epsilon", p.epsilon, Range::Positive)?; }
}

params! {
    /// RMSProp (`mx.optimizer.RMSProp`): Tieleman & Hinton, or Graves' centered version.
    RmsProp {
        /// Decay of the squared-gradient average, in `[0, 1)`.
        gamma1: f64 = 0.9,
        /// Momentum of the centered version, in `[0, 1)`.
        gamma2: f64 = 0.9,
        /// Denominator guard, > 0.
        epsilon: f64 = 1e-8,
        /// Use the centered (Graves) variant with states `n`, `g`, `delta`.
        centered: bool = false,
        /// Clip weights to `[-c, c]` after the update (`None`: no clipping).
        clip_weights: Option<f64> = None,
    }
    validate(p) {
        check("rmsprop", "gamma1", p.gamma1, Range::UnitOpen)?;
        check("rmsprop", "gamma2", p.gamma2, Range::UnitOpen)?;
        check("rmsprop", "epsilon", p.epsilon, Range::Positive)?;
        opt_bound("rmsprop", "clip_weights", p.clip_weights)?;
    }
}

params! {
    /// AdaDelta (`mx.optimizer.AdaDelta`); the learning rate is not used.
    AdaDelta {
        /// Decay of both accumulators, in `[0, 1]`.
        rho: f64 = 0.9,
        /// Guard inside both square roots, > 0.
        epsilon: f64 = 1e-5,
    }
    validate(p) {
        check("adadelta", "rho", p.rho, Range::UnitClosed)?;
        check("adadelta", "epsilon", p.epsilon, Range::Positive)?;
    }
}

params! {
    /// FTRL-proximal (`mx.optimizer.Ftrl`).
    Ftrl {
        /// L1 regularisation strength, ≥ 0.
        lamda1: f64 = 0.01,
        /// Per-coordinate learning-rate offset, ≥ 0.
        beta: f64 = 1.0,
        /// Row_sparse gradients update only their rows (MXNet does this for row_sparse
        /// weights); `false` runs the dense update on the densified gradient.
        lazy_update: bool = true,
    }
    validate(p) {
        check("ftrl", "lamda1", p.lamda1, Range::NonNegative)?;
        check("ftrl", "beta", p.beta, Range::NonNegative)?;
    }
}

params! {
    /// The kvstore test optimizer (K6.13, 1.x semantics): `w += rescale_grad · g`; learning
    /// rate, weight decay and clipping are ignored and no state is kept.
    TestOptimizer {}
    validate(p) {}
}
