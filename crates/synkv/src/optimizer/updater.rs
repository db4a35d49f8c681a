//! The stateful updater a store installs with `set_optimizer` (MXNet's `get_updater`).
//!
//! [`Updater`] owns an [`Optimizer`] description, the per-key update counts and the
//! per-key [`OptimizerState`]s. For each `update(key, weight, grad)` it
//!
//! 1. checks dtype and length of weight and gradient, and that an existing state fits;
//! 2. creates the key's state on first use (zeros; an f32 master copy of an f16/bf16
//!    weight with multi-precision);
//! 3. increments the key's count (starting at `begin_num_update`) and sets
//!    `num_update = max(num_update, count)` (K6.10);
//! 4. resolves `lr = scheduler(num_update) or learning_rate`, times the key's `lr_mult`,
//!    and `wd · wd_mult`, keyed by the key's display form;
//! 5. runs the optimizer's fused kernel over weight, gradient and states.
//!
//! Counts are kept for one device, as MXNet's Python updater does per context; a store
//! updates each key on one context. The updater is not internally synchronised: `update`
//! takes `&mut self` (the kernels themselves run in parallel on large arrays).

use std::collections::HashMap;
use std::path::Path;

use super::config::{each, Optimizer};
use super::error::{Error, Result};
use super::format;
use super::kernel::{Hyper, Lane, Real, Target};
use super::sparse::{densify, GradLayout};
use super::state::{Layout, OptimizerState};
use super::{ElemType, GradRef, WeightMut};

/// Runs an optimizer on (key, weight, gradient) triples and keeps the per-key state.
#[derive(Debug)]
pub struct Updater {
    pub(crate) opt: Optimizer,
    valid: bool,
    pub(crate) num_update: u64,
    pub(crate) counts: HashMap<String, u64>,
    pub(crate) states: HashMap<String, OptimizerState>,
}

