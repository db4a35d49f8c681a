//! Learning-rate schedulers (MXNet 1.9.1 `mx.lr_scheduler`, spec K6.14).
//!
//! A scheduler maps the optimizer's `num_update` (the largest per-key update count, K6.10)
//! to a learning rate. It is plain data, serialised with the optimizer, and evaluated
//! statelessly: MXNet's factor schedulers mutate themselves as `num_update` grows; here the
//! same values are computed in closed form, so a restored optimizer continues exactly.
//!
//! The base learning rate is **not** part of the scheduler: it is always the optimizer's
//! `learning_rate`. (MXNet keeps a separate `base_lr` that the optimizer's learning rate
//! overwrites for factor schedulers but not for the warm-up target or for poly/cosine,
//! which keep the value given at construction; synkv has one source of truth.)
//!
//! | schedule | lr at `n` (after warm-up) |
//! | --- | --- |
//! | factor | `max(base · factor^k, stop_factor_lr)` with `k = ⌊(n − 1) / step⌋` decays (the first at `n = step + 1`); `k = 0` leaves `base` untouched |
//! | multi_factor | `base · factor^k`, `k` = number of listed steps `s` with `n > s` |
//! | poly | `final + (base − final) · (1 − (n − w) / (max_update − w))^pwr` for `n ≤ max_update`, then `final` |
//! | cosine | `final + (base − final) · (1 + cos(π · (n − w) / (max_update − w))) / 2` for `n ≤ max_update`, then `final` |
//!
//! Warm-up (`n < warmup.steps`): linear `begin + (base − begin) · n / steps`, or constant
//! `begin`. `w` above is `warmup.steps`.

use serde::{Deserialize, Serialize};

/// A learning-rate schedule with optional warm-up.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LrScheduler {
    /// The decay rule.
    pub schedule: Schedule,
    /// Warm-up phase before the schedule starts; `None` means none.
    #[serde(default)]
    pub warmup: Option<Warmup>,
}

/// The decay rule of an [`LrScheduler`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
#[non_exhaustive]
pub enum Schedule {
    /// `FactorScheduler(step, factor=1, stop_factor_lr=1e-8)`.
    Factor {
        /// Updates between two decays (≥ 1).
        step: u64,
        /// Multiplier applied at each decay (0 < factor ≤ 1).
        factor: f64,
        /// Floor of the learning rate once decays started.
        #[serde(default = "default_stop_factor_lr")]
        stop_factor_lr: f64,
    },
    /// `MultiFactorScheduler(step=[…], factor=1)`.
    MultiFactor {
        /// Strictly increasing update counts (each ≥ 1) after which the lr decays.
        steps: Vec<u64>,
        /// Multiplier applied at each listed step (0 < factor ≤ 1).
        factor: f64,
    },
    /// `PolyScheduler(max_update, pwr=2, final_lr=0)`.
    Poly {
        /// Update at which the final learning rate is reached (> warm-up steps).
        max_update: u64,
        /// Power of the decay.
        #[serde(default = "default_pwr")]
        pwr: f64,
        /// Learning rate at and after `max_update`.
        #[serde(default)]
        final_lr: f64,
    },
    /// `CosineScheduler(max_update, final_lr=0)`.
    Cosine {
        /// Update at which the final learning rate is reached (> warm-up steps).
        max_update: u64,
        /// Learning rate at and after `max_update`.
        #[serde(default)]
        final_lr: f64,
    },
}

/// How the learning rate evolves during warm-up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum WarmupMode {
    /// From `begin_lr` to the base learning rate in equal increments.
    #[default]
    Linear,
    /// `begin_lr` throughout the warm-up.
    Constant,
}

/// Warm-up phase: for `num_update < steps` the schedule is replaced by the warm-up rule.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Warmup {
    /// Number of warm-up updates.
    pub steps: u64,
    /// Learning rate at update 0 (≤ the base learning rate).
    #[serde(default)]
    pub begin_lr: f64,
    /// Linear or constant.
    #[serde(default)]
    pub mode: WarmupMode,
}

fn default_stop_factor_lr() -> f64 {
    1e-8
}

fn default_pwr() -> f64 {
    2.0
}

impl LrScheduler {
    /// `FactorScheduler(step, factor)` with MXNet's `stop_factor_lr = 1e-8`.
    pub fn factor(step: u64, factor: f64) -> Self {
        Self::new(Schedule::Factor { step, factor, stop_factor_lr: default_stop_factor_lr() })
    }

