//! [`Storage`]: how an array's elements are laid out — dense, or row_sparse.

use super::{Buffer, DType};

/// The storage type of an array, fixed when the array is created.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StorageType {
    /// Every element stored, row-major.
    Dense,
    /// Only some rows stored: sorted unique row ids plus a dense block of those rows.
    RowSparse,
}

impl std::fmt::Display for StorageType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            StorageType::Dense => "default",
            StorageType::RowSparse => "row_sparse",
        })
    }
}

/// Row-sparse data: `indices` (sorted, unique) name the rows held in `data`, which holds
/// `indices.len() × row_len` elements.
#[derive(Clone, Debug, PartialEq)]
pub struct RowSparse {
    /// Sorted unique row ids.
    pub indices: Vec<i64>,
    /// The rows, one after another.
    pub data: Buffer,
}

/// The elements of an array.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Storage {
    /// A dense buffer of `shape.size()` elements.
    Dense(Buffer),
    /// Row-sparse rows.
    RowSparse(RowSparse),
}

impl Storage {
    /// The storage type.
    pub fn storage_type(&self) -> StorageType {
        match self {
            Storage::Dense(_) => StorageType::Dense,
            Storage::RowSparse(_) => StorageType::RowSparse,
        }
    }

    /// The dtype of the elements.
    pub fn dtype(&self) -> DType {
        match self {
            Storage::Dense(b) => b.dtype(),
            Storage::RowSparse(r) => r.data.dtype(),
        }
    }

    /// The dense buffer, if dense.
    pub fn dense(&self) -> Option<&Buffer> {
        match self {
            Storage::Dense(b) => Some(b),
            Storage::RowSparse(_) => None,
        }
    }

    /// The dense buffer, mutably, if dense.
    pub fn dense_mut(&mut self) -> Option<&mut Buffer> {
        match self {
            Storage::Dense(b) => Some(b),
            Storage::RowSparse(_) => None,
        }
    }

    /// An empty placeholder (used while an array's data is lent out).
    pub(crate) fn placeholder() -> Storage {
        Storage::Dense(Buffer::from_vec(Vec::<f32>::new()))
    }

    /// The data as a dense buffer of `rows × row_len` elements (a copy for row_sparse).
    pub fn to_dense_buffer(&self, rows: usize, row_len: usize) -> Buffer {
        match self {
            Storage::Dense(b) => b.clone(),
            Storage::RowSparse(r) => {
                let mut out = Buffer::zeros(r.data.dtype(), rows * row_len);
                for (i, &row) in r.indices.iter().enumerate() {
                    let row = row as usize;
                    if row < rows {
                        out.copy_range_from(row * row_len, &r.data, i * row_len, row_len);
                    }
                }
                out
            }
        }
    }
}
