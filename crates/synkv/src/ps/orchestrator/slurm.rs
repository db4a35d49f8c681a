//! Slurm's variables: the task counts, the tasks per node (`2(x3),1`), and the first host of a
//! node list (`node[01-04,07],gpu3` → `node01`).
//!
//! A step's own variables come first (`SLURM_STEP_NUM_TASKS`, `SLURM_STEP_TASKS_PER_NODE`,
//! `SLURM_STEP_NODELIST`), then the job's, because an `srun` step may use part of the
//! allocation. The per-node list must give every node the same count and add up to the task
//! count; a single `SLURM_NTASKS_PER_NODE` (a request, not a layout) is the last resort.

use super::{err, first_number, get_value, number, Found, Num, PortRule, Source};
use crate::ps::config::Lookup;
use crate::ps::ConfigError;

/// What `srun` said about this task (`rank` is `SLURM_PROCID`).
pub(super) fn found(get: &Lookup<'_>, rank: Num) -> Result<Found, ConfigError> {
    let world = first_number(get, &["SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"])?
        .ok_or_else(|| err("SLURM_NTASKS", "is not set, but SLURM_PROCID is", "the task count srun sets (start the script with srun)"))?;
    let local = match (number(get, "SLURM_LOCALID")?, tasks_per_node(get, world)?) {
        (Some(r), Some(s)) => Some((r, s)),
        (None, None) => None,
        (Some(_), None) => {
            return Err(err(
                "SLURM_TASKS_PER_NODE",
                "is not set (nor SLURM_STEP_TASKS_PER_NODE or SLURM_NTASKS_PER_NODE), but SLURM_LOCALID is",
                "the tasks per node srun sets, e.g. 2(x3)",
            ))
        }
        (None, Some(s)) => return Err(err("SLURM_LOCALID", format!("is not set, but {} is", s.var), "the task's index on its node")),
    };
    let addr = nodelist_head(get)?;
    let port = match jobs(get)? {
        Some(id) => PortRule::SlurmJob(id),
        None => PortRule::Default,
    };
    Ok(Found { source: Source::Slurm, rank, world, local, addr, port })
}

/// The first host of the step's (else the job's) node list.
fn nodelist_head(get: &Lookup<'_>) -> Result<Option<String>, ConfigError> {
    for var in ["SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"] {
        if let Some(list) = get_value(get, var)? {
            return first_of_hostlist(&list)
                .map(Some)
                .ok_or_else(|| err(var, format!("{list:?} is not a node list"), "a Slurm host list such as node[01-04,07],gpu3"));
        }
    }
    Ok(None)
}

fn jobs(get: &Lookup<'_>) -> Result<Option<u64>, ConfigError> {
    for var in ["SLURM_JOB_ID", "SLURM_JOBID"] {
        if let Some(raw) = get_value(get, var)? {
            return raw.parse::<u64>().map(Some).map_err(|_| err(var, format!("{raw:?} is not a number"), "Slurm's numeric job id"));
        }
    }
    Ok(None)
}

/// Tasks per node, the same on every node.
fn tasks_per_node(get: &Lookup<'_>, world: Num) -> Result<Option<Num>, ConfigError> {
    for var in ["SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"] {
        let Some(raw) = get_value(get, var)? else { continue };
        let expected = "tasks per node as Slurm writes them (e.g. 2(x3)), the same count on every node";
        let counts = parse_tasks_per_node(&raw).ok_or_else(|| err(var, format!("{raw:?} is not a tasks-per-node list"), expected))?;
        let first = counts.first().copied().unwrap_or(0);
        if counts.iter().any(|c| *c != first) {
            return Err(err(
                var,
                format!("{raw:?} gives the nodes different task counts"),
                "the same count on every node (srun --ntasks-per-node), or the SYNKV_* variables set by hand",
            ));
        }
        let total = counts.iter().try_fold(0u32, |t, c| t.checked_add(*c));
        if total != Some(world.value) {
            return Err(err(var, format!("{raw:?} does not add up to {} = {}", world.var, world.value), expected));
        }
        return Ok(Some(Num { var, value: first }));
    }
    number(get, "SLURM_NTASKS_PER_NODE")
}

/// `2(x3),1` → `[2, 2, 2, 1]`; `None` if malformed (or absurdly long).
pub(super) fn parse_tasks_per_node(s: &str) -> Option<Vec<u32>> {
    let mut out = Vec::new();
    for item in s.split(',') {
        let item = item.trim();
        let (count, times) = match item.split_once("(x") {
            Some((c, rest)) => (c, rest.strip_suffix(')')?.parse::<usize>().ok()?),
            None => (item, 1),
        };
        let count = count.parse::<u32>().ok()?;
        if times == 0 || out.len() + times > super::MAX_NODES_PER_ROLE as usize {
            return None;
        }
        out.extend(std::iter::repeat_n(count, times));
    }
    Some(out)
}

/// The first host of a Slurm host list: the first entry (commas inside brackets do not
/// separate entries), each bracket replaced by its first number as written (padding kept).
pub(super) fn first_of_hostlist(list: &str) -> Option<String> {
    let mut depth = 0u32;
    let mut end = list.len();
    for (i, c) in list.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth = depth.checked_sub(1)?,
            ',' if depth == 0 => {
                end = i;
                break;
            }
            _ => {}
        }
    }
    let mut rest = list[..end].trim();
    let mut host = String::new();
    while let Some(open) = rest.find('[') {
        host.push_str(&rest[..open]);
        let close = open + rest[open..].find(']')?;
        let range = rest[open + 1..close].split(',').next()?;
        let first = range.split('-').next()?.trim();
        if first.is_empty() || !first.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        host.push_str(first);
        rest = &rest[close + 1..];
    }
    host.push_str(rest);
    if host.is_empty() || host.contains([']', ',']) || host.contains(char::is_whitespace) {
        return None;
    }
    Some(host)
}