/// A gradient as the caller hands it over, before dtype dispatch.
enum GradIn<'a> {
    Dense(GradRef<'a>),
    Rows { row_len: usize, rows: Vec<usize>, data: GradRef<'a> },
}

impl Updater {
    /// An updater for `opt`. An invalid description is reported by the first `update`
    /// (use [`Updater::try_new`] to fail early).
    pub fn new(opt: Optimizer) -> Updater {
        let valid = opt.validate().is_ok();
        let num_update = opt.common().begin_num_update;
        Updater { opt, valid, num_update, counts: HashMap::new(), states: HashMap::new() }
    }

    /// An updater for `opt`, or the validation error.
    pub fn try_new(opt: Optimizer) -> Result<Updater> {
        opt.validate()?;
        Ok(Updater::new(opt))
    }

    /// The optimizer description.
    pub fn optimizer(&self) -> &Optimizer {
        &self.opt
    }

    /// The largest per-key update count so far (K6.10).
    pub fn num_update(&self) -> u64 {
        self.num_update
    }

    /// How many times `key` was updated, plus `begin_num_update`; `None` before its first
    /// update.
    pub fn update_count(&self, key: &str) -> Option<u64> {
        self.counts.get(key).copied()
    }

    /// The state of `key`, if it was created.
    pub fn state(&self, key: &str) -> Option<&OptimizerState> {
        self.states.get(key)
    }

    /// The scheduled base learning rate at the current `num_update` (before `lr_mult`).
    pub fn learning_rate(&self) -> f64 {
        let base = self.opt.learning_rate();
        match &self.opt.common().lr_scheduler {
            Some(s) => s.learning_rate(base, self.num_update),
            None => base,
        }
    }

    /// Updates `weight` in place with the dense gradient `grad`.
    pub fn update(&mut self, key: &str, weight: WeightMut<'_>, grad: GradRef<'_>) -> Result<()> {
        self.update_as(key, key, weight, grad)
    }

    /// [`update`](Updater::update) of a part of a parameter kept under its own state: the
    /// state and the update count are `state_key`'s, the hyper-parameters (`lr_mult`,
    /// `wd_mult`) the parameter `param`'s. A server holding several parts of one key updates
    /// each as its own state.
    pub fn update_as(&mut self, param: &str, state_key: &str, weight: WeightMut<'_>, grad: GradRef<'_>) -> Result<()> {
        self.ensure_valid()?;
        check_dtype(state_key, &weight, &grad)?;
        if weight.len() != grad.len() {
            return Err(Error::LengthMismatch { key: state_key.to_owned(), weight: weight.len(), grad: grad.len() });
        }
        self.step(param, state_key, weight, GradIn::Dense(grad))
    }

    /// Updates the dense `weight` (`rows × row_len`) with a row_sparse gradient: row ids
    /// `grad_rows` (sorted, distinct) and their data (`grad_rows.len() × row_len`).
    ///
    /// SGD, Adam, AdaGrad and FTRL update lazily (only the listed rows) when their
    /// `lazy_update` is set, else as if absent rows had a zero gradient; the other
    /// optimizers densify the gradient and run their dense update.
    pub fn update_row_sparse(
        &mut self,
        key: &str,
        weight: WeightMut<'_>,
        row_len: usize,
        grad_rows: &[i64],
        grad_data: GradRef<'_>,
    ) -> Result<()> {
        self.update_row_sparse_as(key, key, weight, row_len, grad_rows, grad_data)
    }

    /// [`update_row_sparse`](Updater::update_row_sparse) of a part of a parameter kept under
    /// its own state (see [`update_as`](Updater::update_as)).
    pub fn update_row_sparse_as(
        &mut self,
        param: &str,
        state_key: &str,
        weight: WeightMut<'_>,
        row_len: usize,
        grad_rows: &[i64],
        grad_data: GradRef<'_>,
    ) -> Result<()> {
        self.ensure_valid()?;
        check_dtype(state_key, &weight, &grad_data)?;
        let rows = check_rows(state_key, weight.len(), row_len, grad_rows, grad_data.len())?;
        self.step(param, state_key, weight, GradIn::Rows { row_len, rows, data: grad_data })
    }

    fn ensure_valid(&self) -> Result<()> {
        if self.valid {
            return Ok(());
        }
        self.opt.validate()
    }

    fn step(&mut self, param: &str, key: &str, weight: WeightMut<'_>, grad: GradIn<'_>) -> Result<()> {
        let h = self.prepare(param, key, weight.elem_type(), weight.len(), || weight.to_f32_vec())?;
        let state = self.states.get_mut(key).ok_or_else(|| Error::StateMismatch {
            key: key.to_owned(),
            reason: "it is lent out (Updater::lend) and was not given back".to_owned(),
        })?;
        run(&self.opt, &h, weight, grad, state);
        Ok(())
    }

    /// Steps 2 to 4 of an update of `key`, whose weight has `len` elements of type `elem`
    /// (see the module docs): its state exists and fits (`master`: the weight widened to f32,
    /// asked for a new multi-precision state), its count and `num_update` are advanced;
    /// returns the hyper-parameters of this update.
    fn prepare(&mut self, param: &str, key: &str, elem: ElemType, len: usize, master: impl FnOnce() -> Vec<f32>) -> Result<Hyper> {
        let common = self.opt.common();
        let layout = Layout::new(self.opt.state_slots(), elem, len, common.multi_precision);
        match self.states.get_mut(key) {
            Some(state) => state.check(key, &layout)?,
            None => {
                let master = layout.master.then(master);
                self.states.insert(key.to_owned(), OptimizerState::new(&layout, master));
            }
        }

        let count = match self.counts.get_mut(key) {
            Some(c) => {
                *c += 1;
                *c
            }
            None => {
                let c = common.begin_num_update + 1;
                self.counts.insert(key.to_owned(), c);
                c
            }
        };
        self.num_update = self.num_update.max(count);

        let base = self.opt.learning_rate();
        let lr = match &common.lr_scheduler {
            Some(s) => s.learning_rate(base, self.num_update),
            None => base,
        };
        Ok(Hyper {
            lr: lr * common.lr_mult.get(param).copied().unwrap_or(1.0),
            wd: common.wd * common.wd_mult.get(param).copied().unwrap_or(1.0),
            t: count,
            rescale: common.rescale_grad,
            clip: common.clip_gradient,
        })
    }

    /// Takes the dense update of a weight of `len` elements of type `elem` under `state_key`
    /// out of the updater, to run on another thread beside other keys'
    /// ([`LentUpdate::apply`]), then come back ([`Updater::give_back`]). Counts, `num_update`
    /// and the learning rate advance here, in the order of the calls, exactly as
    /// [`update_as`](Updater::update_as) calls in that order would advance them (`master`:
    /// the weight widened to f32, asked for a new multi-precision state). Until given back,
    /// the key's state is absent (saving states then leaves it out): give every lent update
    /// back before anything else.
    pub fn lend(
        &mut self,
        param: &str,
        state_key: &str,
        elem: ElemType,
        len: usize,
        master: impl FnOnce() -> Vec<f32>,
    ) -> Result<LentUpdate> {
        self.ensure_valid()?;
        let h = self.prepare(param, state_key, elem, len, master)?;
        let state = self
            .states
            .remove(state_key)
            .ok_or_else(|| Error::StateMismatch { key: state_key.to_owned(), reason: "it is lent out already".to_owned() })?;
        Ok(LentUpdate { key: state_key.to_owned(), h, state })
    }

    /// Puts a lent update's state back (applied or not).
    pub fn give_back(&mut self, lent: LentUpdate) {
        self.states.insert(lent.key, lent.state);
    }

    /// Serialises counts, states and the optimizer description (format in `format.rs`).
    pub fn save_states(&self) -> Vec<u8> {
        format::encode(self, None)
    }

    /// [`save_states`](Updater::save_states) of the states of `keys` only (with their counts
    /// and the updater's `num_update`): one page of a large set of states.
    pub fn save_states_of(&self, keys: &[&str]) -> Vec<u8> {
        format::encode(self, Some(keys))
    }

    /// Adds the counts and states of a file written by [`save_states`](Updater::save_states)
    /// or [`save_states_of`](Updater::save_states_of) to this updater's, replacing those of
    /// the same keys and keeping the others (none with `replace`, which makes this
    /// [`load_states`](Updater::load_states)); `num_update` becomes the larger of both. The
    /// file is checked as `load_states` checks it before anything changes.
    pub fn merge_states(&mut self, bytes: &[u8], replace: bool) -> Result<()> {
        let decoded = format::decode(bytes)?;
        if decoded.optimizer.name() != self.opt.name() {
            return Err(Error::OptimizerMismatch { file: decoded.optimizer.name().to_owned(), current: self.opt.name() });
        }
        format::check_slots(&self.opt, &decoded.states)?;
        if replace {
            self.states.clear();
            self.counts.clear();
            self.num_update = decoded.num_update;
        }
        self.num_update = self.num_update.max(decoded.num_update);
        self.counts.extend(decoded.counts);
        self.states.extend(decoded.states);
        Ok(())
    }

    /// The number of keys with a state.
    pub fn state_count(&self) -> usize {
        self.states.len()
    }

    /// Bytes the state of `key` takes in a state file (its slots and master copy).
    pub fn state_bytes(&self, key: &str) -> usize {
        self.states.get(key).map_or(0, OptimizerState::byte_len)
    }

    /// Restores counts and states saved by [`Updater::save_states`]. The file must come
    /// from the same optimizer (by name) and its slots must fit this optimizer's settings;
    /// the hyper-parameters of this updater are kept (so a resumed run may change them).
    pub fn load_states(&mut self, bytes: &[u8]) -> Result<()> {
        let decoded = format::decode(bytes)?;
        if decoded.optimizer.name() != self.opt.name() {
            return Err(Error::OptimizerMismatch { file: decoded.optimizer.name().to_owned(), current: self.opt.name() });
        }
        format::check_slots(&self.opt, &decoded.states)?;
        self.num_update = decoded.num_update;
        self.counts = decoded.counts;
        self.states = decoded.states;
        Ok(())
    }

    /// An updater restored from a state file, with the optimizer description it contains.
    pub fn from_saved_states(bytes: &[u8]) -> Result<Updater> {
        let decoded = format::decode(bytes)?;
        let mut updater = Updater::try_new(decoded.optimizer)?;
        format::check_slots(&updater.opt, &decoded.states)?;
        updater.num_update = decoded.num_update;
        updater.counts = decoded.counts;
        updater.states = decoded.states;
        Ok(updater)
    }

    /// Writes [`Updater::save_states`] to `path`, atomically: a crash or an error leaves the
    /// previous file whole (see [`crate::durable`]).
    pub fn save_states_to(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let bytes = self.save_states();
        crate::durable::write_atomic(path, |w| w.write_all(&bytes)).map_err(|source| Error::Io {
            action: "write",
            path: path.to_owned(),
            source,
        })
    }

    /// Reads a file written by [`Updater::save_states_to`] and loads it.
    pub fn load_states_from(&mut self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|source| Error::Io { action: "read", path: path.to_owned(), source })?;
        self.load_states(&bytes)
    }
}

