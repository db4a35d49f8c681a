//! [`NDArray`]: construction, access, waiting and copies.

use std::fmt;
use std::sync::Arc;

use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::buffer::BufferElement;
use super::{Buffer, Context, DType, Error, Result, RowSparse, Shape, Storage, StorageType};
use crate::engine::{Engine, Var};

/// An n-dimensional array: a cheap, shared handle.
///
/// `Clone` shares the data (as an MXNet `NDArray` handle does); [`NDArray::deep_copy`] makes
/// an independent array. Reads and writes scheduled by a store run asynchronously, ordered by
/// the array's engine var; synchronous methods wait for them first.
#[derive(Clone)]
pub struct NDArray {
    inner: Arc<Inner>,
}

struct Inner {
    shape: Shape,
    dtype: DType,
    ctx: Context,
    stype: StorageType,
    var: Var,
    // The engine orders every access, so this lock is uncontended; it is here so the data can
    // be reached from pool threads without unsafe code (candle's Tensor makes the same trade).
    data: RwLock<Storage>,
}

impl NDArray {
    fn build(shape: Shape, ctx: Context, storage: Storage) -> NDArray {
        NDArray {
            inner: Arc::new(Inner {
                shape,
                dtype: storage.dtype(),
                ctx,
                stype: storage.storage_type(),
                var: Var::new(),
                data: RwLock::new(storage),
            }),
        }
    }

    /// A dense f32 array of zeros on `cpu(0)`.
    pub fn zeros(shape: impl Into<Shape>) -> NDArray {
        NDArray::full_with(shape, 0.0, DType::F32, Context::cpu(0))
    }

    /// A dense f32 array of zeros on `ctx`.
    pub fn zeros_on(shape: impl Into<Shape>, ctx: Context) -> NDArray {
        NDArray::full_with(shape, 0.0, DType::F32, ctx)
    }

    /// A dense array of zeros with the given dtype and context.
    pub fn zeros_with(shape: impl Into<Shape>, dtype: DType, ctx: Context) -> NDArray {
        NDArray::full_with(shape, 0.0, dtype, ctx)
    }

    /// A dense f32 array of ones on `cpu(0)`.
    pub fn ones(shape: impl Into<Shape>) -> NDArray {
        NDArray::full_with(shape, 1.0, DType::F32, Context::cpu(0))
    }

    /// A dense f32 array of ones on `ctx`.
    pub fn ones_on(shape: impl Into<Shape>, ctx: Context) -> NDArray {
        NDArray::full_with(shape, 1.0, DType::F32, ctx)
    }

    /// A dense f32 array on `cpu(0)` with every element `value`.
    pub fn full(shape: impl Into<Shape>, value: f64) -> NDArray {
        NDArray::full_with(shape, value, DType::F32, Context::cpu(0))
    }

    /// A dense array with every element `value` (converted to `dtype`).
    pub fn full_with(shape: impl Into<Shape>, value: f64, dtype: DType, ctx: Context) -> NDArray {
        let shape = shape.into();
        let buf = Buffer::filled(dtype, shape.size(), value);
        NDArray::build(shape, ctx, Storage::Dense(buf))
    }

    /// A dense array on `cpu(0)` owning `data` (row-major); its dtype is `T`'s.
    pub fn from_vec<T: BufferElement>(shape: impl Into<Shape>, data: Vec<T>) -> Result<NDArray> {
        NDArray::from_buffer(shape, T::into_buffer(data), Context::cpu(0))
    }

    /// A dense array on `cpu(0)` holding a copy of `data`.
    pub fn from_slice<T: BufferElement>(shape: impl Into<Shape>, data: &[T]) -> Result<NDArray> {
        NDArray::from_vec(shape, data.to_vec())
    }

    /// A dense array on `ctx` owning `buf`.
    pub fn from_buffer(shape: impl Into<Shape>, buf: Buffer, ctx: Context) -> Result<NDArray> {
        let shape = shape.into();
        if buf.len() != shape.size() {
            return Err(Error::LengthMismatch { op: "from_buffer", expected: shape.size(), got: buf.len(), shape });
        }
        Ok(NDArray::build(shape, ctx, Storage::Dense(buf)))
    }

