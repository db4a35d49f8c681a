//! [`Key`]: an int or str key, and [`Keys`], the one-or-many key argument.

use std::fmt;

/// A store key: a 32-bit int (as in MXNet's C API) or a string.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Key {
    /// An integer key.
    Int(i32),
    /// A string key.
    Str(String),
}

/// Which kind of key a store uses; fixed by the first call (spec K1.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KeyKind {
    /// Integer keys.
    Int,
    /// String keys.
    Str,
}

impl fmt::Display for KeyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KeyKind::Int => "int",
            KeyKind::Str => "str",
        })
    }
}

impl Key {
    /// The kind of this key.
    pub fn kind(&self) -> KeyKind {
        match self {
            Key::Int(_) => KeyKind::Int,
            Key::Str(_) => KeyKind::Str,
        }
    }
}

/// Prints the key as a user wrote it: `3`, or `weight` (no quotes).
impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Key::Int(i) => write!(f, "{i}"),
            Key::Str(s) => f.write_str(s),
        }
    }
}

impl From<i32> for Key {
    fn from(k: i32) -> Self {
        Key::Int(k)
    }
}
impl From<&str> for Key {
    fn from(k: &str) -> Self {
        Key::Str(k.to_string())
    }
}
impl From<String> for Key {
    fn from(k: String) -> Self {
        Key::Str(k)
    }
}
impl From<&String> for Key {
    fn from(k: &String) -> Self {
        Key::Str(k.clone())
    }
}
impl From<&&str> for Key {
    fn from(k: &&str) -> Self {
        Key::Str((*k).to_string())
    }
}
impl From<&Key> for Key {
    fn from(k: &Key) -> Self {
        k.clone()
    }
}

/// One key or a list of keys: the first argument of every store call.
///
/// A single key takes one value (or a list of per-device values); a list of keys takes one
/// entry per key. Converts from `i32`, `&str`, `String`, [`Key`], and slices, arrays and
/// vectors of those.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Keys {
    /// One key.
    One(Key),
    /// A list of keys (may be empty: the call is then a no-op).
    Many(Vec<Key>),
}

impl Keys {
    /// The keys as a list.
    pub fn to_vec(&self) -> Vec<Key> {
        match self {
            Keys::One(k) => vec![k.clone()],
            Keys::Many(v) => v.clone(),
        }
    }
}

macro_rules! keys_from_one {
    ($($t:ty),*) => {$(
        impl From<$t> for Keys {
            fn from(k: $t) -> Self {
                Keys::One(Key::from(k))
            }
        }
    )*};
}
keys_from_one!(i32, &str, String, &String, Key, &Key);

macro_rules! keys_from_many {
    ($($t:ty),*) => {$(
        impl From<&[$t]> for Keys {
            fn from(k: &[$t]) -> Self {
                Keys::Many(k.iter().map(Key::from).collect())
            }
        }
        impl From<Vec<$t>> for Keys {
            fn from(k: Vec<$t>) -> Self {
                Keys::Many(k.into_iter().map(Key::from).collect())
            }
        }
        impl From<&Vec<$t>> for Keys {
            fn from(k: &Vec<$t>) -> Self {
                Keys::Many(k.iter().map(Key::from).collect())
            }
        }
        impl<const N: usize> From<[$t; N]> for Keys {
            fn from(k: [$t; N]) -> Self {
                Keys::Many(k.into_iter().map(Key::from).collect())
            }
        }
        impl<const N: usize> From<&[$t; N]> for Keys {
            fn from(k: &[$t; N]) -> Self {
                Keys::Many(k.iter().map(Key::from).collect())
            }
        }
    )*};
}
keys_from_many!(Key, String, &str);

impl From<&[i32]> for Keys {
    fn from(k: &[i32]) -> Self {
        Keys::Many(k.iter().map(|&i| Key::Int(i)).collect())
    }
}
impl From<Vec<i32>> for Keys {
    fn from(k: Vec<i32>) -> Self {
        Keys::Many(k.into_iter().map(Key::Int).collect())
    }
}
impl From<&Vec<i32>> for Keys {
    fn from(k: &Vec<i32>) -> Self {
        Keys::Many(k.iter().map(|&i| Key::Int(i)).collect())
    }
}
impl<const N: usize> From<[i32; N]> for Keys {
    fn from(k: [i32; N]) -> Self {
        Keys::Many(k.into_iter().map(Key::Int).collect())
    }
}
impl<const N: usize> From<&[i32; N]> for Keys {
    fn from(k: &[i32; N]) -> Self {
        Keys::Many(k.iter().map(|&i| Key::Int(i)).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversions() {
        assert_eq!(Keys::from(3), Keys::One(Key::Int(3)));
        assert_eq!(Keys::from("a"), Keys::One(Key::Str("a".into())));
        assert_eq!(Keys::from([5, 7]), Keys::Many(vec![Key::Int(5), Key::Int(7)]));
        assert_eq!(Keys::from(vec!["b", "c"]).to_vec(), vec![Key::from("b"), Key::from("c")]);
        assert_eq!(Key::Int(3).to_string(), "3");
        assert_eq!(Key::from("w").to_string(), "w");
        assert_eq!(Key::from("w").kind(), KeyKind::Str);
    }
}
