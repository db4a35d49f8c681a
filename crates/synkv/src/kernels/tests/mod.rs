//! Every kernel × element type × ISA level this CPU has × store kind (normal/streaming) ×
//! threading, against naive per-element oracles written independently of `scalar.rs`.
//! Float results must match bit for bit, except that any NaN matches any NaN: Rust leaves NaN
//! sign and payload unspecified (x86 picks by operand order, which the compiler may swap;
//! Miri randomises them).

//!
//! This file holds the shared helpers (test data, oracles, plans); `kernels.rs` checks the
//! arithmetic kernels, `convert.rs` the conversions (`cast`, f16/bf16, `from_f64`).

mod convert;
mod kernels;

use half::{bf16, f16};

use super::tuning::Plan;
use super::{Element, Isa};

/// xorshift64*: deterministic, dependency-free test data.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    /// Mostly ordinary values of mixed magnitude, sometimes special ones.
    fn float(&mut self) -> f64 {
        const SPECIAL: [f64; 8] = [0.0, -0.0, f64::INFINITY, f64::NEG_INFINITY, f64::NAN, 1e-40, 65504.0, 3.0e38];
        if self.below(64) == 0 {
            return SPECIAL[self.below(SPECIAL.len())];
        }
        let m = (self.next() >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0;
        m * [1e-3, 1.0, 7.0, 1e3][self.below(4)]
    }
}

/// Test-side view of an element: exact bits and a random value.
trait TestElem: Element {
    fn bits(self) -> u64;
    /// The value with the given bits (the receiver only names the type).
    fn bits_from(self, bits: u64) -> Self;
    fn random(r: &mut Rng) -> Self;
    /// Naive oracles, element by element.
    fn sum_ref(xs: &[Self]) -> Self;
    fn add_ref(d: Self, s: Self) -> Self;
    fn axpy_ref(d: Self, a: f64, x: Self) -> Self;
    fn scale_ref(d: Self, a: f64) -> Self;
}

macro_rules! float_elem {
    ($t:ty, $c:ty, $to:expr, $from:expr, $bits:expr) => {
        impl TestElem for $t {
            fn bits(self) -> u64 {
                $bits(self) as u64
            }
            fn bits_from(self, bits: u64) -> Self {
                <$t>::from_bits(bits as _)
            }
            fn random(r: &mut Rng) -> Self {
                <$t>::from_f64(r.float())
            }
            fn sum_ref(xs: &[Self]) -> Self {
                let mut acc: $c = $to(xs[0]);
                for &x in &xs[1..] {
                    acc += $to(x);
                }
                $from(acc)
            }
            fn add_ref(d: Self, s: Self) -> Self {
                $from($to(d) + $to(s))
            }
            fn axpy_ref(d: Self, a: f64, x: Self) -> Self {
                $from($to(d) + (a as $c) * $to(x))
            }
            fn scale_ref(d: Self, a: f64) -> Self {
                $from($to(d) * (a as $c))
            }
        }
    };
}
float_elem!(f32, f32, |x| x, |x| x, f32::to_bits);
float_elem!(f64, f64, |x| x, |x| x, f64::to_bits);
float_elem!(f16, f32, f16::to_f32, f16::from_f32, f16::to_bits);
float_elem!(bf16, f32, bf16::to_f32, bf16::from_f32, bf16::to_bits);

macro_rules! int_elem {
    ($t:ty) => {
        impl TestElem for $t {
            fn bits(self) -> u64 {
                self as u64
            }
            fn bits_from(self, bits: u64) -> Self {
                bits as $t
            }
            fn random(r: &mut Rng) -> Self {
                match r.below(8) {
                    0 => <$t>::MAX - r.below(3) as $t,
                    1 => <$t>::MIN + r.below(3) as $t,
                    _ => r.next() as $t >> 8,
                }
            }
            fn sum_ref(xs: &[Self]) -> Self {
                xs.iter().fold(0, |a: $t, &x| a.wrapping_add(x))
            }
            fn add_ref(d: Self, s: Self) -> Self {
                d.wrapping_add(s)
            }
            fn axpy_ref(d: Self, a: f64, x: Self) -> Self {
                <$t>::from_f64(d as f64 + a * x as f64)
            }
            fn scale_ref(d: Self, a: f64) -> Self {
                <$t>::from_f64(d as f64 * a)
            }
        }
    };
}
int_elem!(i32);
int_elem!(i64);

/// A type outside the fast paths: exercises the `Other` views.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Fixed(i32);
impl Element for Fixed {
    fn to_f64(self) -> f64 {
        self.0 as f64 / 256.0
    }
    fn from_f64(v: f64) -> Self {
        Fixed((v * 256.0).round() as i32)
    }
}
impl TestElem for Fixed {
    fn bits(self) -> u64 {
        self.0 as u64
    }
    fn bits_from(self, bits: u64) -> Self {
        Fixed(bits as i32)
    }
    fn random(r: &mut Rng) -> Self {
        Fixed(r.next() as i32 >> 12)
    }
    fn sum_ref(xs: &[Self]) -> Self {
        Fixed::from_f64(xs.iter().map(|x| x.to_f64()).sum())
    }
    fn add_ref(d: Self, s: Self) -> Self {
        Fixed::from_f64(d.to_f64() + s.to_f64())
    }
    fn axpy_ref(d: Self, a: f64, x: Self) -> Self {
        Fixed::from_f64(d.to_f64() + a * x.to_f64())
    }
    fn scale_ref(d: Self, a: f64) -> Self {
        Fixed::from_f64(d.to_f64() * a)
    }
}

fn levels() -> Vec<Isa> {
    [Isa::Scalar, Isa::Avx2, Isa::Avx512].into_iter().filter(|&l| l <= Isa::detected()).collect()
}

/// Every plan worth testing at small sizes: each level × streaming on/off × threads on/off.
fn plans() -> Vec<Plan> {
    let mut v = Vec::new();
    for isa in levels() {
        for stream in [usize::MAX, 0] {
            for par in [usize::MAX, 700] {
                v.push(Plan::with(isa, par, stream));
            }
        }
    }
    v
}

fn random_vec<T: TestElem>(r: &mut Rng, n: usize) -> Vec<T> {
    (0..n).map(|_| T::random(r)).collect()
}

#[track_caller]
fn assert_bits<T: TestElem>(got: &[T], want: &[T], what: &str) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        // Rust leaves NaN sign and payload unspecified (Miri randomises them): any NaN matches.
        if g.to_f64().is_nan() && w.to_f64().is_nan() {
            continue;
        }
        assert_eq!(g.bits(), w.bits(), "{what}: element {i}: got {g:?}, want {w:?}");
    }
}
