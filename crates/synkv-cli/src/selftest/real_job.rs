//! Scenarios of real jobs rather than toy ones (issue 10): workers finishing far apart, a slow
//! worker between two sync pushes, hundreds of thousands of keys, optimizer states larger
//! than a frame, and a worker that only holds a key while a test talks to the servers.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use synkv::ndarray::Buffer;
use synkv::optimizer::{Adam, Optimizer, Updater};
use synkv::{create, Context as Device, DType, KVStore, NDArray};

use super::cases::full;
use super::{expect_all, DistArgs};

fn sleep(secs: f64) {
    if secs > 0.0 {
        std::thread::sleep(Duration::from_secs_f64(secs));
    }
}

/// Two sync rounds of one key, then worker `r` waits `r · sleep_secs` before closing: the
/// workers finish far apart (an uneven last epoch, a long final evaluation).
pub(super) fn finish_apart(kv: &KVStore, args: &DistArgs) -> Result<()> {
    let (rank, n) = (kv.rank(), kv.num_workers());
    kv.init("w", &full(&[4], 0.0, DType::F32))?;
    for round in 0..2 {
        let out = full(&[4], 0.0, DType::F32);
        kv.pushpull("w", &full(&[4], (rank + 1) as f64, DType::F32), &out)?;
        expect_all(&format!("round {round}"), &out, (n * (n + 1) / 2) as f64, 0.0)?;
    }
    println!("selftest finish-apart: rank {rank} done training");
    sleep(rank as f64 * args.sleep_secs);
    Ok(())
}

/// Worker 1 waits `sleep_secs` between two sync pushes (a checkpoint, a validation pass):
/// the others' pushes wait for it, and every value is right.
pub(super) fn straggler(kv: &KVStore, args: &DistArgs) -> Result<()> {
    let (rank, n) = (kv.rank(), kv.num_workers());
    kv.init("s", &full(&[8], 0.0, DType::F32))?;
    let want = (n * (n + 1) / 2) as f64;
    for round in 0..2 {
        if round == 1 && rank == 1 {
            sleep(args.sleep_secs);
        }
        kv.push("s", &full(&[8], (rank + 1) as f64, DType::F32))?;
        let out = full(&[8], 0.0, DType::F32);
        kv.pull("s", &out)?;
        expect_all(&format!("round {round}"), &out, want, 0.0)?;
    }
    Ok(())
}

/// `keys` dense keys of 2 floats (push, pull and pushpull in one call each, far more keys and
/// chunks than one frame holds) and `keys / 10` row_sparse keys of 4 × 2 (push of rows 1 and
/// 3, row_sparse_pull of rows 1 and 2), all on the servers at once.
pub(super) fn many_keys(kv: &KVStore, args: &DistArgs) -> Result<()> {
    let (rank, n) = (kv.rank(), kv.num_workers());
    let sum = (n * (n + 1) / 2) as f64;
    let keys: Vec<i32> = (0..i32::try_from(args.keys)?).collect();
    let zeros: Vec<NDArray> = keys.iter().map(|_| full(&[2], 0.0, DType::F32)).collect();
    kv.init(keys.clone(), &zeros)?;
    let grads: Vec<NDArray> = keys.iter().map(|k| full(&[2], f64::from(k % 7) + (rank + 1) as f64, DType::F32)).collect();
    kv.push(keys.clone(), &grads)?;
    kv.pull(keys.clone(), &zeros)?;
    check_keys("push + pull", &keys, &zeros, |k| n as f64 * f64::from(k % 7) + sum)?;
    kv.pushpull(keys.clone(), &grads, &zeros)?;
    check_keys("pushpull", &keys, &zeros, |k| n as f64 * f64::from(k % 7) + sum)?;
    println!("selftest many-keys: {} dense keys ok", keys.len());

    let base = keys.len() as i32;
    let sparse: Vec<i32> = (base..base + (keys.len() / 10) as i32).collect();
    let shape = [4usize, 2];
    let all: Vec<NDArray> = sparse
        .iter()
        .map(|_| NDArray::row_sparse(shape.to_vec(), vec![0, 1, 2, 3], Buffer::filled(DType::F32, 8, 1.0), Device::cpu(0)))
        .collect::<Result<_, _>>()?;
    kv.init(sparse.clone(), &all)?;
    let rows: Vec<NDArray> = sparse
        .iter()
        .map(|_| NDArray::row_sparse(shape.to_vec(), vec![1, 3], Buffer::filled(DType::F32, 4, (rank + 1) as f64), Device::cpu(0)))
        .collect::<Result<_, _>>()?;
    kv.push(sparse.clone(), &rows)?;
    let ids = NDArray::from_vec([2], vec![1.0f32, 2.0])?;
    let outs: Vec<NDArray> = sparse.iter().map(|_| NDArray::row_sparse_zeros(shape.to_vec(), DType::F32, Device::cpu(0))).collect();
    let id_lists: Vec<&NDArray> = sparse.iter().map(|_| &ids).collect();
    kv.row_sparse_pull(sparse.clone(), &outs, id_lists)?;
    for (k, out) in sparse.iter().zip(&outs) {
        // Assign: rows pushed (1, 3) hold the sum, the others became 0.
        let got = out.to_vec::<f64>()?;
        let want = [0.0, 0.0, sum, sum, 0.0, 0.0, 0.0, 0.0];
        if got != want || out.indices()? != vec![1, 2] {
            bail!("row_sparse key {k}: pulled {got:?} (rows {:?}), expected {want:?} (rows [1, 2])", out.indices()?);
        }
    }
    println!("selftest many-keys: {} row_sparse keys ok", sparse.len());
    Ok(())
}

