//! Elementwise arithmetic: `+ - *` with scalars and arrays, out of place and in place.
//!
//! These are conveniences around a store (an updater's `stored += input * 3`), computed
//! synchronously on the calling thread after waiting for pending writes. Operands must be
//! dense with equal shapes and dtypes; anything else is a typed [`Error`], never a panic, so
//! the operator impls return `Result<NDArray>`: `let y = (&x * 3.0)?;`.

use std::ops::{Add, Mul, Sub};

use super::{Buffer, Error, NDArray, Result, Storage, StorageType};
use crate::kernels::{self, Element};
use crate::{with_buffer, with_buffer_pair};

#[derive(Clone, Copy)]
enum BinOp {
    Add,
    Sub,
    Mul,
}

impl BinOp {
    fn name(self) -> &'static str {
        match self {
            BinOp::Add => "add",
            BinOp::Sub => "sub",
            BinOp::Mul => "mul",
        }
    }

    #[inline]
    fn apply(self, a: f64, b: f64) -> f64 {
        match self {
            BinOp::Add => a + b,
            BinOp::Sub => a - b,
            BinOp::Mul => a * b,
        }
    }
}

fn zip_in_place<T: Element>(dst: &mut [T], src: &[T], op: BinOp) {
    match op {
        BinOp::Add => kernels::add_into(dst, src),
        _ => {
            for (d, s) in dst.iter_mut().zip(src) {
                *d = T::from_f64(op.apply(d.to_f64(), s.to_f64()));
            }
        }
    }
}

fn scalar_in_place<T: Element>(dst: &mut [T], s: f64, op: BinOp) {
    match op {
        BinOp::Mul => kernels::scale(dst, s),
        _ => {
            for d in dst.iter_mut() {
                *d = T::from_f64(op.apply(d.to_f64(), s));
            }
        }
    }
}

impl NDArray {
    fn check_dense(&self, op: &'static str) -> Result<()> {
        if self.storage_type() != StorageType::Dense {
            return Err(Error::UnsupportedStorage { op, stype: self.storage_type(), hint: "; densify with to_dense() first" });
        }
        Ok(())
    }

    fn check_pair(&self, other: &NDArray, op: &'static str) -> Result<()> {
        self.check_dense(op)?;
        other.check_dense(op)?;
        if self.shape() != other.shape() {
            return Err(Error::ShapeMismatch { op, lhs: self.shape().clone(), rhs: other.shape().clone() });
        }
        if self.dtype() != other.dtype() {
            return Err(Error::DTypeMismatch { op, lhs: self.dtype(), rhs: other.dtype() });
        }
        Ok(())
    }

    fn binary_assign(&self, other: &NDArray, op: BinOp) -> Result<()> {
        self.check_pair(other, op.name())?;
        self.wait_to_write()?;
        other.wait_to_read()?;
        // `x += x` would take the read and the write lock of one array: read a copy instead.
        let rhs_copy;
        let rhs_guard;
        let rhs: &Storage = if self.is_same(other) {
            rhs_copy = other.storage().clone();
            &rhs_copy
        } else {
            rhs_guard = other.storage();
            &rhs_guard
        };
        let mut lhs = self.storage_mut();
        if let (Storage::Dense(d), Storage::Dense(s)) = (&mut *lhs, rhs) {
            with_buffer_pair!(d, s, (d, s) => zip_in_place(d, s, op), else => ());
            // check_pair rejected differing dtypes
        }
        Ok(())
    }

    fn scalar_assign(&self, s: f64, op: BinOp) -> Result<()> {
        self.check_dense(op.name())?;
        self.wait_to_write()?;
        let mut lhs = self.storage_mut();
        if let Storage::Dense(d) = &mut *lhs {
            with_buffer!(d, d => scalar_in_place(d, s, op));
        }
        Ok(())
    }

    fn binary(&self, other: &NDArray, op: BinOp) -> Result<NDArray> {
        self.check_pair(other, op.name())?;
        let out = self.deep_copy()?;
        out.binary_assign(other, op)?;
        Ok(out)
    }

    fn scalar(&self, s: f64, op: BinOp) -> Result<NDArray> {
        self.check_dense(op.name())?;
        let out = self.deep_copy()?;
        out.scalar_assign(s, op)?;
        Ok(out)
    }

    /// `self += other`, elementwise, in place.
    pub fn add_assign(&self, other: &NDArray) -> Result<()> {
        self.binary_assign(other, BinOp::Add)
    }

    /// `self -= other`, elementwise, in place.
    pub fn sub_assign(&self, other: &NDArray) -> Result<()> {
        self.binary_assign(other, BinOp::Sub)
    }

    /// `self *= other`, elementwise, in place.
    pub fn mul_assign(&self, other: &NDArray) -> Result<()> {
        self.binary_assign(other, BinOp::Mul)
    }

    /// `self += s` for every element, in place.
    pub fn add_assign_scalar(&self, s: f64) -> Result<()> {
        self.scalar_assign(s, BinOp::Add)
    }

    /// `self -= s` for every element, in place.
    pub fn sub_assign_scalar(&self, s: f64) -> Result<()> {
        self.scalar_assign(s, BinOp::Sub)
    }

