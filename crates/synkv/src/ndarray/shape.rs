//! [`Shape`]: the dimensions of an array.

use std::fmt;

/// The dimensions of an array, outermost first. A scalar has an empty shape and size 1.
#[derive(Clone, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize)]
pub struct Shape(Vec<usize>);

impl Shape {
    /// The dimensions.
    pub fn dims(&self) -> &[usize] {
        &self.0
    }

    /// The number of dimensions.
    pub fn ndim(&self) -> usize {
        self.0.len()
    }

    /// The number of elements (product of the dimensions; 1 for a scalar).
    pub fn size(&self) -> usize {
        self.0.iter().product()
    }

    /// The number of elements in one row (all dimensions but the first; 1 for 0-d and 1-d).
    pub fn row_len(&self) -> usize {
        self.0.iter().skip(1).product()
    }

    /// The number of rows (the first dimension; 1 for a scalar).
    pub fn rows(&self) -> usize {
        self.0.first().copied().unwrap_or(1)
    }
}

impl fmt::Debug for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "(")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                write!(f, ", ")?;
            }
            write!(f, "{d}")?;
        }
        if self.0.len() == 1 {
            write!(f, ",")?;
        }
        write!(f, ")")
    }
}

impl From<&[usize]> for Shape {
    fn from(d: &[usize]) -> Self {
        Shape(d.to_vec())
    }
}

impl<const N: usize> From<[usize; N]> for Shape {
    fn from(d: [usize; N]) -> Self {
        Shape(d.to_vec())
    }
}

impl<const N: usize> From<&[usize; N]> for Shape {
    fn from(d: &[usize; N]) -> Self {
        Shape(d.to_vec())
    }
}

impl From<Vec<usize>> for Shape {
    fn from(d: Vec<usize>) -> Self {
        Shape(d)
    }
}

impl From<&Shape> for Shape {
    fn from(s: &Shape) -> Self {
        s.clone()
    }
}

impl From<usize> for Shape {
    fn from(n: usize) -> Self {
        Shape(vec![n])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_and_display() {
        let s = Shape::from([2, 3]);
        assert_eq!(s.size(), 6);
        assert_eq!(s.row_len(), 3);
        assert_eq!(s.rows(), 2);
        assert_eq!(s.to_string(), "(2, 3)");
        assert_eq!(Shape::from([4]).to_string(), "(4,)");
        assert_eq!(Shape::default().size(), 1);
    }
}
