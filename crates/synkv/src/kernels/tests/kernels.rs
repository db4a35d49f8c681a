//! The arithmetic kernels (`sum_into`, `add_into`, `axpy`, `scale`, `copy`, `fill`) for every
//! element type, ISA level, store kind and threading choice, against the naive oracles.

use half::f16;
use proptest::prelude::{any, prop_assert_eq, proptest};

use super::*;
use crate::kernels::ops;

/// Runs every element-wise kernel at `plan` on unaligned subslices of length `n`.
fn check_all<T: TestElem>(r: &mut Rng, plan: &Plan, n: usize) {
    let what = format!("{} n={n} {plan:?}", std::any::type_name::<T>());
    let k = 1 + r.below(4);
    let (od, os) = (1 + r.below(15), 1 + r.below(15));
    let backing: Vec<Vec<T>> = (0..k).map(|_| random_vec(r, n + os)).collect();
    let srcs: Vec<&[T]> = backing.iter().map(|b| &b[os..]).collect();
    let mut dst_store = random_vec::<T>(r, n + od);
    let dst = &mut dst_store[od..];

    let want: Vec<T> = (0..n).map(|i| T::sum_ref(&srcs.iter().map(|s| s[i]).collect::<Vec<_>>())).collect();
    ops::sum_into(plan, dst, &srcs);
    assert_bits(dst, &want, &format!("sum_into k={k} {what}"));

    let before = dst.to_vec();
    ops::add_into(plan, dst, srcs[0]);
    let want: Vec<T> = before.iter().zip(srcs[0]).map(|(&d, &s)| T::add_ref(d, s)).collect();
    assert_bits(dst, &want, &format!("add_into {what}"));

    let a = [0.5, -1.25, 3.1, 1e-3][r.below(4)];
    let before = dst.to_vec();
    ops::axpy(plan, dst, a, srcs[0]);
    let want: Vec<T> = before.iter().zip(srcs[0]).map(|(&d, &x)| T::axpy_ref(d, a, x)).collect();
    assert_bits(dst, &want, &format!("axpy {what}"));

    let before = dst.to_vec();
    ops::scale(plan, dst, a);
    let want: Vec<T> = before.iter().map(|&d| T::scale_ref(d, a)).collect();
    assert_bits(dst, &want, &format!("scale {what}"));

    ops::copy(plan, dst, srcs[0]);
    assert_bits(dst, srcs[0], &format!("copy {what}"));

    let v = T::random(r);
    ops::fill(plan, dst, v);
    assert_bits(dst, &vec![v; n], &format!("fill {what}"));
}

fn check_type<T: TestElem>(seed: u64) {
    let mut r = Rng(seed);
    for plan in plans() {
        if cfg!(miri) {
            // Miri is ~1000× slower: a few sizes that still cover head, body and tail.
            for n in [0, 1, 37, 300] {
                check_all::<T>(&mut r, &plan, n);
            }
            continue;
        }
        for n in [0, 1, 15, 16, 17, 63, 64, 65, 255, 256, 257, 1000] {
            check_all::<T>(&mut r, &plan, n);
        }
        for _ in 0..12 {
            let n = r.below(5000);
            check_all::<T>(&mut r, &plan, n);
        }
    }
}

#[test]
fn f32_kernels_match_reference() {
    check_type::<f32>(1);
}
#[test]
fn f64_kernels_match_reference() {
    check_type::<f64>(2);
}
#[test]
fn f16_kernels_match_reference() {
    check_type::<f16>(3);
}
#[test]
fn bf16_kernels_match_reference() {
    check_type::<bf16>(4);
}
#[test]
fn i32_kernels_match_reference() {
    check_type::<i32>(5);
}
#[test]
fn i64_kernels_match_reference() {
    check_type::<i64>(6);
}
#[test]
fn other_element_types_take_the_generic_path() {
    check_type::<Fixed>(7);
}