    /// `self *= s` for every element, in place.
    pub fn mul_assign_scalar(&self, s: f64) -> Result<()> {
        self.scalar_assign(s, BinOp::Mul)
    }

    /// `self += a * x`, in place (one pass).
    pub fn axpy_assign(&self, a: f64, x: &NDArray) -> Result<()> {
        self.check_pair(x, "axpy")?;
        if self.is_same(x) {
            return self.mul_assign_scalar(1.0 + a);
        }
        self.wait_to_write()?;
        x.wait_to_read()?;
        let src = x.storage();
        let mut dst = self.storage_mut();
        if let (Storage::Dense(d), Storage::Dense(s)) = (&mut *dst, &*src) {
            with_buffer_pair!(d, s, (d, s) => kernels::axpy(d, a, s), else => ());
            // check_pair rejected differing dtypes
        }
        Ok(())
    }

    /// Sets every element to `value`, in place.
    pub fn fill(&self, value: f64) -> Result<()> {
        self.check_dense("fill")?;
        self.wait_to_write()?;
        let mut lhs = self.storage_mut();
        if let Storage::Dense(d) = &mut *lhs {
            *d = Buffer::filled(d.dtype(), d.len(), value);
        }
        Ok(())
    }
}

macro_rules! impl_ops {
    ($trait:ident, $method:ident, $op:expr) => {
        impl $trait<&NDArray> for &NDArray {
            type Output = Result<NDArray>;
            fn $method(self, rhs: &NDArray) -> Result<NDArray> {
                self.binary(rhs, $op)
            }
        }
        impl $trait<f64> for &NDArray {
            type Output = Result<NDArray>;
            fn $method(self, rhs: f64) -> Result<NDArray> {
                self.scalar(rhs, $op)
            }
        }
    };
}
impl_ops!(Add, add, BinOp::Add);
impl_ops!(Sub, sub, BinOp::Sub);
impl_ops!(Mul, mul, BinOp::Mul);

#[cfg(test)]
mod tests {
    use crate::{Context, DType, NDArray};

    #[test]
    fn arithmetic_with_scalars_and_arrays() {
        let a = NDArray::from_vec([3], vec![1.0f32, 2.0, 3.0]).unwrap();
        let b = NDArray::ones([3]);
        assert_eq!((&a + &b).unwrap().to_vec::<f32>().unwrap(), vec![2.0, 3.0, 4.0]);
        assert_eq!((&a - &b).unwrap().to_vec::<f32>().unwrap(), vec![0.0, 1.0, 2.0]);
        assert_eq!((&a * &a).unwrap().to_vec::<f32>().unwrap(), vec![1.0, 4.0, 9.0]);
        assert_eq!((&a * 3.0).unwrap().to_vec::<f32>().unwrap(), vec![3.0, 6.0, 9.0]);
        assert_eq!((&a + 1.0).unwrap().to_vec::<f32>().unwrap(), vec![2.0, 3.0, 4.0]);
        assert_eq!((&a - 1.0).unwrap().to_vec::<f32>().unwrap(), vec![0.0, 1.0, 2.0]);
        // the operands are untouched
        assert_eq!(a.to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0]);
    }

    #[test]
    fn in_place_ops() {
        let a = NDArray::full([2, 2], 2.0);
        let x = NDArray::ones([2, 2]);
        a.add_assign(&(&x * 3.0).unwrap()).unwrap();
        assert_eq!(a.to_vec::<f32>().unwrap(), vec![5.0; 4]);
        a.add_assign(&a.clone()).unwrap();
        assert_eq!(a.to_vec::<f32>().unwrap(), vec![10.0; 4]);
        a.axpy_assign(-2.0, &x).unwrap();
        assert_eq!(a.to_vec::<f32>().unwrap(), vec![8.0; 4]);
        a.mul_assign_scalar(0.5).unwrap();
        a.sub_assign_scalar(1.0).unwrap();
        assert_eq!(a.to_vec::<f32>().unwrap(), vec![3.0; 4]);
        a.fill(7.0).unwrap();
        assert_eq!(a.to_vec::<f32>().unwrap(), vec![7.0; 4]);
    }

    #[test]
    fn mismatches_are_errors() {
        let a = NDArray::ones([2, 2]);
        assert!((&a + &NDArray::ones([4])).is_err());
        let d = NDArray::zeros_with([2, 2], DType::F64, Context::cpu(0));
        let err = (&a + &d).unwrap_err().to_string();
        assert!(err.contains("dtype mismatch"), "{err}");
        let rs = NDArray::row_sparse_zeros([2, 2], DType::F32, Context::cpu(0));
        assert!(rs.add_assign_scalar(1.0).is_err());
    }

    #[test]
    fn other_dtypes() {
        let a = NDArray::full_with([2], 1.5, DType::F16, Context::cpu(0));
        assert_eq!((&a * 2.0).unwrap().to_vec::<f32>().unwrap(), vec![3.0, 3.0]);
        let i = NDArray::from_vec([2], vec![1i32, 2]).unwrap();
        assert_eq!((&i + &i).unwrap().to_vec::<i32>().unwrap(), vec![2, 4]);
    }
}