fn check_keys(what: &str, keys: &[i32], outs: &[NDArray], want: impl Fn(i32) -> f64) -> Result<()> {
    for (k, o) in keys.iter().zip(outs) {
        expect_all(&format!("{what}, key {k}"), o, want(*k), 0.0)?;
    }
    Ok(())
}

/// Adam on one key of `size` floats (its value and its states far larger than a frame when
/// `SYNKV_MAX_FRAME_BYTES` is small): rank 0 saves the servers' states, loads them back and
/// saves again — both files equal, byte for byte, what a local store with the same pushes
/// saves.
pub(super) fn big_states(kv: &KVStore, args: &DistArgs) -> Result<()> {
    let (rank, n) = (kv.rank(), kv.num_workers());
    let opt = Optimizer::from(Adam::default()).with_learning_rate(0.01);
    kv.set_optimizer(opt.clone())?;
    let size = args.size;
    let init: Vec<f32> = (0..size).map(|i| (i % 100) as f32 / 100.0).collect();
    kv.init("big", &NDArray::from_vec([size], init.clone())?)?;
    // The same rounds on a local store: what every worker's pushes sum to.
    let local = create("local")?;
    local.set_optimizer(opt)?;
    local.init("big", &NDArray::from_vec([size], init)?)?;
    for round in 0..args.repeat {
        let grad = |r: usize| -> Vec<f32> { (0..size).map(|i| ((i * 7 + round * 3 + r) % 11) as f32 / 10.0 - 0.5).collect() };
        kv.push("big", &NDArray::from_vec([size], grad(rank))?)?;
        let grads: Vec<Vec<f32>> = (0..n).map(grad).collect();
        let total: Vec<f32> = (0..size).map(|i| grads.iter().map(|g| g[i]).sum()).collect();
        local.push("big", &NDArray::from_vec([size], total)?)?;
    }
    let out = NDArray::zeros([size]);
    kv.pull("big", &out)?;
    let want = NDArray::zeros([size]);
    local.pull("big", &want)?;
    let (got, want) = (out.to_vec::<f32>()?, want.to_vec::<f32>()?);
    if let Some(i) = (0..size).find(|&i| (got[i] - want[i]).abs() > 1e-5 * want[i].abs().max(1.0)) {
        bail!("element {i} is {} on the servers, {} on a local store", got[i], want[i]);
    }
    kv.barrier()?;
    if rank == 0 {
        let dir = std::env::temp_dir().join(format!("synkv-big-states-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let (a, b, l) = (dir.join("saved.bin"), dir.join("reloaded.bin"), dir.join("local.bin"));
        kv.save_optimizer_states(&a).context("saving the servers' states")?;
        kv.load_optimizer_states(&a).context("loading them back")?;
        kv.save_optimizer_states(&b).context("saving again")?;
        local.save_optimizer_states(&l)?;
        let (a_bytes, b_bytes, l_bytes) = (std::fs::read(&a)?, std::fs::read(&b)?, std::fs::read(&l)?);
        let _ = std::fs::remove_dir_all(&dir);
        let states = Updater::from_saved_states(&a_bytes)?;
        let len = states.state("big").map_or(0, |s| s.len());
        if len != size || states.update_count("big") != Some(args.repeat as u64) {
            bail!("the saved state of key big has {len} elements and count {:?}", states.update_count("big"));
        }
        if a_bytes != b_bytes {
            bail!("saving, loading and saving again changed the states file");
        }
        if a_bytes != l_bytes {
            bail!("the servers' states file differs from a local store's after the same pushes");
        }
        println!("selftest big-states: {} bytes of states saved and loaded back", a_bytes.len());
    }
    kv.barrier()?;
    Ok(())
}

/// Initialises key 4242 (`size` floats), then waits while a test talks to the servers
/// directly (raw frames): `sleep_secs`, or until the file `--until-file` exists.
pub(super) fn hold(kv: &KVStore, args: &DistArgs) -> Result<()> {
    kv.init(4242, &full(&[args.size.max(1)], 1.0, DType::F32))?;
    println!("selftest hold: holding key 4242 for {} s", args.sleep_secs);
    let deadline = std::time::Instant::now() + Duration::from_secs_f64(args.sleep_secs);
    while std::time::Instant::now() < deadline && !args.until_file.as_ref().is_some_and(|f| f.exists()) {
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// Initialises key 4242 (`size` floats), pushes and pulls it `repeat` times, then holds like
/// [`hold`] (a test scrapes every process's metrics meanwhile).
pub(super) fn push_hold(kv: &KVStore, args: &DistArgs) -> Result<()> {
    let shape = [args.size.max(1)];
    kv.init(4242, &full(&shape, 1.0, DType::F32))?;
    let out = full(&shape, 0.0, DType::F32);
    for _ in 0..args.repeat.max(1) {
        kv.push(4242, &full(&shape, 1.0, DType::F32))?;
        kv.pull(4242, &out)?;
        out.wait_to_read()?;
    }
    if args.batch_keys > 0 {
        let keys: Vec<i32> = (0..args.batch_keys).map(|k| 5000 + i32::try_from(k).unwrap_or(i32::MAX - 5000)).collect();
        let values: Vec<NDArray> = keys.iter().map(|_| full(&shape, 1.0, DType::F32)).collect();
        kv.init(keys.clone(), &values)?;
        kv.push(keys.clone(), &values)?;
        let outs: Vec<NDArray> = keys.iter().map(|_| full(&shape, 0.0, DType::F32)).collect();
        kv.pull(keys.clone(), &outs)?;
        for (k, o) in keys.iter().zip(&outs) {
            expect_all(&format!("batch key {k}"), o, 1.0, 0.0)?;
        }
    }
    println!("selftest push-hold: pushed {} times, holding for {} s", args.repeat.max(1), args.sleep_secs);
    let deadline = std::time::Instant::now() + Duration::from_secs_f64(args.sleep_secs);
    while std::time::Instant::now() < deadline && !args.until_file.as_ref().is_some_and(|f| f.exists()) {
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// SGD with momentum on a small key and a key split over the servers; worker `r` pushes
/// `r + 1` every round and pulls. Rounds `from + 1 ..= repeat` (`from` = the round the job
/// resumed from, 0 for a fresh job); with `--checkpoint-at C` every worker takes a checkpoint
/// into `--dir` after round `C`. Prints the final weights exactly, so that a resumed run can be
/// compared bit for bit with an uninterrupted one.
pub(super) fn checkpoint_train(kv: &KVStore, args: &DistArgs) -> Result<()> {
    use synkv::optimizer::Sgd;
    let rank = kv.rank();
    let from = kv.resumed_round().unwrap_or(0);
    if args.case == "ckpt-resume" && from == 0 {
        bail!("expected to resume from a checkpoint (SYNKV_CHECKPOINT_DIR), but the job starts fresh");
    }
    println!("selftest {}: rank {rank} starts after round {from}", args.case);
    kv.set_optimizer(Optimizer::from(Sgd { momentum: 0.9, ..Sgd::default() }).with_learning_rate(0.1))?;
    if let Some(kind) = &args.compression {
        kv.set_gradient_compression([("type", kind.as_str()), ("threshold", "0.5")])?;
    }
    const EMB: [usize; 2] = [64, 4];
    if args.sparse {
        let rows: Vec<i64> = (0..EMB[0] as i64).collect();
        kv.init("emb", &NDArray::row_sparse(EMB.to_vec(), rows, Buffer::filled(DType::F32, EMB[0] * EMB[1], 1.0), Device::cpu(0))?)?;
    }
    let big = [args.big_elems.div_ceil(1000).max(1), 1000];
    let shapes: [(&str, &[usize]); 2] = [("small", &[3, 5]), ("big", &big)];
    for (k, shape) in &shapes {
        kv.init(*k, &full(shape, 1.0, DType::F32))?;
    }
    let keys: Vec<&str> = shapes.iter().map(|(k, _)| *k).collect();
    for round in from + 1..=args.repeat as u64 {
        // One push call per round (a round is one push call).
        let grads: Vec<NDArray> = shapes.iter().map(|(_, shape)| full(shape, (rank + 1) as f64, DType::F32)).collect();
        kv.push(keys.clone(), &grads)?;
        if args.sparse {
            // Two rows a round, different for each worker and round.
            let mut rows = vec![((round + rank as u64) % 64) as i64, ((round * 7 + 3) % 64) as i64];
            rows.sort_unstable();
            rows.dedup();
            let data = Buffer::filled(DType::F32, rows.len() * EMB[1], (rank + 1) as f64);
            kv.push("emb", &NDArray::row_sparse(EMB.to_vec(), rows, data, Device::cpu(0))?)?;
        }
        println!("selftest {}: round {round} pushed", args.case);
        if args.sleep_secs > 0.0 {
            sleep(args.sleep_secs);
        }
        if args.checkpoint_at == Some(round) {
            let dir = args.dir.as_ref().context("--checkpoint-at needs --dir")?;
            let info = kv.checkpoint(dir)?;
            println!("selftest {}: checkpoint {} at round {}", args.case, info.id, info.round);
        }
    }
    let mut finals = Vec::new();
    for (k, shape) in &shapes {
        let out = full(shape, 0.0, DType::F32);
        kv.pull(*k, &out)?;
        let v = out.to_vec::<f32>()?;
        if v.iter().any(|x| x.to_bits() != v[0].to_bits()) {
            bail!("key {k}: the elements differ");
        }
        finals.push(format!("{k}={:?}", v[0]));
    }
    if args.sparse {
        let ids = NDArray::from_vec([EMB[0]], (0..EMB[0]).map(|i| i as f32).collect::<Vec<f32>>())?;
        let out = NDArray::row_sparse_zeros(EMB.to_vec(), DType::F32, Device::cpu(0));
        kv.row_sparse_pull("emb", &out, &ids)?;
        // Every row differs: a fingerprint of the bits of all of them.
        let bits =
            out.to_vec::<f32>()?.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, x| (h ^ u64::from(x.to_bits())).wrapping_mul(0x100_0000_01b3));
        finals.push(format!("emb={bits:016x}"));
    }
    println!("selftest {}: rank {rank} final {}", args.case, finals.join(" "));
    Ok(())
}

/// A job a worker dies in and is restarted into (`synkv launch --max-restarts`): the Test
/// optimizer (`w += g`) on a small key and a key split over the servers, every worker pushing
/// ones and pulling each round, `--repeat R` rounds per process. With `--die-at K`, rank 1's
/// first process exits (status 137, as if killed) right after its pull of round K, so exactly K
/// of its pushes are in; its restarted process (the marker in `--dir` says it is one) pushes R
/// rounds more. Each process prints the value it pulled last: the restarted one, which ends
/// after every other (sync: it is K rounds behind; async: after a final barrier), sees
/// `1 + 2R + K` (for 2 workers) — every push counted once.
pub(super) fn restart_train(kv: &KVStore, args: &DistArgs) -> Result<()> {
    let rank = kv.rank();
    let dir = args.dir.as_ref().context("restart-train needs --dir (for the marker of the first death)")?;
    let marker = dir.join(format!("died-{rank}"));
    let again = marker.exists();
    println!("selftest restart-train: rank {rank} starts{}", if again { " again (restarted)" } else { "" });
    kv.set_optimizer(Optimizer::test().with_rescale_grad(1.0))?;
    let big = [args.big_elems.div_ceil(1000).max(1), 1000];
    let shapes: [(&str, &[usize]); 2] = [("small", &[3, 5]), ("big", &big)];
    for (k, shape) in &shapes {
        kv.init(*k, &full(shape, 1.0, DType::F32))?;
    }
    let keys: Vec<&str> = shapes.iter().map(|(k, _)| *k).collect();
    let outs: Vec<NDArray> = shapes.iter().map(|(_, shape)| full(shape, 0.0, DType::F32)).collect();
    for round in 1..=args.repeat as u64 {
        let grads: Vec<NDArray> = shapes.iter().map(|(_, shape)| full(shape, 1.0, DType::F32)).collect();
        kv.push(keys.clone(), &grads)?;
        kv.pull(keys.clone(), &outs)?;
        for o in &outs {
            o.wait_to_read()?;
        }
        println!("selftest restart-train: round {round} pushed");
        if rank == 1 && !again && args.die_at == Some(round) {
            std::fs::write(&marker, b"died")?;
            println!("selftest restart-train: rank {rank} dies after round {round}");
            std::process::exit(137);
        }
        if args.sleep_secs > 0.0 {
            sleep(args.sleep_secs);
        }
    }
    if args.store == "dist_async" {
        // Every process's pushes are in once each has pulled after its last push; a barrier
        // (the restarted process counts as the dead one's member) makes the last pull see all.
        // Not in sync: the restarted process is rounds behind, so the others' barrier would
        // hold the rounds it still has to push.
        kv.barrier()?;
        kv.pull(keys.clone(), &outs)?;
    }
    let mut finals = Vec::new();
    for ((k, _), o) in shapes.iter().zip(&outs) {
        let v = o.to_vec::<f32>()?;
        if v.iter().any(|x| x.to_bits() != v[0].to_bits()) {
            bail!("key {k}: the elements differ");
        }
        finals.push(format!("{k}={}", v[0]));
    }
    println!("selftest restart-train: rank {rank} final {}", finals.join(" "));
    Ok(())
}
