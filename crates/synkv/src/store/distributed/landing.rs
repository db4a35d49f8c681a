//! Where a pull's answers land: each answered part's bytes go from the socket straight into
//! the output (issue 13 item 2, `ps::transport::landing`), instead of into the reader's buffer
//! and then, copied, into the output.
//!
//! An operation's dense outputs are loaned for writing (`ndarray::loan_ranges`: the data lock
//! held until the operation lets go) as one `Dest` per answered part,
//! and each message's parts make its [`Landing`]. Every write into a loaned output then goes
//! through its `Dest`s — by the reader, or by [`write_back`](super::reply::write_back) when an
//! answer did not land (shared memory, another layout) — since the loan excludes every other
//! writer, this operation's included.
//!
//! An output lands only when it is its item's first output, of the key's dtype, and no other
//! output or input of the operation is the same array (a loan never waits, and a second
//! writer would). A message lands only when every part it carries does; an item with a part
//! in a message that does not land is not loaned at all.

use std::ops::Range;
use std::sync::Arc;

use rustc_hash::FxHashMap;

use super::build::Places;
use super::ops::{Item, Kind};
use crate::ndarray::loan_ranges;
use crate::ps::codec;
use crate::ps::proto::Message;
use crate::ps::transport::{Landing, Target};
use crate::{NDArray, StorageType};

/// Per message, its landing (`None`: the answer is read into the buffer and copied as before).
pub(crate) fn landings(kind: Kind, items: &[Item], msgs: &[(u32, Message)], places: &[Places]) -> Vec<Option<Arc<Landing>>> {
    let none = || vec![None; msgs.len()];
    if !matches!(kind, Kind::Pull | Kind::PushPull) {
        return none();
    }
    // How often each array is an output or an input of this operation.
    let mut uses: FxHashMap<usize, usize> = FxHashMap::default();
    for it in items {
        for a in it.outs.iter().chain(&it.inputs) {
            *uses.entry(a.identity()).or_default() += 1;
        }
    }
    let mut landable: Vec<bool> = items
        .iter()
        .map(|it| {
            it.info.stype == StorageType::Dense
                && it.outs.first().is_some_and(|o| o.dtype() == it.info.dtype && uses.get(&o.identity()) == Some(&1))
        })
        .collect();
    // A message lands only if all its parts do; an item lands only if all its messages do.
    let mut lands: Vec<bool> = vec![false; msgs.len()];
    loop {
        for (m, place) in places.iter().enumerate() {
            lands[m] = !place.is_empty() && place.iter().all(|&(i, _, _)| landable[i]);
        }
        let mut changed = false;
        for (m, place) in places.iter().enumerate() {
            if !lands[m] {
                for &(i, _, _) in place {
                    changed |= std::mem::replace(&mut landable[i], false);
                }
            }
        }
        if !changed {
            break;
        }
    }
    if !lands.iter().any(|l| *l) {
        return none();
    }
    // Per landing item, its parts' byte ranges in the output, with the (message, index) each
    // answers to.
    let mut parts: FxHashMap<usize, Vec<(usize, usize, Range<usize>)>> = FxHashMap::default();
    for (m, place) in places.iter().enumerate().filter(|(m, _)| lands[*m]) {
        for (j, &(i, part, _)) in place.iter().enumerate() {
            let info = &items[i].info;
            let Some(s) = info.slices.get(part) else { return none() };
            let es = info.dtype.size_of() * info.unit();
            parts.entry(i).or_default().push((m, j, s.offset * es..(s.offset + s.len) * es));
        }
    }
    let mut targets: Vec<Vec<Option<Box<dyn Target>>>> = places.iter().map(|p| (0..p.len()).map(|_| None).collect()).collect();
    for (i, ps) in parts {
        let out: &NDArray = &items[i].outs[0];
        let ranges: Vec<Range<usize>> = ps.iter().map(|(_, _, r)| r.clone()).collect();
        // A busy lock (never expected: the engine holds the output's var) lands nothing.
        let Some(dests) = loan_ranges(out, &ranges) else { return none() };
        for ((m, j, _), dest) in ps.into_iter().zip(dests) {
            targets[m][j] = Some(Box::new(dest));
        }
    }
    targets
        .into_iter()
        .zip(places)
        .zip(lands)
        .map(|((t, place), lands)| {
            if !lands {
                return None;
            }
            let chunks: Option<Vec<_>> =
                t.into_iter().zip(place).map(|(t, &(i, _, _))| Some((codec::dtype_code(items[i].info.dtype), t?))).collect();
            chunks.map(|c| Arc::new(Landing::new(c)))
        })
        .collect()
}
