//! The scenarios of `synkv selftest dist`. Expected numbers follow MXNet's nightly
//! `dist_sync_kvstore.py` (spec K11, T24–T35) with `n` workers of ranks `0..n`.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use synkv::optimizer::Optimizer;
use synkv::store::Error as StoreError;
use synkv::{create, DType, Error, KVStore, NDArray};

use super::{expect_all, DistArgs};

/// The Test optimizer's rate in MXNet's nightly tests (`w += rate · g`).
pub(super) const RATE: f64 = 2.0;

pub(crate) fn run(args: &DistArgs) -> Result<()> {
    let kv = create(&args.store).with_context(|| format!("creating a {} store", args.store))?;
    let (rank, n) = (kv.rank(), kv.num_workers());
    match args.case.as_str() {
        "t24" => t24(&kv, args, None)?,
        "t24-opt" => t24(&kv, args, Some(RATE))?,
        "init-rank0" => init_rank0(&kv)?,
        "async-opt" => async_rounds(&kv, true)?,
        "async-assign" => async_rounds(&kv, false)?,
        "str-order" => str_order(&kv)?,
        "multi-precision" => multi_precision(&kv)?,
        "states" => states(&kv)?,
        "errors" => errors(&kv)?,
        "until-failure" => until_failure(&kv, args)?,
        "rounds" => rounds(&kv, args)?,
        "rounds-until" => rounds_until(&kv, args)?,
        "t25" => super::sparse::t25(&kv, args)?,
        "t26" => super::sparse::t26(&kv)?,
        "t27" => super::sparse::t27(&kv, args)?,
        "t28" => super::compression::t28(&kv, args)?,
        "t29" => super::compression::t29(&kv, args)?,
        "compress-after-init" => super::compression::after_init(&kv)?,
        "partitions" => super::partitions::partitions(&kv, args)?,
        "pull-back" => super::pull_back::pull_back(&kv, args)?,
        "push-release" => push_release(&kv)?,
        "t30" => t30(&kv)?,
        "t35" => t35(&kv, args)?,
        "finish-apart" => super::real_job::finish_apart(&kv, args)?,
        "straggler" => super::real_job::straggler(&kv, args)?,
        "many-keys" => super::real_job::many_keys(&kv, args)?,
        "big-states" => super::real_job::big_states(&kv, args)?,
        "hold" => super::real_job::hold(&kv, args)?,
        "push-hold" => super::real_job::push_hold(&kv, args)?,
        "ckpt-train" | "ckpt-resume" => super::real_job::checkpoint_train(&kv, args)?,
        "restart-train" => super::real_job::restart_train(&kv, args)?,
        "chaos" => super::chaos::chaos(&kv, args)?,
        other => bail!("unknown selftest case {other:?}"),
    }
    println!("selftest {} ok (rank {rank} of {n} workers, {} servers)", args.case, kv.num_servers());
    kv.close().context("closing the store")?;
    Ok(())
}

pub(super) fn full(shape: &[usize], v: f64, dtype: DType) -> NDArray {
    NDArray::full_with(shape.to_vec(), v, dtype, synkv::Context::cpu(0))
}

