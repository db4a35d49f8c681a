//! `partitions`: values cut into many parts come back whole and exact (issue 13). Run it with a
//! small `SYNKV_PARTITION_BYTES` so every key below travels as dozens of parts over every
//! server (a single-value push as one engine operation per part, `ops::push_parts`).
//!
//! Every element gets its own value (a function of its position, the worker's rank and the
//! round), small integers that f32 and f16 sum exactly, so a part written at the wrong offset,
//! lost, doubled or taken from another round fails the comparison, element by element:
//! - dense keys of odd sizes (f32 and f16): push then pull (the pushed array overwritten at
//!   once: its parts are sent from its memory), pushpull, and a push of two devices' values
//!   (summed, then sent whole);
//! - a row_sparse key of odd row count and row length: rows of each worker pushed, pulled by
//!   `row_sparse_pull` across many parts;
//! - the server's optimizer (`w += 2·g`) on a partitioned key;
//! - 2-bit compression on a partitioned key (each part quantized with its residual);
//! - a pull into two outputs of different dtypes;
//! - over TCP (`SYNKV_SHM=0`), that answers were read straight into the outputs.

use anyhow::{bail, Result};
use synkv::ndarray::Buffer;
use synkv::optimizer::Optimizer;
use synkv::{Context, DType, KVStore, NDArray};

use super::cases::RATE;
use super::DistArgs;

/// Element `i`'s value pushed by worker `rank` in round `round` (a small integer).
fn value(i: usize, rank: usize, round: usize) -> f64 {
    ((i * 7 + round * 3) % 61) as f64 + rank as f64
}

/// The sum over `n` workers of [`value`].
fn summed(i: usize, n: usize, round: usize) -> f64 {
    (0..n).map(|r| value(i, r, round)).sum()
}

fn array(len: usize, dtype: DType, f: impl Fn(usize) -> f64) -> Result<NDArray> {
    let data: Vec<f64> = (0..len).map(f).collect();
    let a = NDArray::from_vec([len], data)?;
    Ok(if dtype == DType::F64 { a } else { a.as_type(dtype)? })
}

/// Checks `out` element by element against `want`.
fn exact(what: &str, out: &NDArray, want: impl Fn(usize) -> f64) -> Result<()> {
    let got = out.to_vec::<f64>()?;
    if let Some((i, g)) = got.iter().enumerate().find(|(i, g)| **g != want(*i)) {
        bail!("{what}: element {i} of {} is {g}, expected {}", got.len(), want(i));
    }
    Ok(())
}

pub(super) fn partitions(kv: &KVStore, args: &DistArgs) -> Result<()> {
    let (rank, n) = (kv.rank(), kv.num_workers());
    // Odd sizes: parts end anywhere, the last ones short.
    let dense = [("p-f32", 777_777usize, DType::F32), ("p-f16", 100_003, DType::F16)];
    for (k, len, dtype) in dense {
        kv.init(k, &array(len, dtype, |_| 0.0)?)?;
    }
    for round in 0..args.repeat {
        for (k, len, dtype) in dense {
            // The parts are sent from the array's own memory: overwriting it right away waits
            // until every part has been written out, and never changes what was pushed.
            let pushed = array(len, dtype, |i| value(i, rank, round))?;
            kv.push(k, &pushed)?;
            pushed.fill(-1000.0)?;
            let out = array(len, dtype, |_| -1.0)?;
            kv.pull(k, &out)?;
            exact(&format!("push + pull of {k}, round {round}"), &out, |i| summed(i, n, round))?;
            // Pushpull of the next values: one request per part, answered with the sum.
            let out = array(len, dtype, |_| -1.0)?;
            kv.pushpull(k, &array(len, dtype, |i| value(i, rank, round + 1))?, &out)?;
            exact(&format!("pushpull of {k}, round {round}"), &out, |i| summed(i, n, round + 1))?;
        }
        // Two devices' values: summed on the worker, then sent as one operation.
        let (k, len, dtype) = dense[0];
        let two: Vec<NDArray> = (0..2).map(|_| array(len, dtype, |i| value(i, rank, round))).collect::<Result<_>>()?;
        kv.push(vec![k], &vec![two])?;
        let out = array(len, dtype, |_| -1.0)?;
        kv.pull(k, &out)?;
        exact(&format!("push of two devices' values of {k}, round {round}"), &out, |i| 2.0 * summed(i, n, round))?;
        // A pull into two devices' outputs, one of another dtype: the first is written
        // straight from the socket (over TCP), the second gets a copy.
        let outs = vec![array(len, dtype, |_| -1.0)?, array(len, DType::F16, |_| -1.0)?];
        kv.pull(vec![k], &vec![outs.clone()])?;
        for (d, out) in outs.iter().enumerate() {
            exact(&format!("pull into output {d} of two, {k}, round {round}"), out, |i| 2.0 * summed(i, n, round))?;
        }
    }
    row_sparse(kv, rank, n)?;
    // The server's optimizer, `w += 2·g`, on every part.
    kv.set_optimizer(Optimizer::test().with_rescale_grad(RATE))?;
    let len = 654_321;
    let w0 = |i: usize| (i % 13) as f64;
    kv.init("p-opt", &array(len, DType::F32, w0)?)?;
    for round in 0..args.repeat {
        kv.push("p-opt", &array(len, DType::F32, |i| value(i, rank, round))?)?;
        let out = array(len, DType::F32, |_| -1.0)?;
        kv.pull("p-opt", &out)?;
        exact(&format!("server optimizer, round {round}"), &out, |i| w0(i) + RATE * (0..=round).map(|r| summed(i, n, r)).sum::<f64>())?;
    }
    // 2-bit compression: ±1 and 0 gradients quantize to ±0.5 and 0 every round (threshold 0.5),
    // whatever the residual; the optimizer adds 2·n·(±0.5) per round.
    kv.set_gradient_compression([("type", "2bit"), ("threshold", "0.5")])?;
    let len = 300_007;
    let sign = |i: usize| [1.0, -1.0, 0.0][i % 3];
    kv.init("p-2bit", &array(len, DType::F32, |_| 0.0)?)?;
    for round in 0..args.repeat {
        kv.push("p-2bit", &array(len, DType::F32, sign)?)?;
        let out = array(len, DType::F32, |_| -7.0)?;
        kv.pull("p-2bit", &out)?;
        exact(&format!("2-bit push, round {round}"), &out, |i| RATE * n as f64 * 0.5 * sign(i) * (round + 1) as f64)?;
    }
    landed_over_tcp()
}

