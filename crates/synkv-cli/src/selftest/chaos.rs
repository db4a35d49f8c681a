//! The worker of `synkv chaos` (`synkv selftest dist chaos`): a job whose final values are
//! known exactly, so that a run interrupted by kills and restarted from its checkpoints can be
//! checked for lost or doubled updates.
//!
//! `--keys K` small keys `c0…` (`--key-elems` floats, default 4) and one key `split` of
//! `--size` floats (split over the servers by the harness's small
//! `MXNET_KVSTORE_BIGARRAY_BOUND`), the Test optimizer
//! (`w += g`). In round `r` (one push call of every key, then a pull of every key) worker `w`
//! pushes `(w + 1) · (1 + (r + k) mod 5)` to key `k` (the split key is key `K`), after a random
//! pause of up to `--max-delay-ms`. All values are integers far below 2^24, so f32 sums are
//! exact and the final value of key `k` is `k + Σ_r n(n+1)/2 · (1 + (r + k) mod 5)`. A job
//! restarted from a checkpoint of round `R0` pushes rounds `R0 + 1…` only.
//!
//! Prints `chaos: round R pushed` after each round (rank 0 only, for the harness's count of
//! redone rounds) and, after a barrier and a last pull, `chaos: rank W checked K+1 keys after R rounds: lost L, doubled
//! D` (keys below or above their value); fails when either is non-zero.

use std::time::Duration;

use anyhow::{bail, Result};
use synkv::optimizer::Optimizer;
use synkv::{DType, KVStore, NDArray};

use super::cases::full;
use super::DistArgs;
use crate::rng::SplitMix64;

/// What worker `w` pushes to key `k` in round `r`.
fn grad(w: usize, r: u64, k: usize) -> f64 {
    (w + 1) as f64 * (1 + (r + k as u64) % 5) as f64
}

/// Key `k`'s value after `rounds` rounds of `n` workers.
fn expected(k: usize, rounds: u64, n: usize) -> f64 {
    k as f64 + (1..=rounds).map(|r| (0..n).map(|w| grad(w, r, k)).sum::<f64>()).sum::<f64>()
}

/// The largest value an f32 holds exactly with every integer below it.
const EXACT: f64 = (1u32 << 24) as f64;

pub(super) fn chaos(kv: &KVStore, args: &DistArgs) -> Result<()> {
    let (rank, n) = (kv.rank(), kv.num_workers());
    let largest = (0..=args.keys.min(4)).map(|k| expected(args.keys - k, args.repeat as u64, n)).fold(0.0, f64::max);
    if largest > EXACT {
        bail!("{n} workers × {} rounds reach {largest}, past 2^24 where f32 sums stop being exact: use fewer rounds", args.repeat);
    }
    let from = kv.resumed_round().unwrap_or(0);
    println!("selftest chaos: rank {rank} starts after round {from}");
    kv.set_optimizer(Optimizer::test().with_rescale_grad(1.0))?;
    let mut names: Vec<String> = (0..args.keys).map(|k| format!("c{k}")).collect();
    names.push("split".into());
    let shapes: Vec<Vec<usize>> =
        (0..names.len()).map(|k| if k < args.keys { vec![args.key_elems.max(1)] } else { vec![args.size.max(1)] }).collect();
    let keys: Vec<&str> = names.iter().map(String::as_str).collect();
    let inits: Vec<NDArray> = shapes.iter().enumerate().map(|(k, s)| full(s, k as f64, DType::F32)).collect();
    kv.init(keys.clone(), &inits)?;
    let outs: Vec<NDArray> = shapes.iter().map(|s| full(s, 0.0, DType::F32)).collect();
    let mut rng = SplitMix64(args.seed ^ ((rank as u64) << 48) ^ from.wrapping_mul(0x9e37));
    for round in from + 1..=args.repeat as u64 {
        if args.max_delay_ms > 0 {
            std::thread::sleep(Duration::from_secs_f64(rng.uniform() * args.max_delay_ms as f64 / 1000.0));
        }
        let grads: Vec<NDArray> = shapes.iter().enumerate().map(|(k, s)| full(s, grad(rank, round, k), DType::F32)).collect();
        kv.push(keys.clone(), &grads)?;
        kv.pull(keys.clone(), &outs)?;
        for o in &outs {
            o.wait_to_read()?;
        }
        if rank == 0 {
            println!("chaos: round {round} pushed");
        }
    }
    // Every worker's pushes are applied (in dist_async too) before the values are checked.
    kv.barrier()?;
    kv.pull(keys.clone(), &outs)?;
    let (mut lost, mut doubled) = (0usize, 0usize);
    for (k, o) in outs.iter().enumerate() {
        let want = expected(k, args.repeat as u64, n);
        let got = o.to_vec::<f64>()?;
        if let Some(bad) = got.iter().find(|v| **v != want) {
            eprintln!("chaos: key {} is {bad}, expected {want} (difference {})", names[k], bad - want);
            if *bad < want {
                lost += 1;
            } else {
                doubled += 1;
            }
        }
    }
    println!("chaos: rank {rank} checked {} keys after {} rounds: lost {lost}, doubled {doubled}", names.len(), args.repeat);
    if lost + doubled > 0 {
        bail!("{lost} keys lost updates and {doubled} keys have updates counted twice");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expected_values_add_every_workers_push_of_every_round() {
        // 2 workers, key 0: rounds 1 and 2 push (1 + r % 5) · (1 + 2) = 6 and 9.
        assert_eq!(expected(0, 2, 2), 15.0);
        // key 3 starts at 3; round 1: (1 + 4 % 5) · 1 = 5 for one worker.
        assert_eq!(expected(3, 1, 1), 8.0);
        // 8 workers × 10^4 rounds stay exact in f32 (below 2^24); 64 workers × 10^4 do not.
        assert!(expected(20, 10_000, 8) < EXACT);
        assert!(expected(0, 10_000, 64) > EXACT);
    }
}