/// T24: keys '3','5','7' (2×3), '99' (1200×1200, split over the servers) and their f16 twins
/// '4','6','8','100'; worker r pushes `ones·(r+1)` from each of `d` devices each round. With
/// the Test optimizer the pull is `1 + rate·d·n(n+1)/2·(i+1)` (T24, T34); with the default
/// assign it is `d·n(n+1)/2`.
fn t24(kv: &KVStore, args: &DistArgs, rate: Option<f64>) -> Result<()> {
    if let Some(rate) = rate {
        kv.set_optimizer(Optimizer::test().with_rescale_grad(rate))?;
    }
    let (rank, n) = (kv.rank() as f64, kv.num_workers() as f64);
    let d = args.devices.max(1);
    let small = [2usize, 3];
    let big = [1200usize, 1200];
    let sets: [(&[&str], &[usize], DType, f64); 4] = [
        (&["3", "5", "7"], &small, DType::F32, 1e-6),
        (&["99"], &big, DType::F32, 1e-6),
        (&["4", "6", "8"], &small, DType::F16, 1e-3),
        (&["100"], &big, DType::F16, 1e-3),
    ];
    for (keys, shape, dtype, _) in &sets {
        let ones: Vec<NDArray> = keys.iter().map(|_| full(shape, 1.0, *dtype)).collect();
        kv.init(keys.to_vec(), &ones)?;
    }
    for i in 0..args.repeat {
        for (keys, shape, dtype, _) in &sets {
            let grads: Vec<Vec<NDArray>> = keys
                .iter()
                .map(|_| (0..d).map(|dev| NDArray::full_with(shape.to_vec(), rank + 1.0, *dtype, synkv::Context::cpu(dev))).collect())
                .collect();
            kv.push(keys.to_vec(), &grads)?;
        }
        let sum = d as f64 * n * (n + 1.0) / 2.0;
        let expected = match rate {
            Some(r) => 1.0 + r * sum * (i as f64 + 1.0),
            None => sum,
        };
        for (keys, shape, dtype, tol) in &sets {
            let outs: Vec<NDArray> = keys.iter().map(|_| full(shape, 0.0, *dtype)).collect();
            kv.pull(keys.to_vec(), &outs)?;
            for (k, o) in keys.iter().zip(&outs) {
                expect_all(&format!("round {i}, key {k}"), o, expected, *tol)?;
            }
        }
    }
    Ok(())
}

/// A pushed array is free again once the push has copied it, before the round completes:
/// worker 0 pushes, waits to overwrite its array and overwrites it, and only then lets the
/// others push (a barrier). Were the wait tied to the servers' answer, worker 0 would wait for
/// a round that needs the other workers, who wait at the barrier: a deadlock, not a pass.
/// 64 MiB: larger than the servers' ingress and held budgets and than the default part, so
/// the value sent from worker 0's own memory (lent until written out) must be taken by the
/// servers (held, then folded) before the others push.
fn push_release(kv: &KVStore) -> Result<()> {
    let (rank, n) = (kv.rank(), kv.num_workers() as f64);
    let shape = [4096usize, 4096];
    kv.init("g", &full(&shape, 0.0, DType::F32))?;
    let grad = full(&shape, rank as f64 + 1.0, DType::F32);
    if rank == 0 {
        kv.push("g", &grad)?;
        grad.wait_to_write()?;
        grad.fill(-100.0)?;
    }
    kv.barrier()?;
    if rank != 0 {
        kv.push("g", &grad)?;
    }
    let out = full(&shape, 0.0, DType::F32);
    kv.pull("g", &out)?;
    expect_all("pull after the round (worker 0 overwrote its array after its push)", &out, n * (n + 1.0) / 2.0, 0.0)
}

/// Every worker initialises with `ones·(rank+1)`; rank 0's value wins; pulls right away.
fn init_rank0(kv: &KVStore) -> Result<()> {
    let r = kv.rank() as f64;
    kv.init("w", &full(&[3, 4], r + 1.0, DType::F32))?;
    let out = full(&[3, 4], 0.0, DType::F32);
    kv.pull("w", &out)?;
    expect_all("pull right after init", &out, 1.0, 0.0)
}

fn expect_store_error(what: &str, got: synkv::Result<()>, matches: impl Fn(&StoreError) -> bool) -> Result<()> {
    match got {
        Err(Error::Store(e)) if matches(&e) => {
            println!("{what}: refused as expected: {e}");
            Ok(())
        }
        Err(e) => bail!("{what}: expected a specific store error, got: {e}"),
        Ok(()) => bail!("{what}: expected an error, the call succeeded"),
    }
}

/// Re-init, uninitialised push and pull, mixed key kinds: clear errors, no hang.
fn errors(kv: &KVStore) -> Result<()> {
    let v = full(&[2, 2], 1.0, DType::F32);
    kv.init("a", &v)?;
    expect_store_error("init of a key twice", kv.init("a", &v), |e| matches!(e, StoreError::DuplicateInit { .. }))?;
    expect_store_error("push of an uninitialised key", kv.push("nobody", &v), |e| matches!(e, StoreError::NotInitialized { .. }))?;
    expect_store_error("pull of an uninitialised key", kv.pull("nobody", &v), |e| matches!(e, StoreError::NotInitialized { .. }))?;
    expect_store_error("an int key on a str store", kv.push(3, &v), |e| matches!(e, StoreError::MixedKeyKinds { .. }))?;
    expect_store_error("a push of the wrong shape", kv.push("a", &full(&[4], 1.0, DType::F32)), |e| {
        matches!(e, StoreError::ShapeMismatch { .. })
    })?;
    // The store still works after refused calls.
    kv.push("a", &v)?;
    let out = full(&[2, 2], 0.0, DType::F32);
    kv.pull("a", &out)?;
    expect_all("pull after the refused calls", &out, kv.num_workers() as f64, 0.0)
}

