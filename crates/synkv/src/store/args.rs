//! [`Arrays`]: the value / output argument, and the flattening rules of spec K3.1.
//!
//! - one key + one array → one pair;
//! - one key + a list of arrays → one pair per array, same key (multi-device values, summed
//!   on push; several outputs on pull);
//! - a list of keys + a list of arrays of equal length → one pair per key;
//! - a list of keys + a list of lists → each key gets its own list.

use super::{Error, Key, Keys};
use crate::NDArray;

/// One array, a list of arrays, or a list of lists of arrays.
///
/// Borrowed forms (`Slice`, `Lists`) let the common call shapes (`&[NDArray]`,
/// `&[Vec<NDArray>]`) flatten without building intermediate vectors.
#[derive(Clone, Debug)]
pub enum Arrays<'a> {
    /// A single array.
    One(&'a NDArray),
    /// A list: per-device values of one key, or one array per key of a key list.
    Slice(&'a [NDArray]),
    /// A list of references.
    List(Vec<&'a NDArray>),
    /// One list per key.
    Lists(&'a [Vec<NDArray>]),
    /// One list of references per key.
    Nested(Vec<Vec<&'a NDArray>>),
}

impl<'a> From<&'a NDArray> for Arrays<'a> {
    fn from(a: &'a NDArray) -> Self {
        Arrays::One(a)
    }
}
impl<'a> From<&'a [NDArray]> for Arrays<'a> {
    fn from(a: &'a [NDArray]) -> Self {
        Arrays::Slice(a)
    }
}
impl<'a> From<&'a Vec<NDArray>> for Arrays<'a> {
    fn from(a: &'a Vec<NDArray>) -> Self {
        Arrays::Slice(a)
    }
}
impl<'a, const N: usize> From<&'a [NDArray; N]> for Arrays<'a> {
    fn from(a: &'a [NDArray; N]) -> Self {
        Arrays::Slice(a)
    }
}
impl<'a> From<Vec<&'a NDArray>> for Arrays<'a> {
    fn from(a: Vec<&'a NDArray>) -> Self {
        Arrays::List(a)
    }
}
impl<'a> From<&'a [&'a NDArray]> for Arrays<'a> {
    fn from(a: &'a [&'a NDArray]) -> Self {
        Arrays::List(a.to_vec())
    }
}
impl<'a, const N: usize> From<[&'a NDArray; N]> for Arrays<'a> {
    fn from(a: [&'a NDArray; N]) -> Self {
        Arrays::List(a.to_vec())
    }
}
impl<'a> From<&'a [Vec<NDArray>]> for Arrays<'a> {
    fn from(a: &'a [Vec<NDArray>]) -> Self {
        Arrays::Lists(a)
    }
}
impl<'a> From<&'a Vec<Vec<NDArray>>> for Arrays<'a> {
    fn from(a: &'a Vec<Vec<NDArray>>) -> Self {
        Arrays::Lists(a)
    }
}
impl<'a> From<Vec<Vec<&'a NDArray>>> for Arrays<'a> {
    fn from(a: Vec<Vec<&'a NDArray>>) -> Self {
        Arrays::Nested(a)
    }
}

impl<'a> Arrays<'a> {
    fn count(&self) -> usize {
        match self {
            Arrays::One(_) => 1,
            Arrays::Slice(v) => v.len(),
            Arrays::List(v) => v.len(),
            Arrays::Lists(v) => v.len(),
            Arrays::Nested(v) => v.len(),
        }
    }
}

/// Flattens `keys` and `arrays` into (key, array) pairs per the rules above. An empty key list
/// with an empty array list gives no pairs (a no-op call, spec K12.17).
pub(crate) fn flatten<'a>(op: &'static str, keys: Keys, arrays: Arrays<'a>) -> Result<Vec<(Key, &'a NDArray)>, Error> {
    match keys {
        Keys::One(key) => {
            let list: Vec<&'a NDArray> = match arrays {
                Arrays::One(a) => return Ok(vec![(key, a)]),
                Arrays::Slice(v) => v.iter().collect(),
                Arrays::List(v) => v,
                // A single key with a one-element list of lists is unambiguous.
                Arrays::Lists(v) if v.len() == 1 => v[0].iter().collect(),
                Arrays::Nested(mut v) if v.len() == 1 => v.remove(0),
                other => return Err(Error::LengthMismatch { op, keys: 1, values: other.count() }),
            };
            if list.is_empty() {
                return Err(Error::EmptyValueList { op, key });
            }
            Ok(list.into_iter().map(|a| (key.clone(), a)).collect())
        }
        Keys::Many(keys) => {
            if keys.len() != arrays.count() {
                return Err(Error::LengthMismatch { op, keys: keys.len(), values: arrays.count() });
            }
            let mut out = Vec::with_capacity(keys.len());
            match arrays {
                Arrays::One(a) => out.extend(keys.into_iter().map(|k| (k, a))),
                Arrays::Slice(v) => out.extend(keys.into_iter().zip(v.iter())),
                Arrays::List(v) => out.extend(keys.into_iter().zip(v)),
                Arrays::Lists(lists) => {
                    for (k, list) in keys.into_iter().zip(lists) {
                        if list.is_empty() {
                            return Err(Error::EmptyValueList { op, key: k });
                        }
                        if let [a] = list.as_slice() {
                            out.push((k, a));
                        } else {
                            out.extend(list.iter().map(|a| (k.clone(), a)));
                        }
                    }
                }
                Arrays::Nested(lists) => {
                    for (k, list) in keys.into_iter().zip(lists) {
                        if list.is_empty() {
                            return Err(Error::EmptyValueList { op, key: k });
                        }
                        out.extend(list.into_iter().map(|a| (k.clone(), a)));
                    }
                }
            }
            Ok(out)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flattening_rules() {
        let a = NDArray::zeros([1]);
        let b = NDArray::zeros([1]);
        assert_eq!(flatten("t", Keys::from(3), Arrays::from(&a)).unwrap().len(), 1);
        let per_dev = flatten("t", Keys::from(3), Arrays::from(vec![&a, &b])).unwrap();
        assert_eq!(per_dev.iter().map(|p| p.0.clone()).collect::<Vec<_>>(), vec![Key::Int(3), Key::Int(3)]);
        let list = flatten("t", Keys::from([5, 7]), Arrays::from(vec![&a, &b])).unwrap();
        assert_eq!(list[1].0, Key::Int(7));
        let nested = flatten("t", Keys::from([5, 7]), Arrays::from(vec![vec![&a, &b], vec![&a]])).unwrap();
        assert_eq!(nested.len(), 3);
        assert!(matches!(flatten("t", Keys::from([5, 7]), Arrays::from(vec![&a])), Err(Error::LengthMismatch { keys: 2, values: 1, .. })));
        assert!(flatten("t", Keys::Many(vec![]), Arrays::List(vec![])).unwrap().is_empty());
        assert!(matches!(flatten("t", Keys::from(1), Arrays::List(vec![])), Err(Error::EmptyValueList { .. })));
    }
}
