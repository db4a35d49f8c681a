//! [`Round`]: the sync round of one entry — who has pushed, what is held, who waits — and the
//! round-id rules that make a retried or duplicated push harmless.
//!
//! Every push of an entry carries a round id: the worker's count of its earlier accepted
//! pushes of that entry. In sync mode a worker's `r`-th push belongs to round `r` (every worker
//! pushes each entry once per round), so the server places it without counting requests
//! (spec K12.10 fixed): round `id` (the one being collected) if the worker has not pushed in
//! it, round `id + 1` (queued) if it has. Anything else is refused and changes nothing:
//! an id already counted is a [`DuplicatePush`](crate::ps::proto::ErrorCode::DuplicatePush)
//! (a retry of a push that was applied), an id further ahead is a
//! [`RoundGap`](crate::ps::proto::ErrorCode::RoundGap) (a push was lost). In async mode each
//! worker's ids must simply follow one another. A push without a round id (an old or
//! hand-written client) takes the next one.
//!
//! A round completes when every worker that has not finished has pushed (finished workers
//! contribute nothing, like Horovod's `join`), so uneven last epochs end instead of hanging.

use std::collections::BTreeSet;

use tokio::time::Instant;

use super::entry::{Checked, Part};
use super::error::ServerError;
use crate::ndarray::RowSparse;
use crate::ps::node::Rank;
use crate::ps::proto::ErrorCode;

/// A request: (connection, request id).
pub(super) type ReqId = (u64, u64);

/// A push waiting for the next round.
pub(super) struct Contribution {
    pub(super) worker: Rank,
    pub(super) req: ReqId,
    pub(super) slot: usize,
    pub(super) value: Checked,
}

/// Where a push goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Place {
    /// Into the round being collected.
    Now,
    /// Into the next round (this worker already pushed in the current one).
    Next,
}

/// The sync round of one entry.
#[derive(Default)]
pub(super) struct Round {
    /// The id of the round being collected (how many rounds completed).
    pub(super) id: u64,
    /// Workers counted in this round.
    pub(super) contributors: BTreeSet<Rank>,
    /// Dense pushes not folded into the accumulator yet.
    pub(super) held: Vec<Part>,
    /// Bytes of `held`.
    pub(super) held_bytes: usize,
    /// Whether the entry's accumulator holds earlier pushes of this round.
    pub(super) accumulated: bool,
    /// Row_sparse pushes of this round.
    pub(super) rows: Vec<RowSparse>,
    /// Requests waiting for this round, with the key's position in each request.
    pub(super) waiting: Vec<(ReqId, usize)>,
    /// Pushes for round `id + 1`, at most one per worker.
    pub(super) next: Vec<Contribution>,
    /// When the first push of this round arrived.
    pub(super) started: Option<Instant>,
    /// A push that could not be folded: the round fails with it when it completes.
    pub(super) failed: Option<ServerError>,
}

impl Round {
    /// Where worker `worker`'s push with round id `round` goes, or why it is refused.
    pub(super) fn place(&self, worker: Rank, round: Option<u64>, name: &str) -> Result<Place, ServerError> {
        let pushed_now = self.contributors.contains(&worker);
        let queued = self.next.iter().any(|c| c.worker == worker);
        let round = match round {
            Some(r) => r,
            None if !pushed_now => self.id,
            None => self.id + 1,
        };
        if round < self.id || (round == self.id && pushed_now) || (round == self.id + 1 && queued) {
            return Err(ServerError::new(
                ErrorCode::DuplicatePush,
                format!("push of key {name} with round id {round} from worker rank {worker} was counted already (a retry or a duplicate); it is not applied twice"),
            ));
        }
        if round > self.id + 1 || (round == self.id + 1 && !pushed_now) {
            return Err(ServerError::new(
                ErrorCode::RoundGap,
                format!(
                    "push of key {name} with round id {round} from worker rank {worker}, but round {} is being collected and this worker's push to it has not arrived (a push was lost)",
                    self.id
                ),
            ));
        }
        Ok(if round == self.id { Place::Now } else { Place::Next })
    }

