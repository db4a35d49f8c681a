//! Row-sparse kernels: summing row_sparse values (row union) and gathering rows by id.
//!
//! A row_sparse value is sorted unique row ids plus a dense block holding those rows. These
//! functions work on [`Storage`] and [`Buffer`] directly (no engine, no waiting), so the store
//! calls them from inside engine operations. Costs scale with the rows touched, never with the
//! logical number of rows of the array.

use super::{Buffer, DType, RowSparse, Storage};

/// Sorts and de-duplicates row ids (spec K5.10: ids arrive in any order, with repeats).
pub fn normalize_row_ids(ids: &mut Vec<i64>) {
    ids.sort_unstable();
    ids.dedup();
}

/// The sum of several values of one key, each dense or row_sparse, as a row_sparse value
/// whose rows are the union of the inputs' rows (a dense input contributes every row).
pub fn sum_row_sparse(parts: &[&Storage], rows: usize, row_len: usize, dtype: DType) -> RowSparse {
    // Union of the row ids.
    let mut union: Vec<i64> = Vec::new();
    for p in parts {
        match p {
            Storage::Dense(_) => {
                union = (0..rows as i64).collect();
                break;
            }
            Storage::RowSparse(r) => union.extend_from_slice(&r.indices),
        }
    }
    normalize_row_ids(&mut union);
    let mut data = Buffer::zeros(dtype, union.len() * row_len);
    for p in parts {
        match p {
            Storage::Dense(b) => {
                // union is every row here
                data.add_range_from(0, b, 0, rows * row_len);
            }
            Storage::RowSparse(r) => {
                let mut pos = 0usize;
                for (i, &id) in r.indices.iter().enumerate() {
                    // both lists are sorted: walk forward
                    while union[pos] != id {
                        pos += 1;
                    }
                    data.add_range_from(pos * row_len, &r.data, i * row_len, row_len);
                }
            }
        }
    }
    RowSparse { indices: union, data }
}

/// The rows `ids` (sorted, unique, in range) of a stored value, as a row_sparse value with
/// exactly those ids; rows the stored value does not hold are zeros (spec K5.11).
pub fn gather_rows(stored: &Storage, rows: usize, row_len: usize, ids: &[i64], dtype: DType) -> RowSparse {
    let mut data = Buffer::zeros(dtype, ids.len() * row_len);
    match stored {
        Storage::Dense(b) => {
            for (i, &id) in ids.iter().enumerate() {
                data.copy_range_from(i * row_len, b, id as usize * row_len, row_len);
            }
        }
        Storage::RowSparse(r) if holds_every_row(r, rows) => {
            // Every row present: row id = position.
            for (i, &id) in ids.iter().enumerate() {
                data.copy_range_from(i * row_len, &r.data, id as usize * row_len, row_len);
            }
        }
        Storage::RowSparse(r) => {
            // Galloping search from the last position: O(ids · log gap), never a walk over
            // the stored rows (a full embedding table holds millions).
            let mut pos = 0usize;
            for (i, &id) in ids.iter().enumerate() {
                pos = gallop(&r.indices, pos, id);
                if pos < r.indices.len() && r.indices[pos] == id {
                    data.copy_range_from(i * row_len, &r.data, pos * row_len, row_len);
                }
            }
        }
    }
    RowSparse { indices: ids.to_vec(), data }
}

/// Whether a row_sparse value of `rows` logical rows holds every one of them (its ids are
/// sorted and unique, so holding `rows` of them means holding `0..rows`).
fn holds_every_row(r: &RowSparse, rows: usize) -> bool {
    rows > 0 && r.indices.len() == rows
}

/// The first position `>= from` whose id is `>= id`, in sorted `ids`: exponential steps,
/// then a binary search inside the last step.
fn gallop(ids: &[i64], from: usize, id: i64) -> usize {
    let mut lo = from;
    let mut step = 1;
    let mut hi = from;
    while hi < ids.len() && ids[hi] < id {
        lo = hi + 1;
        hi += step;
        step *= 2;
    }
    let hi = hi.min(ids.len());
    lo + ids[lo..hi].partition_point(|&x| x < id)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rsp(ids: &[i64], vals: &[f32]) -> Storage {
        Storage::RowSparse(RowSparse { indices: ids.to_vec(), data: Buffer::from_vec(vals.to_vec()) })
    }

    #[test]
    fn sum_is_row_union() {
        let a = rsp(&[0, 2], &[1.0, 1.0, 2.0, 2.0]);
        let b = rsp(&[2, 3], &[10.0, 10.0, 5.0, 5.0]);
        let s = sum_row_sparse(&[&a, &b], 4, 2, DType::F32);
        assert_eq!(s.indices, vec![0, 2, 3]);
        assert_eq!(s.data, Buffer::from_vec(vec![1.0, 1.0, 12.0, 12.0, 5.0, 5.0f32]));
    }

    #[test]
    fn sum_with_dense_part_covers_every_row() {
        let a = rsp(&[1], &[1.0]);
        let d = Storage::Dense(Buffer::from_vec(vec![1.0, 1.0, 1.0f32]));
        let s = sum_row_sparse(&[&a, &d], 3, 1, DType::F32);
        assert_eq!(s.indices, vec![0, 1, 2]);
        assert_eq!(s.data, Buffer::from_vec(vec![1.0, 2.0, 1.0f32]));
    }

    #[test]
    fn gather_fills_missing_rows_with_zeros() {
        let stored = rsp(&[1, 3], &[1.0, 1.0, 3.0, 3.0]);
        let g = gather_rows(&stored, 4, 2, &[0, 3], DType::F32);
        assert_eq!(g.indices, vec![0, 3]);
        assert_eq!(g.data, Buffer::from_vec(vec![0.0, 0.0, 3.0, 3.0f32]));
        let dense = Storage::Dense(Buffer::from_vec(vec![0.0, 1.0, 2.0, 3.0f32]));
        assert_eq!(gather_rows(&dense, 4, 1, &[1, 2], DType::F32).data, Buffer::from_vec(vec![1.0, 2.0f32]));
        // a full table takes the direct path, a partial one the search — also when the
        // partial one holds rows 0..k of more rows (pulling row k reads nothing)
        let prefix = rsp(&[0, 1, 2], &[5.0, 6.0, 7.0]);
        assert_eq!(gather_rows(&prefix, 4, 1, &[2, 3], DType::F32).data, Buffer::from_vec(vec![7.0, 0.0f32]));
        let full = rsp(&[0, 1, 2], &[5.0, 6.0, 7.0]);
        assert_eq!(gather_rows(&full, 3, 1, &[0, 2], DType::F32).data, Buffer::from_vec(vec![5.0, 7.0f32]));
        let partial = rsp(&[2, 5, 9, 11, 40], &[1.0, 2.0, 3.0, 4.0, 5.0]);
        assert_eq!(
            gather_rows(&partial, 50, 1, &[0, 5, 10, 11, 40, 41], DType::F32).data,
            Buffer::from_vec(vec![0.0, 2.0, 0.0, 4.0, 5.0, 0.0f32])
        );
        for (i, want) in [(0, 0), (2, 0), (3, 1), (9, 2), (12, 4), (41, 5)] {
            assert_eq!(gallop(&[2, 5, 9, 11, 40], 0, i), want, "gallop to {i}");
        }
        let mut ids = vec![3, 1, 3, 0];
        normalize_row_ids(&mut ids);
        assert_eq!(ids, vec![0, 1, 3]);
    }
}
