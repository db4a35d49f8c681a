//! `pull-back`: pulls answered from the values sent back with this worker's pushes
//! (`SYNKV_PULL_BACK`, `synkv::store::distributed::held`) are exactly what the servers hold.
//!
//! Under the Test optimizer (`w += 2·g`) every round changes every value, so a pull answered
//! from a stale value shows. Keys of every size class: a few floats, 40 KB (sent back over
//! TCP too), 4 MiB (sent back through shared memory only) and one split over the servers in
//! parts; each round the last worker may push late (`--sleep-secs`, odd rounds), every key is
//! pulled into an f32 and an f64 output, some keys a second time (that pull asks the servers),
//! and one key is pulled only every third round (its pushes in between ask for nothing
//! back). At the end the worker's `synkv_worker_pulls_held_total` says the held path ran
//! (none with `SYNKV_PULL_BACK=0`).

use std::time::Duration;

use anyhow::{bail, Result};
use synkv::optimizer::Optimizer;
use synkv::{DType, KVStore, NDArray};

use super::cases::RATE;
use super::{expect_all, DistArgs};

pub(super) fn pull_back(kv: &KVStore, args: &DistArgs) -> Result<()> {
    kv.set_optimizer(Optimizer::test().with_rescale_grad(RATE))?;
    let (rank, n) = (kv.rank(), kv.num_workers());
    let keys: [(&str, usize); 5] = [("pb-small", 3), ("pb-40k", 10_000), ("pb-4m", 1 << 20), ("pb-split", 1_200_000), ("pb-rare", 10_000)];
    for (k, len) in keys {
        kv.init(k, &NDArray::ones([len]))?;
    }
    let sum = (n * (n + 1) / 2) as f64;
    let mut pulls = 0u64;
    for round in 0..args.repeat {
        if rank + 1 == n && round % 2 == 1 {
            std::thread::sleep(Duration::from_secs_f64(args.sleep_secs));
        }
        let names: Vec<&str> = keys.iter().map(|(k, _)| *k).collect();
        let grads: Vec<NDArray> = keys.iter().map(|(_, len)| NDArray::full([*len], (rank + 1) as f64)).collect();
        kv.push(names, &grads)?;
        let expected = 1.0 + RATE * sum * (round + 1) as f64;
        for (k, len) in keys {
            if k == "pb-rare" && round % 3 != 2 {
                continue;
            }
            let outs = vec![vec![NDArray::full([len], -1.0), NDArray::full_with(vec![len], -1.0, DType::F64, synkv::Context::cpu(0))]];
            kv.pull(k, &outs)?;
            pulls += 1;
            for o in &outs[0] {
                expect_all(&format!("round {round}, key {k} ({:?} output)", o.dtype()), o, expected, 1e-6)?;
            }
            if round % 3 == 0 {
                let again = NDArray::full([len], -1.0);
                kv.pull(k, &again)?;
                pulls += 1;
                expect_all(&format!("round {round}, key {k}, pulled again"), &again, expected, 1e-6)?;
            }
        }
    }
    let held = held_pulls();
    let off = std::env::var("SYNKV_PULL_BACK").as_deref() == Ok("0");
    if off && held != 0 {
        bail!("SYNKV_PULL_BACK=0, but {held} pulls were answered from values sent back with pushes");
    }
    // From the second round on, the first pull of each key pulled every round is answered
    // from the value its push asked back (over TCP, the 40 KB and smaller keys only).
    let tcp = std::env::var("SYNKV_SHM").as_deref() == Ok("0");
    let every_round = if tcp { 2 } else { 4 };
    let want = (args.repeat.saturating_sub(1) * every_round) as u64;
    if !off && held < want {
        bail!("only {held} of {pulls} pulls were answered from values sent back with pushes, expected at least {want}");
    }
    println!("pull-back: {held} of {pulls} pulls answered from values sent back with pushes");
    Ok(())
}

/// `synkv_worker_pulls_held_total` of this process.
fn held_pulls() -> u64 {
    let metrics = synkv::ps::metrics::render();
    metrics
        .lines()
        .find_map(|l| l.strip_prefix("synkv_worker_pulls_held_total{"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}