    /// Whether every worker that has not finished has pushed in this round (and someone has).
    pub(super) fn complete(&self, num_workers: usize, done: &BTreeSet<Rank>) -> bool {
        !self.contributors.is_empty()
            && self.contributors.len() + done.iter().filter(|d| !self.contributors.contains(d)).count() >= num_workers
    }

    /// The workers this round still waits for.
    pub(super) fn missing(&self, num_workers: u32, done: &BTreeSet<Rank>) -> Vec<Rank> {
        (0..num_workers).filter(|r| !self.contributors.contains(r) && !done.contains(r)).collect()
    }
}

/// Async mode: checks worker `worker`'s round id against the one expected from it, and counts
/// the push (`next` holds the next id expected from each rank).
pub(super) fn take_async(next: &mut Vec<u64>, worker: Rank, round: Option<u64>, name: &str) -> Result<(), ServerError> {
    let i = usize::try_from(worker).unwrap_or(usize::MAX);
    if next.len() <= i {
        next.resize(i.saturating_add(1), 0);
    }
    let expected = next[i];
    let round = round.unwrap_or(expected);
    if round < expected {
        return Err(ServerError::new(
            ErrorCode::DuplicatePush,
            format!("push of key {name} with round id {round} from worker rank {worker} was applied already (a retry or a duplicate); it is not applied twice"),
        ));
    }
    if round > expected {
        return Err(ServerError::new(
            ErrorCode::RoundGap,
            format!("push of key {name} with round id {round} from worker rank {worker}, but its push {expected} has not arrived (a push was lost)"),
        ));
    }
    next[i] = expected + 1;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_ids_place_pushes_and_refuse_duplicates_and_gaps() {
        let mut r = Round::default();
        assert_eq!(r.place(0, Some(0), "k"), Ok(Place::Now));
        assert_eq!(r.place(0, None, "k"), Ok(Place::Now));
        r.contributors.insert(0);
        assert_eq!(r.place(0, Some(0), "k").unwrap_err().code, ErrorCode::DuplicatePush);
        assert_eq!(r.place(0, Some(1), "k"), Ok(Place::Next));
        assert_eq!(r.place(0, None, "k"), Ok(Place::Next));
        assert_eq!(r.place(0, Some(2), "k").unwrap_err().code, ErrorCode::RoundGap);
        assert_eq!(r.place(1, Some(1), "k").unwrap_err().code, ErrorCode::RoundGap, "worker 1 has not pushed round 0 yet");
        r.id = 5;
        r.contributors.clear();
        assert_eq!(r.place(1, Some(4), "k").unwrap_err().code, ErrorCode::DuplicatePush);
    }

    #[test]
    fn finished_workers_do_not_hold_a_round() {
        let mut r = Round::default();
        let none = BTreeSet::new();
        r.contributors.insert(1);
        assert!(!r.complete(2, &none));
        assert_eq!(r.missing(2, &none), vec![0]);
        let done: BTreeSet<Rank> = [0].into();
        assert!(r.complete(2, &done));
        assert!(r.missing(2, &done).is_empty());
        assert!(!Round::default().complete(2, &done), "a round nobody pushed to is not complete");
    }

    #[test]
    fn async_ids_follow_one_another_per_worker() {
        let mut next = Vec::new();
        take_async(&mut next, 1, Some(0), "k").unwrap();
        take_async(&mut next, 1, None, "k").unwrap();
        assert_eq!(take_async(&mut next, 1, Some(1), "k").unwrap_err().code, ErrorCode::DuplicatePush);
        assert_eq!(take_async(&mut next, 1, Some(5), "k").unwrap_err().code, ErrorCode::RoundGap);
        take_async(&mut next, 0, Some(0), "k").unwrap();
        assert_eq!(next, vec![1, 2]);
    }
}
