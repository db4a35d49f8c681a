//! A pull answered from the value the server sent back with this worker's last push.
//!
//! In a sync store a key's value changes only when a round completes, and no round after the
//! one this worker's push went into can complete without this worker's next push (a finished
//! worker pulls nothing more). So the value after that round — which a push can ask the
//! server to send back with its acknowledgement (the `PushPull` command, the answer a
//! pushpull gets) — is exactly what a pull of the key answers until this worker pushes it
//! again. A worker that pulls what it pushed (the usual `push(g); pull(w)` step) then gets
//! the pull without another round trip: the push's answer carries the value, and the pull
//! copies it into the outputs without a message.
//!
//! A push asks for its value back only when it pays: in a sync store, a dense key with no
//! compression, when a pull of the key came after its previous push (learned per part, so a
//! job that pushes without pulling never gets values it does not read), and the part is at
//! most [`MAX_BACK_BYTES`] through shared memory, [`MAX_BACK_BYTES_TCP`] over TCP (there a
//! big value's answer costs a copy more than the round trip it saves: it cannot land in
//! outputs not given yet). Each key of a batch decides for itself (the builder puts the keys
//! that ask back into messages of their own). A held value is dropped as the next push
//! or pushpull of its part starts (let go of before the server's next update of it), and
//! taken by the pull that uses it: memory holds at most one copy of the pushed keys, between
//! a push's answer and the pull. A pull uses held values only when every part it reads has
//! one from the part's last counted push; otherwise it asks the servers, as always.

use std::sync::atomic::Ordering;

use super::build::Places;
use super::ops::{Item, Kind};
use super::reply::check_part;
use crate::ps::codec;
use crate::ps::proto::{Chunk, Command, Message};
use crate::ps::Error as DistError;
use crate::StorageType;

/// The largest key part (bytes) whose push asks for its value back, through shared memory
/// (the answer names the server's value in place; the pull copies it out, as its own answer
/// would have been copied).
pub(crate) const MAX_BACK_BYTES: usize = 8 << 20;
/// The same over TCP, where a value sent back is read into a buffer of its own and copied
/// again by the pull (a pull's own answer lands in the outputs): worth it only where the
/// round trip costs more than the copy.
pub(crate) const MAX_BACK_BYTES_TCP: usize = 256 << 10;

/// A value the server answered a push of one key part with.
#[derive(Debug)]
pub(crate) struct Held {
    /// The part's round count once that push was counted: the value is current while the
    /// part's round count is still this.
    pub(crate) round: u64,
    pub(crate) chunk: Chunk,
}

/// Per item, whether a push (`kind`) of `items` asks the servers to send its values back with
/// their acknowledgements: `allowed` (a sync store, `SYNKV_PULL_BACK`) and every part of the
/// item qualifies (module doc); `shares(server)`: whether that server's connection moves bulk
/// bytes through shared memory. Empty when no item does.
pub(crate) fn wants_back(kind: Kind, items: &[Item], allowed: bool, compressing: bool, shares: impl Fn(u32) -> bool) -> Vec<bool> {
    if kind != Kind::Push || !allowed || compressing {
        return Vec::new();
    }
    let wants = |it: &Item| {
        let info = &it.info;
        info.stype == StorageType::Dense
            && it.parts().all(|p| {
                let pulled = info.pulled.get(p).map(|a| a.load(Ordering::Acquire));
                let round = info.rounds.get(p).map(|a| a.load(Ordering::Acquire));
                let slice = info.slices[p];
                let max = if shares(slice.server) { MAX_BACK_BYTES } else { MAX_BACK_BYTES_TCP };
                pulled.is_some() && pulled == round && slice.len * info.dtype.size_of() <= max
            })
    };
    let back: Vec<bool> = items.iter().map(wants).collect();
    if back.contains(&true) {
        back
    } else {
        Vec::new()
    }
}

/// Drops the held values of the parts a push or pushpull of `items` moves (they are stale once
/// it is counted, and would keep the server's value shared).
pub(crate) fn forget(items: &[Item]) {
    for it in items {
        for p in it.parts() {
            if let Some(h) = it.info.held.get(p) {
                h.lock().take();
            }
        }
    }
}

/// Notes that a pull of `items` came after the parts' current round counts (it runs after
/// every push of them it follows): their next push asks for its value back.
pub(crate) fn note_pull(items: &[Item]) {
    for it in items {
        for p in it.parts() {
            if let (Some(pulled), Some(round)) = (it.info.pulled.get(p), it.info.rounds.get(p)) {
                pulled.store(round.load(Ordering::Acquire), Ordering::Release);
            }
        }
    }
}

