//! Row_sparse scenarios on a dist store: MXNet's nightly T25, T26, T27 (spec K11) under the
//! Test optimizer `w += 2·g`. Every key is initialised with all rows equal to one.

use anyhow::{bail, Result};
use synkv::ndarray::Buffer;
use synkv::optimizer::Optimizer;
use synkv::{Context, DType, KVStore, NDArray};

use super::cases::{full, RATE};
use super::DistArgs;

/// A row_sparse array holding `rows` (sorted), each element `value`.
fn rsp(shape: &[usize], rows: &[i64], value: f64, dtype: DType) -> Result<NDArray> {
    let row_len: usize = shape[1..].iter().product();
    Ok(NDArray::row_sparse(shape.to_vec(), rows.to_vec(), Buffer::filled(dtype, rows.len() * row_len, value), Context::cpu(0))?)
}

fn all_rows(shape: &[usize], value: f64, dtype: DType) -> Result<NDArray> {
    let rows: Vec<i64> = (0..shape[0] as i64).collect();
    rsp(shape, &rows, value, dtype)
}

/// Pulls `ids` (any order, repeats allowed, f32 like upstream) and checks the output holds
/// exactly the sorted unique ids, row `j` equal to `want(j)`.
fn pull_rows(kv: &KVStore, key: &str, shape: &[usize], dtype: DType, ids: &[i64], want: impl Fn(i64) -> f64, tol: f64) -> Result<()> {
    let id_array = NDArray::from_vec([ids.len()], ids.iter().map(|&i| i as f32).collect::<Vec<f32>>())?;
    let out = NDArray::row_sparse_zeros(shape.to_vec(), dtype, Context::cpu(0));
    kv.row_sparse_pull(key, &out, &id_array)?;
    let mut expected_ids = ids.to_vec();
    expected_ids.sort_unstable();
    expected_ids.dedup();
    let got_ids = out.indices()?;
    if got_ids != expected_ids {
        bail!("key {key}: pulled rows {got_ids:?}, expected {expected_ids:?}");
    }
    let dense = out.to_vec::<f64>()?;
    let row_len: usize = shape[1..].iter().product();
    for (row, chunk) in dense.chunks(row_len.max(1)).enumerate() {
        let row = row as i64;
        let w = if expected_ids.binary_search(&row).is_ok() { want(row) } else { 0.0 };
        if let Some(got) = chunk.iter().find(|x| (**x - w).abs() > tol * w.abs().max(1.0)) {
            bail!("key {key}: row {row} holds {got}, expected {w}");
        }
    }
    Ok(())
}

/// T25: keys '9' (f32) and '10' (f16), 2×3; worker r pushes row `r mod 2` = `r+1`; a pull of
/// rows gives `1 + rate·(i+1)·Σ_{r: r mod 2 = row} (r+1)` for the requested rows, 0 elsewhere.
pub(super) fn t25(kv: &KVStore, args: &DistArgs) -> Result<()> {
    kv.set_optimizer(Optimizer::test().with_rescale_grad(RATE))?;
    let (rank, n) = (kv.rank(), kv.num_workers());
    let shape = [2usize, 3];
    let keys = [("9", DType::F32, 1e-6), ("10", DType::F16, 1e-3)];
    for (k, dtype, _) in keys {
        kv.init(k, &all_rows(&shape, 1.0, dtype)?)?;
    }
    for i in 0..args.repeat {
        for (k, dtype, _) in keys {
            kv.push(k, &rsp(&shape, &[(rank % 2) as i64], (rank + 1) as f64, dtype)?)?;
        }
        let want = |row: i64| 1.0 + RATE * (i + 1) as f64 * (0..n).filter(|r| (r % 2) as i64 == row).map(|r| (r + 1) as f64).sum::<f64>();
        for (k, dtype, tol) in keys {
            pull_rows(kv, k, &shape, dtype, &[1, 0, 1], want, tol)?;
            pull_rows(kv, k, &shape, dtype, &[1], want, tol)?;
        }
    }
    Ok(())
}

/// T26: pushes of row_sparse values with no rows change nothing (`w += 0`); a pull of every
/// row gives 1, a pull of no rows gives an empty (all-zero) output. Small and split keys.
pub(super) fn t26(kv: &KVStore) -> Result<()> {
    kv.set_optimizer(Optimizer::test().with_rescale_grad(RATE))?;
    let keys: [(&str, [usize; 2]); 2] = [("11", [2, 3]), ("97", [1200, 1200])];
    for (k, shape) in &keys {
        kv.init(*k, &all_rows(shape, 1.0, DType::F32)?)?;
    }
    for (k, shape) in &keys {
        kv.push(*k, &NDArray::row_sparse_zeros(shape.to_vec(), DType::F32, Context::cpu(0)))?;
        let every: Vec<i64> = (0..shape[0] as i64).collect();
        pull_rows(kv, k, shape, DType::F32, &every, |_| 1.0, 0.0)?;
        pull_rows(kv, k, shape, DType::F32, &[], |_| 0.0, 0.0)?;
    }
    // A dense pull of a row_sparse key gives every row.
    let out = full(&[2, 3], 0.0, DType::F32);
    kv.pull("11", &out)?;
    super::expect_all("dense pull of a row_sparse key", &out, 1.0, 0.0)
}

/// T27: a big row_sparse key (1200×1200, split by rows over the servers); worker r updates
/// every `2(r+1)`-th row with `r+1`: row j holds `1 + rate·(i+1)·Σ_{r: 2(r+1) | j} (r+1)`.
pub(super) fn t27(kv: &KVStore, args: &DistArgs) -> Result<()> {
    kv.set_optimizer(Optimizer::test().with_rescale_grad(RATE))?;
    let (rank, n) = (kv.rank(), kv.num_workers());
    let shape = [1200usize, 1200];
    kv.init("98", &all_rows(&shape, 1.0, DType::F32)?)?;
    let step = 2 * (rank as i64 + 1);
    let mine: Vec<i64> = (0..shape[0] as i64).filter(|j| j % step == 0).collect();
    let mut ids: Vec<i64> = (0..shape[0] as i64).filter(|j| j % 7 == 0).collect();
    ids.extend([599, 600, 601, 1199, 5]);
    for i in 0..args.repeat {
        kv.push("98", &rsp(&shape, &mine, (rank + 1) as f64, DType::F32)?)?;
        let want = |row: i64| {
            1.0 + RATE * (i + 1) as f64 * (0..n as i64).filter(|r| row % (2 * (r + 1)) == 0).map(|r| (r + 1) as f64).sum::<f64>()
        };
        pull_rows(kv, "98", &shape, DType::F32, &ids, want, 1e-6)?;
    }
    Ok(())
}