/// Pushes and pulls until an error (a node was killed), which is returned (exit status 1),
/// or `max_secs` pass.
fn until_failure(kv: &KVStore, args: &DistArgs) -> Result<()> {
    let shape = [64usize, 64];
    kv.init("x", &full(&shape, 0.0, DType::F32))?;
    let grad = full(&shape, 1.0, DType::F32);
    let out = full(&shape, 0.0, DType::F32);
    let deadline = Instant::now() + Duration::from_secs_f64(args.max_secs);
    let mut rounds = 0u64;
    while Instant::now() < deadline {
        let step = kv.pushpull("x", &grad, &out).and_then(|()| out.wait_to_read().map_err(Into::into));
        if let Err(e) = step {
            bail!("after {rounds} rounds: {e}");
        }
        rounds += 1;
        if rounds == 1 {
            println!("selftest until-failure: running");
        }
    }
    bail!("no failure within {} s ({rounds} rounds)", args.max_secs)
}

/// Async: workers push one after another (a barrier between turns); each push is applied on
/// arrival, so worker r's pull right after its push sees exactly the pushes so far. With the
/// Test optimizer (rate 1) that is `Σ_{j≤r} (j+1)`; without an optimizer the last push is
/// assigned: `r+1`. (In sync mode the first push would wait for every worker.)
fn async_rounds(kv: &KVStore, optimizer: bool) -> Result<()> {
    if optimizer {
        kv.set_optimizer(Optimizer::test().with_rescale_grad(1.0))?;
    }
    let (rank, n) = (kv.rank(), kv.num_workers());
    let shape = [5usize, 7];
    kv.init("w", &full(&shape, 0.0, DType::F32))?;
    let out = full(&shape, 0.0, DType::F32);
    for turn in 0..n {
        kv.barrier()?;
        if turn == rank {
            kv.push("w", &full(&shape, (rank + 1) as f64, DType::F32))?;
            kv.pull("w", &out)?;
            let want = if optimizer { ((rank + 1) * (rank + 2) / 2) as f64 } else { (rank + 1) as f64 };
            expect_all(&format!("pull right after the push of worker {rank}"), &out, want, 0.0)?;
        }
    }
    kv.barrier()?;
    kv.pull("w", &out)?;
    let want = if optimizer { (n * (n + 1) / 2) as f64 } else { n as f64 };
    expect_all("pull after every push", &out, want, 0.0)
}

/// String keys initialised in a different order on every worker (one `init` call per key,
/// rotated by rank) still meet on the same servers (MXNet #8224).
fn str_order(kv: &KVStore) -> Result<()> {
    let names = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta"];
    let (rank, n) = (kv.rank(), kv.num_workers());
    let value = |i: usize| (i + 1) as f64 * 10.0;
    for j in 0..names.len() {
        let i = (j + rank) % names.len();
        kv.init(names[i], &full(&[3, 3], value(i), DType::F32))?;
    }
    // Rank 0 initialised key `names[i]` with value(i) whatever the order.
    for (i, name) in names.iter().enumerate() {
        let out = full(&[3, 3], 0.0, DType::F32);
        kv.pull(*name, &out)?;
        expect_all(&format!("key {name} after init"), &out, value(i), 0.0)?;
    }
    let grads: Vec<NDArray> = names.iter().map(|_| full(&[3, 3], (rank + 1) as f64, DType::F32)).collect();
    kv.push(names.to_vec(), &grads)?;
    let outs: Vec<NDArray> = names.iter().map(|_| full(&[3, 3], 0.0, DType::F32)).collect();
    kv.pull(names.to_vec(), &outs)?;
    for (name, o) in names.iter().zip(&outs) {
        expect_all(&format!("key {name} after a push"), o, (n * (n + 1) / 2) as f64, 0.0)?;
    }
    Ok(())
}