    /// A row_sparse array of logical `shape` holding the rows `indices` (sorted, unique, each
    /// `< shape[0]`) with their data (`indices.len() × row_len` elements).
    pub fn row_sparse(shape: impl Into<Shape>, indices: Vec<i64>, data: Buffer, ctx: Context) -> Result<NDArray> {
        let shape = shape.into();
        let op = "row_sparse";
        if shape.ndim() == 0 {
            return Err(Error::UnsupportedStorage { op, stype: StorageType::RowSparse, hint: " for 0-d arrays" });
        }
        if data.len() != indices.len() * shape.row_len() {
            return Err(Error::LengthMismatch {
                op,
                shape: Shape::from(vec![indices.len(), shape.row_len()]),
                expected: indices.len() * shape.row_len(),
                got: data.len(),
            });
        }
        check_row_ids(op, &indices, shape.rows())?;
        Ok(NDArray::build(shape, ctx, Storage::RowSparse(RowSparse { indices, data })))
    }

    /// A row_sparse array with no stored row (all zeros).
    pub fn row_sparse_zeros(shape: impl Into<Shape>, dtype: DType, ctx: Context) -> NDArray {
        NDArray::build(shape.into(), ctx, Storage::RowSparse(RowSparse { indices: Vec::new(), data: Buffer::zeros(dtype, 0) }))
    }

    /// An array that takes `storage` as it is, with a fresh engine var (no pending operations).
    pub(crate) fn from_storage(shape: Shape, ctx: Context, storage: Storage) -> NDArray {
        NDArray::build(shape, ctx, storage)
    }

    /// The shape.
    pub fn shape(&self) -> &Shape {
        &self.inner.shape
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.inner.dtype
    }

    /// The device.
    pub fn context(&self) -> Context {
        self.inner.ctx
    }

    /// The storage type.
    pub fn storage_type(&self) -> StorageType {
        self.inner.stype
    }

    /// The number of logical elements (`shape.size()`).
    pub fn size(&self) -> usize {
        self.inner.shape.size()
    }

    /// Whether `self` and `other` are handles to the same array.
    pub fn is_same(&self, other: &NDArray) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// A number that only this array's handles share while it lives (to find one array among
    /// many with a hash set, where [`NDArray::is_same`] would compare every pair).
    pub(crate) fn identity(&self) -> usize {
        Arc::as_ptr(&self.inner) as usize
    }

    /// Whether another handle to this array exists.
    pub(crate) fn is_shared(&self) -> bool {
        Arc::strong_count(&self.inner) > 1
    }

    /// The engine variable that orders operations on this array.
    pub fn var(&self) -> &Var {
        &self.inner.var
    }

