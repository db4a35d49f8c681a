//! Where each server partition lives, and where its backup copy lives, as servers die
//! (`SYNKV_SERVER_REPLICAS=1`). Every node computes it from the same facts — the number of
//! servers and the set of dead ones, which the scheduler announces in order — so all agree
//! without asking one another.
//!
//! A *partition* is the set of key parts the slicer places on server rank `p` (there are
//! `DMLC_NUM_SERVER` of them, for good). The servers form a ring by rank. Partition `p` is
//! *held* (served) by the first live server at or after `p` in the ring, and *backed up* by
//! the next live server after its holder. So at the start server `r` holds partition `r` and
//! backs up partition `r − 1`; when `r` dies, its backup `r + 1` holds `r` from then on, and
//! `r + 2` becomes the backup of both (and `r + 1` the backup of `r − 1`).

use std::collections::BTreeSet;

/// The placement of partitions on live servers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Topology {
    num_servers: u32,
    dead: BTreeSet<u32>,
}

impl Topology {
    /// Every one of `num_servers` servers alive.
    pub fn new(num_servers: u32) -> Topology {
        Topology { num_servers, dead: BTreeSet::new() }
    }

    /// Number of servers (and partitions).
    pub fn num_servers(&self) -> u32 {
        self.num_servers
    }

    /// Records the death of server `rank`. Returns whether it was alive.
    pub fn kill(&mut self, rank: u32) -> bool {
        rank < self.num_servers && self.dead.insert(rank)
    }

    /// Whether server `rank` is alive.
    pub fn alive(&self, rank: u32) -> bool {
        rank < self.num_servers && !self.dead.contains(&rank)
    }

    /// The live servers, by rank.
    pub fn live(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.num_servers).filter(|r| !self.dead.contains(r))
    }

    /// The first live server strictly after `rank` in the ring, other than `rank`.
    fn next_live(&self, rank: u32) -> Option<u32> {
        (1..self.num_servers).map(|i| (rank + i) % self.num_servers).find(|r| self.alive(*r))
    }

    /// The server holding partition `p`: the first live server at or after `p`.
    pub fn holder(&self, p: u32) -> Option<u32> {
        if p >= self.num_servers {
            return None;
        }
        (0..self.num_servers).map(|i| (p + i) % self.num_servers).find(|r| self.alive(*r))
    }

    /// The server keeping partition `p`'s backup copy: the next live server after its holder.
    pub fn backup(&self, p: u32) -> Option<u32> {
        self.next_live(self.holder(p)?)
    }

    /// The partitions server `rank` holds.
    pub fn held_by(&self, rank: u32) -> Vec<u32> {
        (0..self.num_servers).filter(|p| self.holder(*p) == Some(rank)).collect()
    }

    /// The partitions server `rank` keeps backups of.
    pub fn backed_up_by(&self, rank: u32) -> Vec<u32> {
        (0..self.num_servers).filter(|p| self.backup(*p) == Some(rank)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_the_start_each_server_holds_its_partition_and_backs_up_the_previous_one() {
        let t = Topology::new(3);
        for r in 0..3 {
            assert_eq!(t.holder(r), Some(r));
            assert_eq!(t.backup(r), Some((r + 1) % 3));
            assert_eq!(t.held_by(r), vec![r]);
            assert_eq!(t.backed_up_by(r), vec![(r + 2) % 3]);
        }
        assert_eq!(t.holder(3), None);
    }

    #[test]
    fn a_dead_servers_partition_moves_to_its_backup_and_backups_move_along_the_ring() {
        let mut t = Topology::new(3);
        assert!(t.kill(1));
        assert!(!t.kill(1), "a second death of the same server changes nothing");
        assert_eq!(t.holder(1), Some(2), "the backup of partition 1 holds it");
        assert_eq!(t.held_by(2), vec![1, 2]);
        assert_eq!(t.backup(1), Some(0));
        assert_eq!(t.backup(2), Some(0));
        assert_eq!(t.backup(0), Some(2), "server 0's backup was the dead one: the next live server");
        assert_eq!(t.backed_up_by(0), vec![1, 2]);
        // The last server alive holds everything, with no backup.
        assert!(t.kill(0));
        assert_eq!(t.held_by(2), vec![0, 1, 2]);
        assert_eq!(t.backup(0), None);
        assert!(t.kill(2));
        assert_eq!(t.holder(0), None);
    }

    #[test]
    fn two_servers_back_up_each_other() {
        let mut t = Topology::new(2);
        assert_eq!((t.backup(0), t.backup(1)), (Some(1), Some(0)));
        t.kill(0);
        assert_eq!((t.holder(0), t.holder(1), t.backup(0)), (Some(1), Some(1), None));
    }
}
