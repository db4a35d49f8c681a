//! Conversions: `cast` for every pair of types, the vector f16/bf16 conversions against
//! `half`, and `from_f64` rounding.

use half::{bf16, f16};

use super::*;
use crate::kernels::cast;

/// `cast` for every pair of built-in types, at every level, against `from_f64(to_f64)`.
fn check_cast<T: TestElem, U: TestElem>(r: &mut Rng) {
    for plan in plans() {
        let sizes = if cfg!(miri) { vec![0, 9, 300] } else { vec![0, 1, 7, 255, 256, 257, 1000 + r.below(3000)] };
        for n in sizes {
            let src: Vec<T> = random_vec(r, n + 1);
            let mut dst = vec![U::default(); n + 2];
            cast::cast(&plan, &mut dst[2..], &src[1..]);
            let same = std::any::TypeId::of::<T>() == std::any::TypeId::of::<U>();
            let want: Vec<U> = src[1..]
                .iter()
                .map(|&x| match same {
                    // Same built-in type: a bit copy (`Fixed`, not built in, goes through f64,
                    // which is exact for it).
                    true => U::from_f64(0.0).bits_from(x.bits()),
                    false => U::from_f64(x.to_f64()),
                })
                .collect();
            let what = format!("cast {} -> {} n={n} {plan:?}", std::any::type_name::<T>(), std::any::type_name::<U>());
            assert_bits(&dst[2..], &want, &what);
        }
    }
}

macro_rules! cast_all {
    ($r:expr; $($t:ty),*) => {
        $( cast_all!(@row $r; $t; f32, f64, f16, bf16, i32, i64, Fixed); )*
    };
    (@row $r:expr; $t:ty; $($u:ty),*) => {
        $( check_cast::<$t, $u>($r); )*
    };
}

#[test]
fn cast_matches_from_f64_for_every_pair() {
    let mut r = Rng(9);
    cast_all!(&mut r; f32, f64, f16, bf16, i32, i64, Fixed);
}

/// The vector conversions agree with `half` on every f16/bf16 and on many f32 bit patterns.
#[test]
#[cfg_attr(miri, ignore = "too slow under Miri")]
fn half_conversions_match_half_crate() {
    use crate::kernels::simd;
    let all: Vec<u16> = (0..=u16::MAX).collect();
    let mut r = Rng(10);
    let mut f32s: Vec<f32> = (0..200_000).map(|_| f32::from_bits(r.next() as u32)).collect();
    for e in [0u32, 1, 102, 103, 112, 113, 126, 127, 128, 142, 143, 254, 255] {
        for m in [0u32, 1, 0x1000, 0x2000, 0x3000, 0x7fff, 0x8000, 0x18000, 0x7fffff] {
            f32s.push(f32::from_bits((e << 23) | m));
            f32s.push(f32::from_bits(0x8000_0000 | (e << 23) | m));
        }
    }
    for isa in levels() {
        let h: Vec<f16> = all.iter().map(|&b| f16::from_bits(b)).collect();
        let mut out = vec![0f32; h.len()];
        simd::f16_to_f32(isa, &mut out, &h);
        for (x, y) in h.iter().zip(&out) {
            assert_eq!(x.to_f32().to_bits(), y.to_bits(), "f16 {x:?} widen at {isa:?}");
        }
        let b: Vec<bf16> = all.iter().map(|&b| bf16::from_bits(b)).collect();
        simd::bf16_to_f32(isa, &mut out, &b);
        for (x, y) in b.iter().zip(&out) {
            assert_eq!(x.to_f32().to_bits(), y.to_bits(), "bf16 {x:?} widen at {isa:?}");
        }
        let mut hs = vec![f16::ZERO; f32s.len()];
        simd::f32_to_f16(isa, &mut hs, &f32s);
        for (x, y) in f32s.iter().zip(&hs) {
            assert_eq!(f16::from_f32(*x).to_bits(), y.to_bits(), "{x:e} to f16 at {isa:?}");
        }
        let mut bs = vec![bf16::ZERO; f32s.len()];
        simd::f32_to_bf16(isa, &mut bs, &f32s);
        for (x, y) in f32s.iter().zip(&bs) {
            assert_eq!(bf16::from_f32(*x).to_bits(), y.to_bits(), "{x:e} to bf16 at {isa:?}");
            let via64 = <bf16 as Element>::from_f64(f64::from(*x)).to_bits();
            assert_eq!(via64, y.to_bits(), "{x:e}: bf16 from f32 vs f64");
        }
    }
}