    /// Read access to the data. Callers inside engine operations hold the var; others must
    /// wait first ([`NDArray::wait_to_read`]).
    pub(crate) fn storage(&self) -> RwLockReadGuard<'_, Storage> {
        // Recursive: one array may be read twice by one operation (pushed twice in a list).
        self.inner.data.read_recursive()
    }

    /// The lock around the data (`lend.rs` holds it past a guard; tests check who holds it).
    pub(crate) fn data_lock(&self) -> &RwLock<Storage> {
        &self.inner.data
    }

    /// Write access to the data (see [`NDArray::storage`]).
    pub(crate) fn storage_mut(&self) -> RwLockWriteGuard<'_, Storage> {
        self.inner.data.write()
    }

    /// Blocks until every pending write to this array has completed; returns the error of a
    /// failed operation that wrote it, if any.
    pub fn wait_to_read(&self) -> Result<()> {
        Engine::global().wait_to_read(&self.inner.var).map_err(Error::from)
    }

    /// Blocks until every pending read and write of this array has completed.
    pub fn wait_to_write(&self) -> Result<()> {
        Engine::global().wait_to_write(&self.inner.var).map_err(Error::from)
    }

    /// Lends the dense buffer to `f`, after pending reads and writes of this array complete.
    ///
    /// `f` may change the elements in place, or move the buffer out (to lend its memory to
    /// another runtime without copying, as the Python updater does) provided it puts back a
    /// buffer of the same dtype and length. A buffer that does not fit is replaced by zeros and
    /// reported as an error, so the array's shape and dtype always describe its data. A
    /// row_sparse array is an error.
    ///
    /// `f` runs with the array's data locked: it must not use this array (or a clone of it).
    pub fn with_dense_mut<R>(&self, f: impl FnOnce(&mut Buffer) -> R) -> Result<R> {
        let op = "with_dense_mut";
        if self.storage_type() != StorageType::Dense {
            return Err(Error::UnsupportedStorage { op, stype: self.storage_type(), hint: "; use a dense array" });
        }
        self.wait_to_write()?;
        let mut data = self.storage_mut();
        let Some(buf) = data.dense_mut() else {
            return Err(Error::UnsupportedStorage { op, stype: StorageType::RowSparse, hint: "; use a dense array" });
        };
        let out = f(buf);
        if buf.dtype() != self.dtype() {
            let got = buf.dtype();
            *buf = Buffer::zeros(self.dtype(), self.size());
            return Err(Error::DTypeMismatch { op, lhs: self.dtype(), rhs: got });
        }
        if buf.len() != self.size() {
            let got = buf.len();
            *buf = Buffer::zeros(self.dtype(), self.size());
            return Err(Error::LengthMismatch { op, shape: self.shape().clone(), expected: self.size(), got });
        }
        Ok(out)
    }

    /// The elements, densified and converted to `T`, after pending writes complete.
    pub fn to_vec<T: BufferElement>(&self) -> Result<Vec<T>> {
        self.wait_to_read()?;
        let data = self.storage();
        Ok(match &*data {
            Storage::Dense(b) => b.to_vec(),
            other => other.to_dense_buffer(self.shape().rows(), self.shape().row_len()).to_vec(),
        })
    }

    /// The stored row ids of a row_sparse array (after pending writes complete).
    pub fn indices(&self) -> Result<Vec<i64>> {
        self.wait_to_read()?;
        match &*self.storage() {
            Storage::RowSparse(r) => Ok(r.indices.clone()),
            _ => {
                Err(Error::UnsupportedStorage { op: "indices", stype: self.storage_type(), hint: "; only row_sparse arrays have row ids" })
            }
        }
    }

    /// A snapshot of the storage (after pending writes complete).
    pub fn storage_snapshot(&self) -> Result<Storage> {
        self.wait_to_read()?;
        Ok(self.storage().clone())
    }

    /// A new, independent dense copy on the same context (waits for pending writes).
    pub fn deep_copy(&self) -> Result<NDArray> {
        let snap = self.storage_snapshot()?;
        Ok(NDArray::build(self.shape().clone(), self.context(), snap))
    }

    /// A dense copy (a row_sparse array is densified; a dense array is deep-copied).
    pub fn to_dense(&self) -> Result<NDArray> {
        self.wait_to_read()?;
        let buf = self.storage().to_dense_buffer(self.shape().rows(), self.shape().row_len());
        NDArray::from_buffer(self.shape().clone(), buf, self.context())
    }

    /// Copies this array into `dst` (same shape; dtypes are converted), after pending
    /// operations on both complete. A row_sparse source is densified into a dense `dst`.
    pub fn copy_to(&self, dst: &NDArray) -> Result<()> {
        if self.is_same(dst) {
            return Ok(());
        }
        if self.shape() != dst.shape() {
            return Err(Error::ShapeMismatch { op: "copy_to", lhs: dst.shape().clone(), rhs: self.shape().clone() });
        }
        if dst.storage_type() != StorageType::Dense {
            return Err(Error::UnsupportedStorage {
                op: "copy_to",
                stype: dst.storage_type(),
                hint: " as destination; copy into a dense array",
            });
        }
        self.wait_to_read()?;
        dst.wait_to_write()?;
        let src = self.storage();
        let mut out = dst.storage_mut();
        if let Some(db) = out.dense_mut() {
            match &*src {
                Storage::Dense(sb) => db.assign_cast(sb),
                other => db.assign_cast(&other.to_dense_buffer(self.shape().rows(), self.shape().row_len())),
            }
        }
        Ok(())
    }

    /// A dense copy of this array on another context.
    pub fn copy_to_context(&self, ctx: Context) -> Result<NDArray> {
        let out = NDArray::zeros_with(self.shape().clone(), self.dtype(), ctx);
        self.copy_to(&out)?;
        Ok(out)
    }

    /// A dense copy converted to `dtype`.
    pub fn as_type(&self, dtype: DType) -> Result<NDArray> {
        self.wait_to_read()?;
        let buf = self.storage().to_dense_buffer(self.shape().rows(), self.shape().row_len()).cast(dtype);
        NDArray::from_buffer(self.shape().clone(), buf, self.context())
    }
}