    /// `MultiFactorScheduler(steps, factor)`.
    pub fn multi_factor(steps: Vec<u64>, factor: f64) -> Self {
        Self::new(Schedule::MultiFactor { steps, factor })
    }

    /// `PolyScheduler(max_update, pwr, final_lr)`.
    pub fn poly(max_update: u64, pwr: f64, final_lr: f64) -> Self {
        Self::new(Schedule::Poly { max_update, pwr, final_lr })
    }

    /// `CosineScheduler(max_update, final_lr)`.
    pub fn cosine(max_update: u64, final_lr: f64) -> Self {
        Self::new(Schedule::Cosine { max_update, final_lr })
    }

    /// A scheduler without warm-up.
    pub fn new(schedule: Schedule) -> Self {
        LrScheduler { schedule, warmup: None }
    }

    /// Adds a warm-up of `steps` updates starting at `begin_lr`.
    pub fn with_warmup(mut self, steps: u64, begin_lr: f64, mode: WarmupMode) -> Self {
        self.warmup = Some(Warmup { steps, begin_lr, mode });
        self
    }

    fn warmup_steps(&self) -> u64 {
        self.warmup.map_or(0, |w| w.steps)
    }

    /// The learning rate at `num_update` for base learning rate `base_lr`.
    pub fn learning_rate(&self, base_lr: f64, num_update: u64) -> f64 {
        if let Some(w) = self.warmup {
            if num_update < w.steps {
                return match w.mode {
                    WarmupMode::Linear => {
                        let increase = (base_lr - w.begin_lr) * num_update as f64 / w.steps as f64;
                        w.begin_lr + increase
                    }
                    WarmupMode::Constant => w.begin_lr,
                };
            }
        }
        let warm = self.warmup_steps();
        match &self.schedule {
            Schedule::Factor { step, factor, stop_factor_lr } => {
                // MXNet decays while `n > count + step`, i.e. k = ⌈(n − step) / step⌉⁺.
                let k = if num_update > *step { (num_update - 1) / step } else { 0 };
                factor_decay(base_lr, *factor, *stop_factor_lr, k)
            }
            Schedule::MultiFactor { steps, factor } => {
                let passed = steps.iter().take_while(|&&s| num_update > s).count();
                (0..passed).fold(base_lr, |lr, _| lr * factor)
            }
            Schedule::Poly { max_update, pwr, final_lr } => {
                let n = num_update.min(*max_update);
                let max_steps = (max_update - warm) as f64;
                let frac = 1.0 - (n - warm) as f64 / max_steps;
                final_lr + (base_lr - final_lr) * frac.powf(*pwr)
            }
            Schedule::Cosine { max_update, final_lr } => {
                let n = num_update.min(*max_update);
                let max_steps = (max_update - warm) as f64;
                let c = (std::f64::consts::PI * (n - warm) as f64 / max_steps).cos();
                final_lr + (base_lr - final_lr) * (1.0 + c) / 2.0
            }
        }
    }