/// Answers a dense pull of `items` from held values when every part has a current one: the
/// values are copied into every output and taken (`Some(Ok)`); `None` when some part has
/// none (nothing taken: the pull asks the servers).
pub(crate) fn serve(items: &[Item]) -> Option<Result<(), DistError>> {
    let current = |it: &Item, p: usize| {
        let round = it.info.rounds.get(p)?.load(Ordering::Acquire);
        it.info.held.get(p)?.lock().as_ref().is_some_and(|h| h.round == round).then_some(())
    };
    if items.is_empty() || !items.iter().all(|it| it.info.stype == StorageType::Dense && it.parts().all(|p| current(it, p).is_some())) {
        return None;
    }
    for it in items {
        let info = &it.info;
        for p in it.parts() {
            // Checked current above; the pull holds the part's var, so no push took it since.
            let Some(held) = info.held.get(p).and_then(|h| h.lock().take()) else {
                return Some(Err(DistError::Unexpected {
                    peer: "this worker".to_owned(),
                    command: Command::Pull,
                    detail: format!("the value held for key {} part {p} went away during its pull", info.key),
                }));
            };
            let slice = info.slices[p];
            for out in &it.outs {
                let mut st = out.storage_mut();
                if let Some(d) = st.dense_mut() {
                    if let Err(e) = codec::copy_chunk_into(d, slice.offset, slice.len, &held.chunk) {
                        return Some(Err(DistError::Unexpected {
                            peer: "this worker".to_owned(),
                            command: Command::Pull,
                            detail: format!("value of key {} held from its push: {e}", info.key),
                        }));
                    }
                }
            }
        }
    }
    Some(Ok(()))
}

