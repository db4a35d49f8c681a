//! Node identity: [`Role`], [`NodeId`], [`Rank`], [`Node`] and barrier [`Group`]s.
//!
//! Ids follow ps-lite (spec K8.5) so logs read the same as MXNet's: the scheduler is id 1, the
//! server of rank `r` is `8 + 2r`, the worker of rank `r` is `9 + 2r`; id 0 means "not assigned
//! yet" (a node before rendezvous). Groups are bit sets: scheduler 1, servers 2, workers 4.
//!
//! This module holds plain values only; it knows nothing about sockets or frames.

use std::fmt;
use std::str::FromStr;

/// A process's role in the cluster (`DMLC_ROLE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Role {
    /// The single rendezvous, barrier and heartbeat coordinator.
    Scheduler,
    /// Holds key shards and applies updates.
    Server,
    /// Pushes gradients and pulls weights.
    Worker,
}

impl Role {
    /// The `DMLC_ROLE` spelling (`scheduler`, `server`, `worker`).
    pub const fn as_str(self) -> &'static str {
        match self {
            Role::Scheduler => "scheduler",
            Role::Server => "server",
            Role::Worker => "worker",
        }
    }

    /// The wire code: the role's group bit (1, 2 or 4).
    pub const fn code(self) -> u8 {
        match self {
            Role::Scheduler => 1,
            Role::Server => 2,
            Role::Worker => 4,
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A wire role code that is not 1, 2 or 4.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnknownRole(pub u8);

impl TryFrom<u8> for Role {
    type Error = UnknownRole;
    fn try_from(code: u8) -> Result<Role, UnknownRole> {
        match code {
            1 => Ok(Role::Scheduler),
            2 => Ok(Role::Server),
            4 => Ok(Role::Worker),
            other => Err(UnknownRole(other)),
        }
    }
}

/// A `DMLC_ROLE` value other than `scheduler`, `server` or `worker`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown role {0:?}: expected scheduler, server or worker")]
pub struct ParseRoleError(pub String);

impl FromStr for Role {
    type Err = ParseRoleError;
    fn from_str(s: &str) -> Result<Role, ParseRoleError> {
        match s {
            "scheduler" => Ok(Role::Scheduler),
            "server" => Ok(Role::Server),
            "worker" => Ok(Role::Worker),
            other => Err(ParseRoleError(other.to_owned())),
        }
    }
}

/// A node's rank within its role (0-based, dense).
pub type Rank = u32;

/// A node id in ps-lite's numbering; `NodeId::NONE` (0) before rendezvous.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct NodeId(pub u32);

impl NodeId {
    /// Not assigned yet (a node before the scheduler sent the node list).
    pub const NONE: NodeId = NodeId(0);
    /// The scheduler.
    pub const SCHEDULER: NodeId = NodeId(1);

    /// The id of the server with `rank`; `None` if it would overflow.
    pub fn server(rank: Rank) -> Option<NodeId> {
        rank.checked_mul(2)?.checked_add(8).map(NodeId)
    }

    /// The id of the worker with `rank`; `None` if it would overflow.
    pub fn worker(rank: Rank) -> Option<NodeId> {
        rank.checked_mul(2)?.checked_add(9).map(NodeId)
    }

    /// The id of `role`'s node with `rank` (the scheduler is always id 1).
    pub fn for_role(role: Role, rank: Rank) -> Option<NodeId> {
        match role {
            Role::Scheduler => Some(NodeId::SCHEDULER),
            Role::Server => NodeId::server(rank),
            Role::Worker => NodeId::worker(rank),
        }
    }

    /// The role and rank this id denotes, if it is a valid assigned id.
    pub fn role_rank(self) -> Option<(Role, Rank)> {
        match self.0 {
            1 => Some((Role::Scheduler, 0)),
            id if id >= 8 && id % 2 == 0 => Some((Role::Server, (id - 8) / 2)),
            id if id >= 9 => Some((Role::Worker, (id - 9) / 2)),
            _ => None,
        }
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// One node as the cluster knows it: role, id and rank (once assigned), advertised address.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Node {
    /// The node's role.
    pub role: Role,
    /// Its id; [`NodeId::NONE`] before rendezvous.
    pub id: NodeId,
    /// Its rank within the role; `None` before rendezvous.
    pub rank: Option<Rank>,
    /// The host it advertises (`DMLC_NODE_HOST`, default `127.0.0.1`).
    pub host: String,
    /// The port it listens on (0 if it does not listen).
    pub port: u16,
    /// `DMLC_TASK_ID`, if the launcher set one.
    pub task_id: Option<u32>,
}

impl Node {
    /// A node that has not been assigned an id or rank yet.
    pub fn unassigned(role: Role, host: impl Into<String>, port: u16, task_id: Option<u32>) -> Node {
        Node { role, id: NodeId::NONE, rank: None, host: host.into(), port, task_id }
    }

    /// `host:port`, ready for `connect` (IPv6 hosts are bracketed).
    pub fn addr(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

impl Node {
    /// Where the node is, for messages: `at host:port`, or `on host` for a node that does
    /// not listen (a worker), whose port would mean nothing.
    fn place(&self) -> String {
        if self.port == 0 {
            format!("on {}", self.host)
        } else {
            format!("at {}", self.addr())
        }
    }
}

impl fmt::Display for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.role, self.rank) {
            (Role::Scheduler, _) => write!(f, "scheduler {}", self.place()),
            (role, Some(rank)) => write!(f, "{role} rank {rank} (id {}) {}", self.id, self.place()),
            (role, None) => write!(f, "unranked {role} {}", self.place()),
        }
    }
}

/// A set of roles taking part in a barrier: a bit set over [`Role::code`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Group(u8);

impl Group {
    /// Only the scheduler.
    pub const SCHEDULER: Group = Group(1);
    /// Every server.
    pub const SERVERS: Group = Group(2);
    /// Every worker (MXNet's `_barrier()`).
    pub const WORKERS: Group = Group(4);
    /// Servers and workers.
    pub const SERVERS_AND_WORKERS: Group = Group(6);
    /// Everyone, the scheduler included (it takes part implicitly).
    pub const ALL: Group = Group(7);

    /// The wire bits.
    pub const fn bits(self) -> u8 {
        self.0
    }

    /// Whether `role` belongs to this group.
    pub const fn contains(self, role: Role) -> bool {
        self.0 & role.code() != 0
    }
}

impl TryFrom<i32> for Group {
    type Error = i32;
    /// Accepts 1..=7; anything else is returned as the error.
    fn try_from(bits: i32) -> Result<Group, i32> {
        match u8::try_from(bits) {
            Ok(b @ 1..=7) => Ok(Group(b)),
            _ => Err(bits),
        }
    }
}

impl fmt::Display for Group {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = [Role::Scheduler, Role::Server, Role::Worker]
            .into_iter()
            .filter(|r| self.contains(*r))
            .map(|r| match r {
                Role::Scheduler => "scheduler",
                Role::Server => "servers",
                Role::Worker => "workers",
            })
            .collect();
        f.write_str(&names.join("+"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_follow_ps_lite() {
        assert_eq!(NodeId::server(0), Some(NodeId(8)));
        assert_eq!(NodeId::worker(2), Some(NodeId(13)));
        assert_eq!(NodeId(13).role_rank(), Some((Role::Worker, 2)));
        assert_eq!(NodeId(10).role_rank(), Some((Role::Server, 1)));
        assert_eq!(NodeId(1).role_rank(), Some((Role::Scheduler, 0)));
        assert_eq!(NodeId(0).role_rank(), None);
        assert_eq!(NodeId(5).role_rank(), None);
        assert_eq!(NodeId::worker(u32::MAX), None);
    }

    #[test]
    fn roles_and_groups() {
        for role in [Role::Scheduler, Role::Server, Role::Worker] {
            assert_eq!(Role::try_from(role.code()), Ok(role));
            assert_eq!(role.as_str().parse::<Role>(), Ok(role));
        }
        assert_eq!(Role::try_from(3), Err(UnknownRole(3)));
        assert!("Worker".parse::<Role>().is_err());
        assert!(Group::WORKERS.contains(Role::Worker) && !Group::WORKERS.contains(Role::Server));
        assert_eq!(Group::try_from(0), Err(0));
        assert_eq!(Group::try_from(8), Err(8));
        assert_eq!(Group::ALL.to_string(), "scheduler+servers+workers");
    }

    #[test]
    fn node_display_names_role_rank_and_addr() {
        let mut n = Node::unassigned(Role::Server, "127.0.0.1", 4000, None);
        assert_eq!(n.to_string(), "unranked server at 127.0.0.1:4000");
        n.rank = Some(1);
        n.id = NodeId(10);
        assert_eq!(n.to_string(), "server rank 1 (id 10) at 127.0.0.1:4000");
        assert_eq!(Node::unassigned(Role::Worker, "::1", 5, None).addr(), "[::1]:5");
    }
}
