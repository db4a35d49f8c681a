//! Deterministic rank assignment, run once every node has registered.
//!
//! The rule, per role: if every node of the role gave a `DMLC_TASK_ID` and those ids are
//! exactly `0..n` (distinct, each below `n`), a node's rank is its task id. Otherwise nodes are
//! sorted by (host, port) — compared as strings then numbers, a strict order unlike ps-lite's
//! (spec K12.20) — with registration order breaking ties, and ranked in that order.
//! Ids follow from ranks (spec K8.5).

use crate::ps::node::{Node, NodeId, Role};

/// Assigns `rank` and `id` to every server and worker in `nodes` (in registration order).
pub(crate) fn assign_ranks(nodes: &mut [Node]) {
    for role in [Role::Server, Role::Worker] {
        let members: Vec<usize> = (0..nodes.len()).filter(|i| nodes[*i].role == role).collect();
        let n = members.len();
        let mut by_task: Vec<Option<usize>> = vec![None; n];
        let complete = members.iter().all(|i| match nodes[*i].task_id.and_then(|t| usize::try_from(t).ok()) {
            Some(t) if t < n && by_task[t].is_none() => {
                by_task[t] = Some(*i);
                true
            }
            _ => false,
        });
        let order: Vec<usize> = if complete {
            by_task.into_iter().flatten().collect()
        } else {
            let mut sorted = members;
            sorted.sort_by(|a, b| (&nodes[*a].host, nodes[*a].port).cmp(&(&nodes[*b].host, nodes[*b].port)));
            sorted
        };
        for (rank, i) in order.into_iter().enumerate() {
            let rank = u32::try_from(rank).unwrap_or(u32::MAX);
            nodes[i].rank = Some(rank);
            nodes[i].id = NodeId::for_role(role, rank).unwrap_or(NodeId::NONE);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(role: Role, host: &str, port: u16, task: Option<u32>) -> Node {
        Node::unassigned(role, host, port, task)
    }

    fn ranks(nodes: &[Node]) -> Vec<(Role, u32, u32)> {
        nodes.iter().map(|n| (n.role, n.rank.unwrap(), n.id.0)).collect()
    }

    #[test]
    fn complete_task_ids_decide() {
        let mut v = vec![
            node(Role::Worker, "b", 1, Some(1)),
            node(Role::Server, "a", 9, Some(0)),
            node(Role::Worker, "a", 2, Some(0)),
            node(Role::Worker, "a", 1, Some(2)),
        ];
        assign_ranks(&mut v);
        assert_eq!(ranks(&v), vec![(Role::Worker, 1, 11), (Role::Server, 0, 8), (Role::Worker, 0, 9), (Role::Worker, 2, 13)]);
    }

    #[test]
    fn incomplete_or_duplicate_task_ids_fall_back_to_host_port() {
        for tasks in [[Some(0), None, Some(1)], [Some(0), Some(0), Some(1)], [Some(0), Some(1), Some(3)]] {
            let mut v =
                vec![node(Role::Worker, "b", 1, tasks[0]), node(Role::Worker, "a", 20, tasks[1]), node(Role::Worker, "a", 3, tasks[2])];
            assign_ranks(&mut v);
            assert_eq!(v.iter().map(|n| n.rank.unwrap()).collect::<Vec<_>>(), vec![2, 1, 0], "{tasks:?}");
        }
    }

    #[test]
    fn ties_keep_registration_order() {
        let mut v = vec![node(Role::Server, "h", 0, None), node(Role::Server, "h", 0, None)];
        assign_ranks(&mut v);
        assert_eq!(ranks(&v), vec![(Role::Server, 0, 8), (Role::Server, 1, 10)]);
    }
}