/// Keeps the values a push that asked for them back (`wants_back`) was answered with, one per
/// part of `place` (after the parts' round counts took the push).
pub(crate) fn keep_answers(items: &[Item], place: &Places, reply: &Message) -> Result<(), DistError> {
    let unexpected = |detail: String| DistError::Unexpected { peer: format!("node {}", reply.sender), command: Command::Reply, detail };
    if reply.meta.keys.len() != place.len() || reply.chunks.len() != place.len() {
        return Err(unexpected(format!(
            "{} keys and {} chunks answer a push of {} keys that asked for its values",
            reply.meta.keys.len(),
            reply.chunks.len(),
            place.len()
        )));
    }
    for (j, &(i, part, _)) in place.iter().enumerate() {
        let Some(item) = items.get(i) else { continue };
        let info = &item.info;
        let slice = info.slices[part];
        let chunk = &reply.chunks[j];
        check_part(reply, j, info, part)?;
        if chunk.dtype != codec::dtype_code(info.dtype) || chunk.data.len() != slice.len * info.dtype.size_of() {
            return Err(unexpected(format!(
                "key {}: {} bytes answered for a part of {} {:?} elements",
                info.key,
                chunk.data.len(),
                slice.len,
                info.dtype
            )));
        }
        // Current while the part's round count stays the one this push made it.
        let round = info.rounds.get(part).map_or(0, |r| r.load(Ordering::Acquire));
        if let Some(h) = info.held.get(part) {
            *h.lock() = Some(Held { round, chunk: chunk.clone() });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use smallvec::SmallVec;

    use super::*;
    use crate::ndarray::Buffer;
    use crate::ps::slicer;
    use crate::store::distributed::keys::KeyInfo;
    use crate::store::Key;
    use crate::{DType, NDArray, Shape};

    /// A dense f32 key of `elems` elements over `servers` servers (split from 4 elements on).
    fn key(k: i32, elems: usize, servers: u32) -> Arc<KeyInfo> {
        let slices = slicer::slices(slicer::int_key(k), elems, 1, servers, 4);
        Arc::new(KeyInfo::for_test(Key::Int(k), Shape::from(vec![elems]), DType::F32, StorageType::Dense, slices))
    }

    fn item(info: &Arc<KeyInfo>, outs: &[&NDArray]) -> Item {
        Item {
            info: Arc::clone(info),
            inputs: SmallVec::new(),
            outs: outs.iter().map(|o| (*o).clone()).collect(),
            ids: Vec::new(),
            part: None,
        }
    }

    /// The answer a server gives to a push of every part of `info` that asked for its values:
    /// part `p` holds `p + 1` everywhere.
    fn answer(info: &KeyInfo) -> (Places, Message) {
        let mut m = Message::new(Command::Reply);
        let mut place = Places::new();
        for (p, s) in info.slices.iter().enumerate() {
            m.meta.push_key(info.ps, (s.len * 4) as u64, s.offset as u64);
            m.chunks.push(codec::range_to_chunk(&Buffer::from_vec(vec![(p + 1) as f32; s.len]), 0, s.len));
            place.push((0, p, 0));
        }
        (place, m)
    }

    /// Counts one accepted push of every part, as an answered push does.
    fn counted(info: &KeyInfo) {
        for r in &info.rounds {
            r.fetch_add(1, Ordering::AcqRel);
        }
    }

    fn asks(kind: Kind, items: &[Item], allowed: bool, compressing: bool, shares: impl Fn(u32) -> bool) -> bool {
        let back = wants_back(kind, items, allowed, compressing, shares);
        assert!(back.is_empty() || back.len() == items.len());
        back.first().copied().unwrap_or(false)
    }

    #[test]
    fn a_push_asks_back_only_once_a_pull_followed_the_previous_push() {
        let info = key(1, 8, 1);
        let items = [item(&info, &[])];
        let shm = |_| true;
        assert!(!asks(Kind::Push, &items, true, false, shm), "never pulled");
        note_pull(&items);
        assert!(asks(Kind::Push, &items, true, false, shm), "pulled after the last push");
        assert!(!asks(Kind::Push, &items, false, false, shm), "not allowed (async store, SYNKV_PULL_BACK=0)");
        assert!(!asks(Kind::Push, &items, true, true, shm), "compressed");
        assert!(!asks(Kind::PushPull, &items, true, false, shm), "a pushpull gets its values anyway");
        counted(&info);
        assert!(!asks(Kind::Push, &items, true, false, shm), "pushed again without a pull between");
        note_pull(&items);
        assert!(asks(Kind::Push, &items, true, false, shm));
        // In a batch, each key asks for itself.
        let other = key(9, 8, 1);
        let both = [item(&info, &[]), item(&other, &[])];
        assert_eq!(wants_back(Kind::Push, &both, true, false, shm), [true, false], "the other key was never pulled");
    }

    #[test]
    fn only_parts_small_enough_for_their_transport_ask_back() {
        let elems = MAX_BACK_BYTES_TCP / 4 + 1;
        let info = key(2, elems, 1);
        let items = [item(&info, &[])];
        note_pull(&items);
        assert!(!asks(Kind::Push, &items, true, false, |_| false), "over TCP the copy costs more than the round trip");
        assert!(asks(Kind::Push, &items, true, false, |_| true), "through shared memory");
        let big = key(3, MAX_BACK_BYTES / 4 + 1, 1);
        let items = [item(&big, &[])];
        note_pull(&items);
        assert!(!asks(Kind::Push, &items, true, false, |_| true));
    }

    #[test]
    fn a_pull_is_served_only_when_every_part_holds_its_current_value_and_takes_them() {
        let info = key(4, 8, 2);
        assert_eq!(info.slices.len(), 2);
        let (out, other) = (NDArray::zeros([8]), NDArray::zeros_with([8], DType::F64, crate::Context::cpu(0)));
        let items = [item(&info, &[&out, &other])];
        assert!(serve(&items).is_none(), "nothing held");
        counted(&info);
        let (place, reply) = answer(&info);
        keep_answers(&items, &place, &reply).unwrap();
        serve(&items).expect("served").unwrap();
        let s = info.slices[1].offset;
        let want: Vec<f32> = (0..8).map(|i| if i < s { 1.0 } else { 2.0 }).collect();
        assert_eq!(out.to_vec::<f32>().unwrap(), want);
        assert_eq!(other.to_vec::<f32>().unwrap(), want, "every output, in its own dtype");
        assert!(serve(&items).is_none(), "taken: a second pull asks the servers");

        // One part stale (its round count moved on): nothing is served, nothing taken.
        keep_answers(&items, &place, &reply).unwrap();
        info.rounds[1].fetch_add(1, Ordering::AcqRel);
        assert!(serve(&items).is_none());
        assert!(info.held[0].lock().is_some(), "the current part stays held");
        forget(&items);
        assert!(info.held.iter().all(|h| h.lock().is_none()), "a push drops every held part");
    }

    #[test]
    fn an_answer_that_does_not_match_the_push_is_refused() {
        let info = key(5, 8, 1);
        let items = [item(&info, &[])];
        let (place, mut reply) = answer(&info);
        reply.chunks[0] = codec::range_to_chunk(&Buffer::from_vec(vec![1.0f32; 3]), 0, 3);
        assert!(keep_answers(&items, &place, &reply).is_err(), "wrong length");
        let (place, mut reply) = answer(&info);
        reply.meta.keys[0] += 1;
        assert!(keep_answers(&items, &place, &reply).is_err(), "another key");
        assert!(keep_answers(&items, &place, &Message::new(Command::Reply)).is_err(), "no values");
        assert!(info.held[0].lock().is_none());
    }
}
