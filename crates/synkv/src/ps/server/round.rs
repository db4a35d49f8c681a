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
//!
//! A worker restarted into a running sync job (`SYNKV_WORKER_RESTARTS=1`) *rejoins* each entry
//! at a round it names ([`Round::rejoin`]): it takes part in no round below it and in every
//! round from it on, whatever this server has heard of its death and return so far. Each server
//! learns of both at its own time, so without this the rounds of one key's parts on different
//! servers could complete with and without the dead worker differently; the rejoining worker
//! reads every part's round id first and names the same round for all parts of a key
//! (`store/distributed/init.rs`), so the parts stay in step. The *hold* this leaves on an entry
//! is replicated to the partition's backup with the reply to the rejoin waiting for it
//! (`partition/replica.rs`, kind `HOLDS`, and in snapshots), so a backup promoted while a part
//! still lags expects the rejoined worker's pushes where its primary did.

use std::collections::BTreeSet;

use tokio::time::Instant;

use super::entry::{Checked, Part};
use super::error::ServerError;
use crate::ndarray::RowSparse;
use crate::ps::cluster::Absent;
use crate::ps::node::Rank;
use crate::ps::proto::ErrorCode;

/// A request: (connection, request id).
pub(super) type ReqId = (u64, u64);

/// A push waiting for a later round.
pub(super) struct Contribution {
    pub(super) worker: Rank,
    /// The round it belongs to.
    pub(super) round: u64,
    pub(super) req: ReqId,
    pub(super) slot: usize,
    pub(super) value: Checked,
}

/// Where a push goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Place {
    /// Into the round being collected.
    Now,
    /// Into a later round (this worker already pushed in the current one, or rejoined at a
    /// later one).
    Later(u64),
}

/// Where a rejoined worker joined an entry's rounds ([`Round::rejoin`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(super) struct Hold {
    pub(super) worker: Rank,
    /// The first round it takes part in; it skips the ones before.
    pub(super) from: u64,
    /// [`Absent::moves`] when it rejoined.
    pub(super) moves: u64,
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
    /// Pushes for later rounds, at most one per worker.
    pub(super) next: Vec<Contribution>,
    /// Rejoined workers (rarely any): they skip the rounds below `from`, and rounds from
    /// `from` on wait for them until a later move says they left again.
    pub(super) holds: Vec<Hold>,
    /// When the first push of this round arrived.
    pub(super) started: Option<Instant>,
    /// A push that could not be folded: the round fails with it when it completes.
    pub(super) failed: Option<ServerError>,
}

impl Round {
    /// The round id worker `worker`'s next push must carry: after the rounds it pushed to
    /// (open or queued), and not below the round it rejoined at.
    pub(super) fn expected(&self, worker: Rank) -> u64 {
        if let Some(queued) = self.next.iter().filter(|c| c.worker == worker).map(|c| c.round).max() {
            return queued.saturating_add(1);
        }
        if self.contributors.contains(&worker) {
            return self.id + 1;
        }
        self.hold(worker).map_or(self.id, |h| h.from.max(self.id))
    }

    pub(super) fn hold(&self, worker: Rank) -> Option<&Hold> {
        self.holds.iter().find(|h| h.worker == worker)
    }

    /// Sets `hold` as its worker's only one (a backup copy taking its primary's).
    pub(super) fn set_hold(&mut self, hold: Hold) {
        self.holds.retain(|h| h.worker != hold.worker);
        self.holds.push(hold);
    }

    /// Where worker `worker`'s push with round id `round` goes, or why it is refused.
    pub(super) fn place(&self, worker: Rank, round: Option<u64>, name: &str) -> Result<Place, ServerError> {
        let expected = self.expected(worker);
        let round = round.unwrap_or(expected);
        if round < expected {
            return Err(ServerError::new(
                ErrorCode::DuplicatePush,
                format!("push of key {name} with round id {round} from worker rank {worker} was counted already (a retry or a duplicate), or is below the round that worker rejoined at; it is not applied twice"),
            ));
        }
        let queued = self.next.iter().any(|c| c.worker == worker);
        if round > expected || (round > self.id && queued) {
            return Err(ServerError::new(
                ErrorCode::RoundGap,
                format!(
                    "push of key {name} with round id {round} from worker rank {worker}, but round {} is being collected and this worker's push to it has not arrived (a push was lost)",
                    self.id
                ),
            ));
        }
        Ok(if round == self.id { Place::Now } else { Place::Later(round) })
    }

    /// Worker `worker` rejoins at round `from`: it skips the rounds below and takes part in the
    /// rounds from it on. Returns the round id its next push must carry — `from`, unless it
    /// pushed past `from` already or this server completed rounds past `from` without it (then
    /// the caller names a later round). Either way the rounds from the returned one on wait
    /// for it from now on.
    pub(super) fn rejoin(&mut self, worker: Rank, from: u64, moves: u64) -> u64 {
        let pushed = self.contributors.contains(&worker) || self.next.iter().any(|c| c.worker == worker);
        // A worker with pushes in the open rounds skips none of them.
        let from = if pushed { self.id } else { from.max(self.id) };
        self.set_hold(Hold { worker, from, moves });
        self.expected(worker)
    }

    /// Whether this round need not wait for `worker`.
    fn absent(&self, worker: Rank, absent: &Absent) -> bool {
        match self.hold(worker) {
            Some(h) if self.id < h.from => true,
            Some(h) if h.moves == absent.moves => false,
            _ => absent.ranks.contains(&worker),
        }
    }

