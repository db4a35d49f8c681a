//! Per-key optimizer state: named slots (momentum, mean, var, …) and the master copy.
//!
//! A key's state is created lazily on its first update, with every slot zero (as MXNet's
//! `create_state`). Slots hold the compute type: f64 for f64 weights, f32 otherwise. With
//! multi-precision and an f16/bf16 weight the state also holds `weight32`, the f32 master
//! copy initialised from the weight. The layout (slot names, type, length) is fixed by the
//! optimizer and the weight, and checked before every use so that states loaded from a
//! file can never be applied to a weight they do not fit.

use super::error::{Error, Result};
use super::ElemType;

/// Name of the f32 master-weight slot kept with multi-precision.
pub const MASTER_SLOT: &str = "weight32";

/// The state buffer of one slot.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum SlotData {
    F32(Vec<f32>),
    F64(Vec<f64>),
}

impl SlotData {
    pub(crate) fn zeros(dtype: ElemType, len: usize) -> Self {
        match dtype {
            ElemType::F64 => SlotData::F64(vec![0.0; len]),
            _ => SlotData::F32(vec![0.0; len]),
        }
    }

    pub(crate) fn elem_type(&self) -> ElemType {
        match self {
            SlotData::F32(_) => ElemType::F32,
            SlotData::F64(_) => ElemType::F64,
        }
    }

    pub(crate) fn len(&self) -> usize {
        match self {
            SlotData::F32(v) => v.len(),
            SlotData::F64(v) => v.len(),
        }
    }
}

/// The optimizer state of one key.
#[derive(Clone, Debug, PartialEq)]
pub struct OptimizerState {
    pub(crate) slots: Vec<(&'static str, SlotData)>,
    /// Always `SlotData::F32` (kept as `SlotData` so kernels can borrow it generically).
    pub(crate) master: Option<SlotData>,
    pub(crate) dtype: ElemType,
    pub(crate) len: usize,
}

/// What a key's state must look like for a given optimizer and weight.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Layout {
    pub slots: &'static [&'static str],
    pub dtype: ElemType,
    pub len: usize,
    pub master: bool,
}

impl Layout {
    /// The state layout for a weight of `weight` type and `len` elements.
    pub(crate) fn new(slots: &'static [&'static str], weight: ElemType, len: usize, multi_precision: bool) -> Self {
        let low = matches!(weight, ElemType::F16 | ElemType::BF16);
        Layout { slots, dtype: if weight == ElemType::F64 { ElemType::F64 } else { ElemType::F32 }, len, master: multi_precision && low }
    }
}

impl OptimizerState {
    /// Fresh zero state; `master` is the weight widened to f32 when multi-precision applies.
    pub(crate) fn new(layout: &Layout, master: Option<Vec<f32>>) -> Self {
        OptimizerState {
            slots: layout.slots.iter().map(|&name| (name, SlotData::zeros(layout.dtype, layout.len))).collect(),
            master: master.map(SlotData::F32),
            dtype: layout.dtype,
            len: layout.len,
        }
    }

    /// Bytes of its slots and master copy.
    pub fn byte_len(&self) -> usize {
        let slot = |d: &SlotData| match d {
            SlotData::F32(v) => v.len() * 4,
            SlotData::F64(v) => v.len() * 8,
        };
        self.slots.iter().map(|(_, d)| slot(d)).sum::<usize>() + self.master.as_ref().map_or(0, slot)
    }

    /// Number of elements of the weight this state belongs to.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the weight has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Element type of the slots (`F32`, or `F64` for f64 weights).
    pub fn elem_type(&self) -> ElemType {
        self.dtype
    }

    /// Slot names in order (without the master copy).
    pub fn slot_names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.slots.iter().map(|(n, _)| *n)
    }

    /// An f32 slot by name.
    pub fn slot_f32(&self, name: &str) -> Option<&[f32]> {
        self.slots.iter().find(|(n, _)| *n == name).and_then(|(_, d)| match d {
            SlotData::F32(v) => Some(v.as_slice()),
            SlotData::F64(_) => None,
        })
    }

    /// An f64 slot by name.
    pub fn slot_f64(&self, name: &str) -> Option<&[f64]> {
        self.slots.iter().find(|(n, _)| *n == name).and_then(|(_, d)| match d {
            SlotData::F64(v) => Some(v.as_slice()),
            SlotData::F32(_) => None,
        })
    }

    /// The f32 master copy of a multi-precision f16/bf16 weight.
    pub fn master_weight(&self) -> Option<&[f32]> {
        match &self.master {
            Some(SlotData::F32(v)) => Some(v),
            _ => None,
        }
    }

    /// Checks that this state fits `layout`; the error says what differs.
    pub(crate) fn check(&self, key: &str, layout: &Layout) -> Result<()> {
        if self.len != layout.len {
            return Err(Error::state(
                key,
                format!(
                    "the state has {} elements but the weight has {}; the key was re-initialised \
                     with another shape or the states come from another model — drop the \
                     states or restore matching weights",
                    self.len, layout.len
                ),
            ));
        }
        let names: Vec<&str> = self.slot_names().collect();
        if names != layout.slots {
            return Err(Error::state(
                key,
                format!(
                    "the state has slots {names:?} but the optimizer needs {:?}; the optimizer's \
                     hyper-parameters (e.g. momentum 0 vs non-zero, centered) changed",
                    layout.slots
                ),
            ));
        }
        if !self.slots.is_empty() && self.dtype != layout.dtype {
            return Err(Error::state(key, format!("the state is {} but a weight of this type needs {} states", self.dtype, layout.dtype)));
        }
        if self.master.is_some() != layout.master {
            return Err(Error::state(
                key,
                if layout.master {
                    "multi_precision is on but the state has no f32 master copy (it was created \
                     with multi_precision off or for an f32/f64 weight)"
                } else {
                    "the state has an f32 master copy but multi_precision is off or the weight \
                     is not f16/bf16"
                },
            ));
        }
        Ok(())
    }

    /// Mutable views of the first `K` slots as `A` (the layout was checked before).
    pub(crate) fn slots_mut<'a, A: super::kernel::Real, const K: usize>(slots: &'a mut [(&'static str, SlotData)]) -> [&'a mut [A]; K] {
        let views: Vec<&mut [A]> = slots.iter_mut().filter_map(|(_, d)| A::slot_mut(d)).collect();
        match views.try_into() {
            Ok(views) => views,
            Err(v) => unreachable!("state layout is checked before use; expected {K} slots of {}, found {}", A::ELEM, v.len()),
        }
    }
}