/// Multi-precision on the servers: an f16 key updated by `w += 0.001·g` keeps an f32 master
/// copy, so after k rounds it is `f16(1 + 0.001·k·n(n+1)/2)`, not the sum of k rounded steps.
fn multi_precision(kv: &KVStore) -> Result<()> {
    kv.set_optimizer(Optimizer::test().with_rescale_grad(0.001).with_multi_precision(true))?;
    let (rank, n) = (kv.rank() as f64, kv.num_workers() as f64);
    let shape = [4usize, 4];
    kv.init(0, &full(&shape, 1.0, DType::F16))?;
    let out = full(&shape, 0.0, DType::F16);
    for k in 1..=10 {
        kv.push(0, &full(&shape, rank + 1.0, DType::F16))?;
        kv.pull(0, &out)?;
        let exact = 1.0 + 0.001 * f64::from(k) * n * (n + 1.0) / 2.0;
        let want = full(&[1], exact, DType::F16).to_vec::<f64>()?[0];
        expect_all(&format!("round {k}"), &out, want, 0.0)?;
    }
    Ok(())
}

/// save/load_optimizer_states on dist: SGD with momentum, a small key and a key split over
/// the servers. Rank 0 saves after round 1 and loads that file after round 2, so round 3
/// uses round 1's momentum: `w3 = −(0.1 + 0.19 + 0.19)·G` instead of `−(0.1 + 0.19 + 0.271)·G`.
fn states(kv: &KVStore) -> Result<()> {
    use synkv::optimizer::{Sgd, Updater};
    kv.set_optimizer(Optimizer::from(Sgd { momentum: 0.9, ..Sgd::default() }).with_learning_rate(0.1))?;
    let (rank, n) = (kv.rank(), kv.num_workers());
    let g = (n * (n + 1) / 2) as f64;
    let shapes: [(&str, &[usize]); 2] = [("small", &[3, 5]), ("big", &[1200, 1200])];
    for (k, shape) in &shapes {
        kv.init(*k, &full(shape, 0.0, DType::F32))?;
    }
    let port = std::env::var("DMLC_PS_ROOT_PORT").unwrap_or_default();
    let path = std::env::temp_dir().join(format!("synkv-selftest-states-{port}.bin"));
    let round = |want: f64, what: &str| -> Result<()> {
        for (k, shape) in &shapes {
            kv.push(*k, &full(shape, (rank + 1) as f64, DType::F32))?;
            let out = full(shape, 0.0, DType::F32);
            kv.pull(*k, &out)?;
            expect_all(&format!("{what}, key {k}"), &out, want, 1e-5)?;
        }
        Ok(())
    };
    round(-0.1 * g, "round 1")?;
    if rank == 0 {
        kv.save_optimizer_states(&path)?;
        let saved = Updater::from_saved_states(&std::fs::read(&path)?)?;
        let big = saved.state("big").context("the file holds the split key's state")?;
        if big.len() != 1200 * 1200 || saved.update_count("small") != Some(1) {
            bail!("the saved states are not whole: big has {} elements, small count {:?}", big.len(), saved.update_count("small"));
        }
    }
    kv.barrier()?;
    round(-0.29 * g, "round 2")?;
    kv.barrier()?;
    if rank == 0 {
        kv.load_optimizer_states(&path)?;
        let _ = std::fs::remove_file(&path);
    }
    kv.barrier()?;
    round(-0.48 * g, "round 3 after loading round 1's states")
}

/// T35-style in-place pushpull with no optimizer, `repeat` times: every repetition gives
/// `n(n+1)/2` (assign, not accumulate).
fn rounds(kv: &KVStore, args: &DistArgs) -> Result<()> {
    let shape = [16usize, 16];
    let (rank, n) = (kv.rank(), kv.num_workers());
    kv.init("r", &full(&shape, 0.0, DType::F32))?;
    for i in 0..args.repeat {
        let v = full(&shape, (rank + 1) as f64, DType::F32);
        kv.pushpull_in_place("r", &v)?;
        expect_all(&format!("repetition {i}"), &v, (n * (n + 1) / 2) as f64, 0.0)?;
        if i == 0 {
            println!("selftest rounds: running");
        }
    }
    Ok(())
}