/// Checks that row ids are sorted, unique and below `rows`.
pub(crate) fn check_row_ids(op: &'static str, ids: &[i64], rows: usize) -> Result<()> {
    for w in ids.windows(2) {
        if w[0] >= w[1] {
            return Err(Error::InvalidRowIds { op, reason: format!("ids must be sorted and unique, found {} before {}", w[0], w[1]) });
        }
    }
    if let Some(&bad) = ids.iter().find(|&&i| i < 0 || i as u64 >= rows as u64) {
        return Err(Error::InvalidRowIds { op, reason: format!("row id {bad} is outside 0..{rows}") });
    }
    Ok(())
}

impl fmt::Debug for NDArray {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NDArray")
            .field("shape", self.shape())
            .field("dtype", &self.dtype())
            .field("context", &self.context())
            .field("stype", &self.storage_type())
            .finish()
    }
}

/// Prints the elements in PDL's nested-bracket style, e.g. `[\n [2 2 2]\n [2 2 2]\n]` for a
/// 2×3 array of twos (waits for pending writes; prints the error instead if one failed).
///
/// Because formatting waits, `println!("{a}")` holds the stdout lock while `a`'s pending
/// operations run; if one of them prints (an updater that logs), that is a deadlock. Wait
/// first (`a.wait_to_read()`), or format into a `String` before printing.
impl fmt::Display for NDArray {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let values = match self.to_vec::<f64>() {
            Ok(v) => v,
            Err(e) => return write!(f, "<error: {e}>"),
        };
        let dims = self.shape().dims();
        match dims.len() {
            0 => write!(f, "{}", values.first().copied().unwrap_or(0.0)),
            1 => write_row(f, &values),
            _ => {
                let row_len = self.shape().row_len();
                writeln!(f, "[")?;
                for row in values.chunks(row_len.max(1)) {
                    write!(f, " ")?;
                    write_row(f, row)?;
                    writeln!(f)?;
                }
                write!(f, "]")
            }
        }
    }
}