/// Without shared memory every answer comes over the socket: the large ones must have been
/// read straight into their outputs (`synkv_landed_bytes_total`, issue 13 item 2).
fn landed_over_tcp() -> Result<()> {
    if std::env::var("SYNKV_SHM").as_deref() != Ok("0") {
        return Ok(());
    }
    let metrics = synkv::ps::metrics::render();
    let landed =
        metrics.lines().find_map(|l| l.strip_prefix("synkv_landed_bytes_total ")).and_then(|v| v.trim().parse::<f64>().ok()).unwrap_or(0.0);
    if landed <= 0.0 {
        bail!("over TCP no answer was read straight into its output (synkv_landed_bytes_total {landed})");
    }
    println!("partitions: {landed} answer bytes read straight into the outputs");
    Ok(())
}

/// A row_sparse key of 20,011 rows of 33: worker r pushes the rows `j` with `j % (r + 2) == 0`,
/// row `j` element `c` = `(j + c) % 50 + r`; a pull of the rows `j % 3 == 1` and the last gets each
/// row's sum over the workers that pushed it (assign), 0 for rows nobody pushed.
fn row_sparse(kv: &KVStore, rank: usize, n: usize) -> Result<()> {
    let (rows, row_len) = (20_011usize, 33usize);
    let shape = vec![rows, row_len];
    let zeros = NDArray::row_sparse(shape.clone(), vec![], Buffer::from_vec(Vec::<f32>::new()), Context::cpu(0))?;
    kv.init("p-rows", &zeros)?;
    let cell = |j: usize, c: usize, r: usize| ((j + c) % 50 + r) as f32;
    let mine: Vec<usize> = (0..rows).filter(|j| j % (rank + 2) == 0).collect();
    let data: Vec<f32> = mine.iter().flat_map(|&j| (0..row_len).map(move |c| cell(j, c, rank))).collect();
    let ids: Vec<i64> = mine.iter().map(|&j| j as i64).collect();
    kv.push("p-rows", &NDArray::row_sparse(shape.clone(), ids, Buffer::from_vec(data), Context::cpu(0))?)?;
    let mut want_ids: Vec<i64> = (0..rows as i64).filter(|j| j % 3 == 1).collect();
    want_ids.push(rows as i64 - 1);
    let id_array = NDArray::from_vec([want_ids.len()], want_ids.iter().map(|&i| i as f32).collect::<Vec<f32>>())?;
    let out = NDArray::row_sparse_zeros(shape, DType::F32, Context::cpu(0));
    kv.row_sparse_pull("p-rows", &out, &id_array)?;
    if out.indices()? != want_ids {
        bail!("row_sparse_pull of p-rows: the output holds other rows than the {} asked for", want_ids.len());
    }
    let dense = out.to_vec::<f64>()?;
    for (j, row) in dense.chunks(row_len).enumerate() {
        let asked = want_ids.binary_search(&(j as i64)).is_ok();
        for (c, got) in row.iter().enumerate() {
            let want: f64 = if asked { (0..n).filter(|r| j % (r + 2) == 0).map(|r| f64::from(cell(j, c, r))).sum() } else { 0.0 };
            if *got != want {
                bail!("row_sparse_pull of p-rows: row {j} element {c} is {got}, expected {want}");
            }
        }
    }
    Ok(())
}