    /// Whether every worker that has not finished has pushed in this round (and someone has).
    pub(super) fn complete(&self, num_workers: usize, absent: &Absent) -> bool {
        if self.contributors.is_empty() {
            return false;
        }
        if self.holds.is_empty() {
            let done = &absent.ranks;
            return self.contributors.len() + done.iter().filter(|d| !self.contributors.contains(d)).count() >= num_workers;
        }
        let n = u32::try_from(num_workers).unwrap_or(u32::MAX);
        (0..n).all(|w| self.contributors.contains(&w) || self.absent(w, absent))
    }

    /// The workers this round still waits for.
    pub(super) fn missing(&self, num_workers: u32, absent: &Absent) -> Vec<Rank> {
        (0..num_workers).filter(|r| !self.contributors.contains(r) && !self.absent(*r, absent)).collect()
    }

    /// Forgets the holds that no longer change anything: from round `from` on, a hold set
    /// before the latest move, or one for a worker the scheduler counts as present, decides
    /// nothing [`Absent`] does not.
    pub(super) fn prune_holds(&mut self, absent: &Absent) {
        let id = self.id;
        self.holds.retain(|h| id < h.from || (h.moves == absent.moves && absent.ranks.contains(&h.worker)));
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
        assert_eq!(r.place(0, Some(1), "k"), Ok(Place::Later(1)));
        assert_eq!(r.place(0, None, "k"), Ok(Place::Later(1)));
        assert_eq!(r.place(0, Some(2), "k").unwrap_err().code, ErrorCode::RoundGap);
        assert_eq!(r.place(1, Some(1), "k").unwrap_err().code, ErrorCode::RoundGap, "worker 1 has not pushed round 0 yet");
        r.id = 5;
        r.contributors.clear();
        assert_eq!(r.place(1, Some(4), "k").unwrap_err().code, ErrorCode::DuplicatePush);
    }

    #[test]
    fn finished_workers_do_not_hold_a_round() {
        let mut r = Round::default();
        let none = Absent::default();
        r.contributors.insert(1);
        assert!(!r.complete(2, &none));
        assert_eq!(r.missing(2, &none), vec![0]);
        let done = Absent::new([0], 1);
        assert!(r.complete(2, &done));
        assert!(r.missing(2, &done).is_empty());
        assert!(!Round::default().complete(2, &done), "a round nobody pushed to is not complete");
    }

    /// A worker that rejoins at round `from` skips the rounds below it and is waited for from
    /// it on, whatever the server has heard of its death and return; a later move (it died
    /// again, or finished) ends the hold.
    #[test]
    fn a_rejoined_worker_skips_the_rounds_below_its_round_and_is_waited_for_from_it_on() {
        let mut r = Round { id: 3, ..Round::default() };
        r.contributors.insert(0);
        // Worker 1 died (move 1) but this server has not heard yet: round 3 waits for it.
        let before = Absent::default();
        assert!(!r.complete(2, &before));
        // Its successor rejoins at round 4 (another part of the key completed round 3 without
        // it): round 3 completes without it, and its push of round 4 is queued.
        assert_eq!(r.rejoin(1, 4, 0), 4);
        assert_eq!(r.expected(1), 4);
        assert!(r.complete(2, &before), "round 3 no longer waits for worker 1");
        assert_eq!(r.place(1, Some(3), "k").unwrap_err().code, ErrorCode::DuplicatePush, "below the round it rejoined at");
        assert_eq!(r.place(1, Some(5), "k").unwrap_err().code, ErrorCode::RoundGap);
        assert_eq!(r.place(1, Some(4), "k"), Ok(Place::Later(4)));
        // Round 4 waits for it even while this server still counts it away (the news of its
        // death arrived, the news of its return not yet: no move since it rejoined).
        r.id = 4;
        r.contributors.clear();
        r.contributors.insert(0);
        let away = Absent::new([1], 0);
        assert!(!r.complete(2, &away));
        assert_eq!(r.missing(2, &away), vec![1]);
        r.prune_holds(&away);
        assert_eq!(r.holds.len(), 1, "the hold still decides");
        // It died again (a later move while counted away): no longer waited for.
        let again = Absent::new([1], 1);
        assert!(r.complete(2, &again));
        r.prune_holds(&again);
        assert!(r.holds.is_empty());
        // Rejoining below a round it pushed to, or below a round completed without it, names
        // the round its next push must carry instead.
        let mut r = Round { id: 6, ..Round::default() };
        assert_eq!(r.rejoin(1, 5, 0), 6);
        r.contributors.insert(0);
        assert!(!r.complete(2, &Absent::new([1], 0)), "held from round 6 on");
        r.contributors.insert(1);
        assert_eq!(r.rejoin(1, 6, 0), 7);
        assert_eq!(r.holds, vec![Hold { worker: 1, from: 6, moves: 0 }], "it skips none of the rounds it pushed to");
        // Two rounds ahead: the skipped rounds complete without it, its push waits in the queue.
        let mut r = Round::default();
        r.contributors.insert(0);
        assert_eq!(r.rejoin(1, 2, 0), 2);
        assert_eq!(r.place(1, Some(2), "k"), Ok(Place::Later(2)));
        assert!(r.complete(2, &Absent::default()));
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