fn write_row(f: &mut fmt::Formatter<'_>, row: &[f64]) -> fmt::Result {
    write!(f, "[")?;
    for (i, v) in row.iter().enumerate() {
        if i > 0 {
            write!(f, " ")?;
        }
        write!(f, "{v}")?;
    }
    write!(f, "]")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constructors() {
        let a = NDArray::ones([2, 3]);
        assert_eq!(a.to_vec::<f32>().unwrap(), vec![1.0; 6]);
        assert_eq!(a.dtype(), DType::F32);
        let b = NDArray::full_with([2], 2.5, DType::F64, Context::cpu(1));
        assert_eq!(b.to_vec::<f64>().unwrap(), vec![2.5, 2.5]);
        assert_eq!(b.context(), Context::cpu(1));
        assert!(NDArray::from_vec([2, 2], vec![1.0f32; 3]).is_err());
        assert_eq!(NDArray::from_vec([3], vec![1i64, 2, 3]).unwrap().dtype(), DType::I64);
    }

    #[test]
    fn clone_shares_deep_copy_does_not() {
        let a = NDArray::zeros([3]);
        let b = a.clone();
        assert!(a.is_same(&b));
        let c = a.deep_copy().unwrap();
        assert!(!a.is_same(&c));
    }

    #[test]
    fn copy_to_and_context() {
        let a = NDArray::from_vec([3], vec![1.0f32, 2.0, 3.0]).unwrap();
        let b = NDArray::zeros_with([3], DType::F64, Context::cpu(2));
        a.copy_to(&b).unwrap();
        assert_eq!(b.to_vec::<f64>().unwrap(), vec![1.0, 2.0, 3.0]);
        let c = a.copy_to_context(Context::cpu(3)).unwrap();
        assert_eq!(c.context(), Context::cpu(3));
        assert_eq!(c.to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0]);
        assert!(a.copy_to(&NDArray::zeros([4])).is_err());
    }

    #[test]
    fn display_is_pdl_style() {
        let a = NDArray::full([2, 3], 2.0);
        assert_eq!(a.to_string(), "[\n [2 2 2]\n [2 2 2]\n]");
        assert_eq!(NDArray::from_vec([3], vec![1.5f32, 0.0, -2.0]).unwrap().to_string(), "[1.5 0 -2]");
    }

    #[test]
    fn with_dense_mut_lends_the_buffer_and_keeps_the_invariants() {
        let a = NDArray::from_vec([3], vec![1.0f32, 2.0, 3.0]).unwrap();
        // moved out and put back: no copy, the values survive
        let n = a
            .with_dense_mut(|b| {
                let taken = std::mem::replace(b, Buffer::from_vec(Vec::<f32>::new()));
                let n = taken.len();
                *b = taken;
                n
            })
            .unwrap();
        assert_eq!(n, 3);
        a.with_dense_mut(|b| b.assign_cast(&Buffer::from_vec(vec![4.0f32, 5.0, 6.0]))).unwrap();
        assert_eq!(a.to_vec::<f32>().unwrap(), vec![4.0, 5.0, 6.0]);
        // a buffer that does not fit is refused and replaced by zeros
        let err = a.with_dense_mut(|b| *b = Buffer::from_vec(vec![1.0f32])).unwrap_err();
        assert!(matches!(err, Error::LengthMismatch { expected: 3, got: 1, .. }), "{err:?}");
        assert_eq!(a.to_vec::<f32>().unwrap(), vec![0.0; 3]);
        let err = a.with_dense_mut(|b| *b = Buffer::from_vec(vec![1.0f64; 3])).unwrap_err();
        assert!(matches!(err, Error::DTypeMismatch { .. }), "{err:?}");
        assert_eq!(a.dtype(), DType::F32);
        let rs = NDArray::row_sparse_zeros([2, 2], DType::F32, Context::cpu(0));
        assert!(rs.with_dense_mut(|_| ()).is_err());
    }

    #[test]
    fn row_sparse_round_trip() {
        let rs = NDArray::row_sparse([4, 2], vec![1, 3], Buffer::from_vec(vec![1.0, 2.0, 3.0, 4.0f32]), Context::cpu(0)).unwrap();
        assert_eq!(rs.storage_type(), StorageType::RowSparse);
        assert_eq!(rs.to_vec::<f32>().unwrap(), vec![0.0, 0.0, 1.0, 2.0, 0.0, 0.0, 3.0, 4.0]);
        assert_eq!(rs.indices().unwrap(), vec![1, 3]);
        assert!(NDArray::row_sparse([4, 2], vec![3, 1], Buffer::from_vec(vec![0.0f32; 4]), Context::cpu(0)).is_err());
        assert!(NDArray::row_sparse([4, 2], vec![4], Buffer::from_vec(vec![0.0f32; 2]), Context::cpu(0)).is_err());
        assert!(NDArray::row_sparse([4, 2], vec![1], Buffer::from_vec(vec![0.0f32; 3]), Context::cpu(0)).is_err());
    }
}
