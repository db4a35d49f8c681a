//! Optimizer states of keys split into slices: joining and cutting them.
//!
//! A distributed store splits a big key over several servers, each running its own
//! [`Updater`] on its slice. To save the states in one file — the same format and content as a
//! local store's, so the file works with either — the worker joins the slices of each key
//! ([`OptimizerState::concat`]) into one updater; to load a file it cuts each key's state back
//! into slices ([`OptimizerState::slice`]). Element-wise optimizers make this exact: a slice's
//! state is the same slice of the whole key's state.

use super::error::{Error, Result};
use super::state::{OptimizerState, SlotData};
use super::updater::Updater;

fn slice_slot(d: &SlotData, off: usize, len: usize) -> Option<SlotData> {
    Some(match d {
        SlotData::F32(v) => SlotData::F32(v.get(off..off.checked_add(len)?)?.to_vec()),
        SlotData::F64(v) => SlotData::F64(v.get(off..off.checked_add(len)?)?.to_vec()),
    })
}

fn append_slot(into: &mut SlotData, from: &SlotData) -> bool {
    match (into, from) {
        (SlotData::F32(a), SlotData::F32(b)) => a.extend_from_slice(b),
        (SlotData::F64(a), SlotData::F64(b)) => a.extend_from_slice(b),
        _ => return false,
    }
    true
}

impl OptimizerState {
    /// The state of elements `[off, off + len)` of the weight; `None` if out of range.
    pub fn slice(&self, off: usize, len: usize) -> Option<OptimizerState> {
        let slots = self.slots.iter().map(|(n, d)| slice_slot(d, off, len).map(|d| (*n, d))).collect::<Option<Vec<_>>>()?;
        let master = match &self.master {
            Some(m) => Some(slice_slot(m, off, len)?),
            None => None,
        };
        if off.checked_add(len)? > self.len {
            return None;
        }
        Some(OptimizerState { slots, master, dtype: self.dtype, len })
    }

    /// The states of consecutive slices of one weight, joined in order. They must have the
    /// same slots, element type and master copy; `key` names the key in the error.
    pub fn concat(key: &str, parts: &[&OptimizerState]) -> Result<OptimizerState> {
        let Some((first, rest)) = parts.split_first() else {
            return Err(Error::state(key, "no slices to join"));
        };
        let mut out = (*first).clone();
        for p in rest {
            let names_match = p.slots.len() == out.slots.len() && p.slots.iter().zip(&out.slots).all(|(a, b)| a.0 == b.0);
            if !names_match || p.dtype != out.dtype || p.master.is_some() != out.master.is_some() {
                return Err(Error::state(key, "the slices' states differ in slots, type or master copy"));
            }
            for ((_, into), (_, from)) in out.slots.iter_mut().zip(&p.slots) {
                if !append_slot(into, from) {
                    return Err(Error::state(key, "the slices' states differ in element type"));
                }
            }
            if let (Some(into), Some(from)) = (out.master.as_mut(), p.master.as_ref()) {
                if !append_slot(into, from) {
                    return Err(Error::state(key, "the slices' master copies differ in element type"));
                }
            }
            out.len += p.len;
        }
        Ok(out)
    }
}

impl Updater {
    /// Installs `state` as the state of `key`, with update count `count` (`None`: none yet);
    /// `num_update` becomes at least `count`. The state is checked against the weight at the
    /// key's next update.
    pub fn set_state(&mut self, key: &str, state: OptimizerState, count: Option<u64>) {
        self.states.insert(key.to_owned(), state);
        match count {
            Some(c) => {
                self.counts.insert(key.to_owned(), c);
                self.num_update = self.num_update.max(c);
            }
            None => {
                self.counts.remove(key);
            }
        }
    }

    /// Raises `num_update` to at least `n` (schedulers are evaluated at `num_update`).
    pub fn raise_num_update(&mut self, n: u64) {
        self.num_update = self.num_update.max(n);
    }

    /// The keys that have a state.
    pub fn state_keys(&self) -> impl Iterator<Item = &str> {
        self.states.keys().map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use crate::optimizer::{GradRef, Optimizer, Sgd, Updater, WeightMut};

    #[test]
    fn slices_of_a_state_join_back_and_update_like_the_whole() {
        let opt = Optimizer::from(Sgd { momentum: 0.9, ..Sgd::default() }).with_learning_rate(0.1);
        let mut whole = Updater::try_new(opt.clone()).unwrap();
        let mut w = vec![1.0f32; 6];
        let g: Vec<f32> = (0..6).map(|i| i as f32).collect();
        whole.update("k", WeightMut::F32(&mut w), GradRef::F32(&g)).unwrap();
        let st = whole.state("k").unwrap();
        let (a, b) = (st.slice(0, 2).unwrap(), st.slice(2, 4).unwrap());
        assert!(st.slice(5, 2).is_none());
        let joined = super::OptimizerState::concat("k", &[&a, &b]).unwrap();
        assert_eq!(&joined, st);

        // Two updaters on the halves continue exactly like the whole one.
        let mut left = Updater::try_new(opt.clone()).unwrap();
        left.set_state("k", a, whole.update_count("k"));
        let mut right = Updater::try_new(opt).unwrap();
        right.set_state("k", b, whole.update_count("k"));
        let (mut wl, mut wr) = (w[..2].to_vec(), w[2..].to_vec());
        whole.update("k", WeightMut::F32(&mut w), GradRef::F32(&g)).unwrap();
        left.update("k", WeightMut::F32(&mut wl), GradRef::F32(&g[..2])).unwrap();
        right.update("k", WeightMut::F32(&mut wr), GradRef::F32(&g[2..])).unwrap();
        wl.extend(wr);
        assert_eq!(wl, w);
        assert_eq!(left.update_count("k"), Some(2));
    }
}