    /// Checks the parameters against MXNet's rules; `Err` holds `(field, value, reason)`.
    pub(crate) fn check(&self, base_lr: f64) -> Result<(), (String, String, String)> {
        let bad = |field: &str, value: String, reason: &str| Err((format!("lr_scheduler.{field}"), value, reason.to_owned()));
        if let Some(w) = self.warmup {
            if !w.begin_lr.is_finite() || w.begin_lr < 0.0 {
                return bad("warmup.begin_lr", w.begin_lr.to_string(), "must be finite and ≥ 0");
            }
            if w.begin_lr > base_lr {
                return bad(
                    "warmup.begin_lr",
                    w.begin_lr.to_string(),
                    "must not exceed the base learning rate (the optimizer's learning_rate)",
                );
            }
        }
        let warm = self.warmup_steps();
        let factor_ok = |f: f64| f.is_finite() && f > 0.0 && f <= 1.0;
        match &self.schedule {
            Schedule::Factor { step, factor, stop_factor_lr } => {
                if *step < 1 {
                    return bad("step", step.to_string(), "must be ≥ 1");
                }
                if !factor_ok(*factor) {
                    return bad("factor", factor.to_string(), "must be in (0, 1] to reduce the lr");
                }
                if !stop_factor_lr.is_finite() || *stop_factor_lr < 0.0 {
                    return bad("stop_factor_lr", stop_factor_lr.to_string(), "must be ≥ 0");
                }
            }
            Schedule::MultiFactor { steps, factor } => {
                if steps.is_empty() {
                    return bad("steps", "[]".into(), "must list at least one step");
                }
                if steps[0] < 1 || steps.windows(2).any(|p| p[1] <= p[0]) {
                    return bad("steps", format!("{steps:?}"), "must be strictly increasing and ≥ 1");
                }
                if !factor_ok(*factor) {
                    return bad("factor", factor.to_string(), "must be in (0, 1] to reduce the lr");
                }
            }
            Schedule::Poly { max_update, pwr, final_lr } => {
                if *max_update <= warm {
                    return bad("max_update", max_update.to_string(), "must exceed the warm-up steps");
                }
                if !pwr.is_finite() || *pwr < 0.0 {
                    return bad("pwr", pwr.to_string(), "must be finite and ≥ 0");
                }
                if !final_lr.is_finite() || *final_lr < 0.0 {
                    return bad("final_lr", final_lr.to_string(), "must be finite and ≥ 0");
                }
            }
            Schedule::Cosine { max_update, final_lr } => {
                if *max_update <= warm {
                    return bad("max_update", max_update.to_string(), "must exceed the warm-up steps");
                }
                if !final_lr.is_finite() || *final_lr < 0.0 {
                    return bad("final_lr", final_lr.to_string(), "must be finite and ≥ 0");
                }
            }
        }
        Ok(())
    }
}

/// `k` factor decays floored at `stop`, multiplied one at a time as MXNet does (so the
/// f64 rounding matches); long runs that hit the floor or never change stop early.
fn factor_decay(base: f64, factor: f64, stop: f64, k: u64) -> f64 {
    if k == 0 {
        return base;
    }
    if factor == 1.0 {
        return base.max(stop);
    }
    let mut lr = base;
    for i in 0..k {
        if i == 4096 {
            // Beyond this the iterated product and the closed form agree to well below f32
            // precision; avoid O(k) work for very small steps.
            return (base * factor.powf(k as f64)).max(stop);
        }
        lr *= factor;
        if lr < stop {
            return stop;
        }
    }
    lr
}

#[cfg(test)]
mod tests {
    use super::super::oracle_cases::SCHED_CASES;
    use super::*;

    #[test]
    fn matches_mxnet_lr_scheduler() {
        for case in SCHED_CASES {
            let s: LrScheduler = serde_json::from_str(case.scheduler).unwrap();
            s.check(case.base_lr).unwrap();
            for &(n, expected) in case.points {
                let got = s.learning_rate(case.base_lr, n);
                let tol = 1e-12 * expected.abs().max(1e-12);
                assert!((got - expected).abs() <= tol, "{} at num_update {n}: got {got}, MXNet {expected}", case.name);
            }
        }
    }

    #[test]
    fn factor_first_decay_is_at_step_plus_one() {
        let s = LrScheduler::factor(3, 0.5);
        assert_eq!(s.learning_rate(1.0, 3), 1.0);
        assert_eq!(s.learning_rate(1.0, 4), 0.5);
        assert_eq!(s.learning_rate(1.0, 7), 0.25);
    }

    #[test]
    fn factor_with_many_decays_is_floored_and_cheap() {
        let s = LrScheduler::factor(1, 0.999_999);
        let lr = s.learning_rate(0.1, 50_000_000);
        assert!((1e-8..0.1).contains(&lr));
    }

    #[test]
    fn rejects_bad_parameters() {
        assert!(LrScheduler::factor(0, 0.5).check(0.1).is_err());
        assert!(LrScheduler::factor(2, 1.5).check(0.1).is_err());
        assert!(LrScheduler::multi_factor(vec![3, 3], 0.5).check(0.1).is_err());
        assert!(LrScheduler::poly(2, 2.0, 0.0).with_warmup(2, 0.0, WarmupMode::Linear).check(0.1).is_err());
        assert!(LrScheduler::cosine(10, 0.0).with_warmup(2, 0.5, WarmupMode::Linear).check(0.1).is_err());
        assert!(LrScheduler::cosine(10, 0.0).check(0.1).is_ok());
    }
}