/// One key's dense update taken out of an [`Updater`] ([`Updater::lend`]): its state and the
/// hyper-parameters of this step, so that several keys' updates can run on several threads.
#[derive(Debug)]
pub struct LentUpdate {
    key: String,
    h: Hyper,
    state: OptimizerState,
}

impl LentUpdate {
    /// Runs the update (step 5 of the module docs) with the optimizer `opt` of the updater
    /// that lent it.
    pub fn apply(&mut self, opt: &Optimizer, weight: WeightMut<'_>, grad: GradRef<'_>) -> Result<()> {
        check_dtype(&self.key, &weight, &grad)?;
        if weight.len() != grad.len() {
            return Err(Error::LengthMismatch { key: self.key.clone(), weight: weight.len(), grad: grad.len() });
        }
        let layout = Layout::new(opt.state_slots(), weight.elem_type(), weight.len(), opt.common().multi_precision);
        self.state.check(&self.key, &layout)?;
        run(opt, &self.h, weight, GradIn::Dense(grad), &mut self.state);
        Ok(())
    }
}

/// Step 5 of an update: the optimizer's kernel over weight, gradient and state (whose dtypes
/// and lengths were checked).
fn run(opt: &Optimizer, h: &Hyper, weight: WeightMut<'_>, grad: GradIn<'_>, state: &mut OptimizerState) {
    macro_rules! typed {
        ($w:expr, $variant:ident) => {{
            match grad {
                GradIn::Dense(GradRef::$variant(g)) => apply(opt, h, $w, GradLayout::Dense(g), state),
                GradIn::Rows { row_len, rows, data: GradRef::$variant(data) } => {
                    let lazy = lazy_update(opt);
                    let layout = GradLayout::Rows { row_len, rows: &rows, data, lazy };
                    apply(opt, h, $w, layout, state)
                }
                _ => unreachable!("dtypes were checked before the update"),
            }
        }};
    }
    match weight {
        WeightMut::F32(w) => typed!(w, F32),
        WeightMut::F64(w) => typed!(w, F64),
        WeightMut::F16(w) => typed!(w, F16),
        WeightMut::BF16(w) => typed!(w, BF16),
    }
}