/// `from_f64` for f16/bf16 is correctly rounded, including just off halfway points (where
/// half's own `bf16::from_f64` and a plain double rounding through f32 go wrong).
#[test]
#[cfg_attr(miri, ignore = "too slow under Miri")]
fn half_from_f64_is_correctly_rounded() {
    fn check<H: Element + Copy>(v: f64, bits: fn(H) -> u16, from_bits: fn(u16) -> H) {
        let got = H::from_f64(v);
        let (g, b) = (got.to_f64(), bits(got));
        for nb in [b.wrapping_sub(1), b.wrapping_add(1)] {
            let n = from_bits(nb).to_f64();
            if n.is_finite() && (n > 0.0) == (g > 0.0) {
                let (dg, dn) = ((g - v).abs(), (n - v).abs());
                assert!(dg < dn || (dg == dn && b % 2 == 0), "{v:e} -> {g:e}, but {n:e} is nearer");
            }
        }
    }
    let mut r = Rng(11);
    for _ in 0..100_000 {
        let jitter = [0i64, 1, -1, 1 << 20, -(1 << 20), 1 << 31, -(1 << 31), 1 << 33][r.below(8)];
        // A random f16 (normal range) and its upper neighbour; v sits near their midpoint.
        let h = f16::from_bits((0x0400 + r.below(0x7000) as u16) | ((r.below(2) as u16) << 15));
        let mid = (h.to_f64() + f16::from_bits(h.to_bits() + 1).to_f64()) / 2.0;
        check(f64::from_bits(mid.to_bits().wrapping_add_signed(jitter)), f16::to_bits, f16::from_bits);
        let b = bf16::from_bits((0x0080 + r.below(0x7e00) as u16) | ((r.below(2) as u16) << 15));
        let mid = (b.to_f64() + bf16::from_bits(b.to_bits() + 1).to_f64()) / 2.0;
        check(f64::from_bits(mid.to_bits().wrapping_add_signed(jitter)), bf16::to_bits, bf16::from_bits);
    }
    // The case that sent half's bf16::from_f64 the wrong way: halfway plus 2^-30 of an ulp.
    let v = f64::from(f32::from_bits(0x3f80_8001));
    assert_eq!(<bf16 as Element>::from_f64(v).to_bits(), 0x3f81);
    assert_eq!(<f16 as Element>::from_f64(65520.0), f16::INFINITY);
    assert_eq!(<f16 as Element>::from_f64(65519.99), f16::MAX);
    assert_eq!(<bf16 as Element>::from_f64(1e300), bf16::INFINITY);
    assert_eq!(<f16 as Element>::from_f64(-1e-300).to_bits(), 0x8000);
    assert!(<bf16 as Element>::from_f64(f64::NAN).is_nan());
}

#[test]
fn int_from_f64_rounds_to_nearest_and_saturates() {
    assert_eq!(i32::from_f64(2.5), 3);
    assert_eq!(i32::from_f64(-2.5), -3);
    assert_eq!(i32::from_f64(2.4999), 2);
    assert_eq!(i32::from_f64(-0.6), -1);
    assert_eq!(i32::from_f64(1e12), i32::MAX);
    assert_eq!(i32::from_f64(-1e12), i32::MIN);
    assert_eq!(i32::from_f64(f64::NAN), 0);
    assert_eq!(i64::from_f64(1e30), i64::MAX);
    assert_eq!(i64::from_f64(-7.5), -8);
}