/// Like `rounds`, but until the file `--until-file` exists (or `max_secs` pass): after every
/// 20 rounds the workers sum whether each saw the file, so all stop after the same round.
/// Every round's value is checked exactly.
fn rounds_until(kv: &KVStore, args: &DistArgs) -> Result<()> {
    let shape = [16usize, 16];
    let (rank, n) = (kv.rank(), kv.num_workers());
    kv.init("r", &full(&shape, 0.0, DType::F32))?;
    kv.init("stop", &full(&[1], 0.0, DType::F32))?;
    let deadline = Instant::now() + Duration::from_secs_f64(args.max_secs);
    let mut done = 0u64;
    loop {
        for _ in 0..20 {
            let v = full(&shape, (rank + 1) as f64, DType::F32);
            kv.pushpull_in_place("r", &v)?;
            expect_all(&format!("round {done}"), &v, (n * (n + 1) / 2) as f64, 0.0)?;
            if done == 0 {
                println!("selftest rounds-until: running");
            }
            done += 1;
        }
        let seen = args.until_file.as_ref().is_some_and(|f| f.exists()) || Instant::now() > deadline;
        let stop = full(&[1], if seen { 1.0 } else { 0.0 }, DType::F32);
        kv.pushpull_in_place("stop", &stop)?;
        if stop.to_vec::<f32>()?.first().is_some_and(|&seen_by| seen_by > 0.0) {
            break;
        }
    }
    println!("selftest rounds-until: {done} rounds, every value exact");
    Ok(())
}

/// T30: keys '200'..'299' (2×3) and '300'..'399' (1200×1200, split over the servers), the
/// first half of each f32, the second f16, initialised with `ones·k` (k = the key's number)
/// in one call; every worker pulls `k` right after init.
fn t30(kv: &KVStore) -> Result<()> {
    let mut keys = Vec::new();
    let mut values = Vec::new();
    for (base, shape) in [(200usize, [2usize, 3]), (300, [1200, 1200])] {
        for j in 0..100 {
            let dtype = if j < 50 { DType::F32 } else { DType::F16 };
            keys.push((base + j).to_string());
            values.push(full(&shape, (base + j) as f64, dtype));
        }
    }
    kv.init(keys.clone(), &values)?;
    drop(values);
    for (chunk_keys, chunk) in keys.chunks(20).zip(0..) {
        let outs: Vec<NDArray> = chunk_keys
            .iter()
            .enumerate()
            .map(|(j, k)| {
                let n: usize = k.parse().unwrap_or(0);
                let shape: &[usize] = if n < 300 { &[2, 3] } else { &[1200, 1200] };
                let dtype = if (chunk * 20 + j) % 100 < 50 { DType::F32 } else { DType::F16 };
                full(shape, 0.0, dtype)
            })
            .collect();
        kv.pull(chunk_keys.to_vec(), &outs)?;
        for (k, o) in chunk_keys.iter().zip(&outs) {
            expect_all(&format!("key {k} after init"), o, k.parse::<f64>().unwrap_or(0.0), 0.0)?;
        }
    }
    Ok(())
}

/// T35 (no optimizer): broadcast `ones·i` → i; in-place pushpull of 2 devices × `(r+1)` per
/// worker → the plain sum `n(n+1)` on every repetition.
fn t35(kv: &KVStore, args: &DistArgs) -> Result<()> {
    let (rank, n) = (kv.rank(), kv.num_workers());
    let keys: Vec<String> = (500..510).map(|k| k.to_string()).collect();
    let values: Vec<NDArray> = (0..keys.len()).map(|i| full(&[2, 3], i as f64, DType::F32)).collect();
    let outs: Vec<NDArray> = keys.iter().map(|_| full(&[2, 3], -1.0, DType::F32)).collect();
    kv.broadcast(keys.clone(), &values, &outs)?;
    for (i, o) in outs.iter().enumerate() {
        expect_all(&format!("broadcast key {}", keys[i]), o, i as f64, 0.0)?;
    }
    kv.init("600", &full(&[2, 3], 0.0, DType::F32))?;
    for i in 0..args.repeat {
        let vals: Vec<NDArray> =
            (0..2).map(|d| NDArray::full_with(vec![2, 3], (rank + 1) as f64, DType::F32, synkv::Context::cpu(d))).collect();
        kv.pushpull_in_place("600", &vals)?;
        for v in &vals {
            expect_all(&format!("in-place pushpull, repetition {i}"), v, (n * (n + 1)) as f64, 0.0)?;
        }
    }
    Ok(())
}