fn lazy_update(opt: &Optimizer) -> bool {
    match opt {
        Optimizer::Sgd(p) => p.lazy_update,
        Optimizer::Adam(p) => p.lazy_update,
        Optimizer::AdaGrad(p) => p.lazy_update,
        Optimizer::Ftrl(p) => p.lazy_update,
        _ => false,
    }
}

/// Runs the optimizer on one typed weight.
fn apply<W: Lane>(opt: &Optimizer, h: &Hyper, weight: &mut [W], grad: GradLayout<'_, W>, state: &mut OptimizerState) {
    let dense;
    let grad = match grad {
        GradLayout::Rows { row_len, rows, data, .. } if !opt.supports_row_sparse() => {
            dense = densify(weight.len(), row_len, rows, data);
            GradLayout::Dense(&dense)
        }
        g => g,
    };
    let OptimizerState { slots, master, .. } = state;
    let target = match master.as_mut().and_then(<W::A as Real>::slot_mut) {
        Some(master) => Target::Master { master, out: weight },
        None => Target::InPlace(weight),
    };
    each!(opt, p => p.apply(h, target, &grad, slots));
}

fn check_dtype(key: &str, weight: &WeightMut<'_>, grad: &GradRef<'_>) -> Result<()> {
    if weight.elem_type() != grad.elem_type() {
        return Err(Error::DTypeMismatch { key: key.to_owned(), weight: weight.elem_type(), grad: grad.elem_type() });
    }
    Ok(())
}

/// Validates a row_sparse gradient against a weight of `n` elements.
fn check_rows(key: &str, n: usize, row_len: usize, rows: &[i64], data_len: usize) -> Result<Vec<usize>> {
    if row_len == 0 {
        if n == 0 && rows.is_empty() && data_len == 0 {
            return Ok(Vec::new());
        }
        return Err(Error::sparse(key, "row_len is 0; pass the weight's row length (product of all but the first dimension)"));
    }
    if !n.is_multiple_of(row_len) {
        return Err(Error::sparse(key, format!("the weight has {n} elements, which is not a multiple of row_len {row_len}")));
    }
    let nrows = n / row_len;
    if rows.len().checked_mul(row_len) != Some(data_len) {
        return Err(Error::sparse(
            key,
            format!(
                "{} row ids with row_len {row_len} need {} data elements, got {data_len}",
                rows.len(),
                rows.len().saturating_mul(row_len)
            ),
        ));
    }
    let mut out = Vec::with_capacity(rows.len());
    for &r in rows {
        let Some(r) = usize::try_from(r).ok().filter(|&r| r < nrows) else {
            return Err(Error::sparse(key, format!("row id {r} is outside the weight's rows 0..{nrows}")));
        };
        if let Some(&prev) = out.last() {
            if r <= prev {
                return Err(Error::sparse(key, format!("row ids must be sorted ascending and distinct, but {prev} is followed by {r}")));
            }
        }
        out.push(r);
    }
    Ok(out)
}