/// 3M elements: the parallel split and streaming stores, as the default plan would run them.
#[test]
#[cfg_attr(miri, ignore = "too slow under Miri")]
fn large_arrays_parallel_and_streaming() {
    let mut r = Rng(8);
    let n = 3_000_000 + 13;
    let a: Vec<f32> = random_vec(&mut r, n + 1);
    let b: Vec<f32> = random_vec(&mut r, n + 1);
    let c: Vec<f32> = random_vec(&mut r, n + 1);
    let srcs = [&a[1..], &b[1..], &c[1..]];
    let want: Vec<f32> = (0..n).map(|i| (srcs[0][i] + srcs[1][i]) + srcs[2][i]).collect();
    for isa in levels() {
        for stream in [0, usize::MAX] {
            let plan = Plan::with(isa, 64 * 1024, stream);
            let mut dst = vec![0f32; n + 3];
            ops::sum_into(&plan, &mut dst[3..], &srcs);
            assert_bits(&dst[3..], &want, &format!("sum_into 3M {plan:?}"));
            let mut out = vec![0f32; n];
            ops::copy(&plan, &mut out, &dst[3..]);
            assert_bits(&out, &want, &format!("copy 3M {plan:?}"));
            ops::fill(&plan, &mut out, 2.5);
            assert!(out.iter().all(|&x| x == 2.5));
            let h: Vec<f16> = random_vec(&mut r, n);
            let mut hd = vec![f16::ZERO; n];
            ops::sum_into(&plan, &mut hd, &[&h, &h]);
            let hw: Vec<f16> = h.iter().map(|&x| f16::sum_ref(&[x, x])).collect();
            assert_bits(&hd, &hw, &format!("f16 sum 3M {plan:?}"));
        }
    }
}

#[test]
fn sum_of_no_sources_zeroes() {
    let mut d = vec![1.5f32; 100];
    crate::kernels::sum_into::<f32>(&mut d, &[]);
    assert!(d.iter().all(|&x| x == 0.0));
}

#[test]
#[should_panic(expected = "kernels::sum_into: a source has 9 elements but the destination has 10")]
fn sum_rejects_short_source() {
    let mut d = vec![0f32; 10];
    crate::kernels::sum_into(&mut d, &[&[1.0; 10], &[1.0; 9]]);
}

/// The stub's length contract: `zip`-like prefixes, longer sum sources read only so far.
#[test]
fn lengths_follow_the_original_contract() {
    use crate::kernels as k;
    let mut d = vec![1f32; 5];
    k::add_into(&mut d, &[1.0; 3]);
    assert_eq!(d, [2.0, 2.0, 2.0, 1.0, 1.0]);
    k::axpy(&mut d[..2], 2.0, &[1.0; 4]);
    assert_eq!(d, [4.0, 4.0, 2.0, 1.0, 1.0]);
    let mut h = vec![f16::ZERO; 4];
    k::cast(&mut h, &[3.0f32; 2]);
    assert_eq!(h, [f16::from_f32(3.0), f16::from_f32(3.0), f16::ZERO, f16::ZERO]);
    k::sum_into(&mut d[..3], &[&[1.0; 3], &[2.0; 8]]);
    assert_eq!(d, [3.0, 3.0, 3.0, 1.0, 1.0]);
}

#[test]
#[should_panic(expected = "kernels::copy: the source has 4 elements but the destination has 5")]
fn copy_rejects_length_mismatch() {
    crate::kernels::copy(&mut [0f32; 5], &[1.0; 4]);
}

#[test]
fn tuning_round_trips_and_caps_isa() {
    let t = crate::kernels::tuning();
    assert_eq!(t, crate::kernels::Tuning::DEFAULT);
    assert!(Plan::with(Isa::Avx512, 1, 1).isa <= Isa::detected());
}

proptest! {
    /// The public `sum_into` equals the sequential left-to-right f32 sum, bit for bit.
    #[test]
    #[cfg_attr(miri, ignore = "too slow under Miri")]
    fn sum_into_equals_sequential_sum(
        k in 1usize..6,
        n in 0usize..700,
        off in 0usize..16,
        seed in any::<u64>(),
    ) {
        let mut r = Rng(seed | 1);
        let srcs: Vec<Vec<f32>> = (0..k)
            .map(|_| (0..n + off).map(|_| r.float() as f32).collect())
            .collect();
        let views: Vec<&[f32]> = srcs.iter().map(|s| &s[off..]).collect();
        let mut dst = vec![0f32; n];
        crate::kernels::sum_into(&mut dst, &views);
        for (i, d) in dst.iter().enumerate() {
            let mut acc = views[0][i];
            for s in &views[1..] {
                acc += s[i];
            }
            prop_assert_eq!(d.to_bits(), acc.to_bits(), "element {}", i);
        }
    }
}

/// An answered part copied into a loaned output: the same bytes whether the whole output is
/// large enough to stream the part or not (odd offsets and an odd length).
#[test]
fn an_answered_part_lands_exactly_whether_it_streams_or_not() {
    let n = (300 << 10) + 5;
    let src: Vec<u8> = (0..n + 3).map(|i| (i * 31 % 251) as u8).collect();
    for whole in [1 << 10, 64 << 20] {
        let mut dst = vec![0u8; n + 7];
        crate::kernels::copy_element_bytes(&mut dst[7..], &src[3..], whole);
        assert!(dst[7..] == src[3..], "whole output of {whole} bytes");
        assert!(dst[..7].iter().all(|b| *b == 0), "nothing written before the part");
    }
}
