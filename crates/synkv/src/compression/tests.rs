//! Cross-cutting tests: the upstream residual sequences (spec K7.14, tests T23, T28, T29)
//! with the store reduced to its arithmetic, and the conservation property of error feedback.

use proptest::prelude::*;

use super::*;

/// The upstream tests' optimizer multiplier (`Test` optimizer: `w += rate · merged`).
const RATE: f32 = 2.0;

/// One push of `grads` (one per source: a device of the `device` store, or a worker of a
/// dist store) for key `key`, reduced to its arithmetic: each source quantizes with its own
/// residual (K7.9: per (key, device); K7.10: per key on each worker, so per (key, worker)
/// seen from the server), the merge side dequantizes the first source and adds the others
/// (K7.10's server does the same), then `w += RATE · merged`.
fn push(gc: &GradientCompression, residuals: &Residuals<(i32, usize)>, key: i32, w: &mut [f32], grads: &[Vec<f32>]) {
    let mut merged = vec![0.0f32; w.len()];
    let sources = grads.iter().enumerate().map(|(src, g)| ((key, src), &g[..]));
    gc.reduce(residuals, sources, &mut merged, &mut Vec::new()).unwrap();
    for (w, m) in w.iter_mut().zip(&merged) {
        *w += RATE * m;
    }
}

fn full(sources: usize, n: usize, v: f32) -> Vec<Vec<f32>> {
    vec![vec![v; n]; sources]
}

fn assert_all(w: &[f32], want: f32, what: &str) {
    assert!(w.iter().all(|&x| x == want), "{what}: want {want}, got {:?}", &w[..w.len().min(4)]);
}

/// T23, 2-bit, `local_allreduce_device` with 4 devices (shapes (4,4), (100,100) and one
/// with a partial last word): zeros → 0; 0.4, 0.2, 0.2, 0.2 → 0, 4, 4, 8 (residual back to
/// exactly 0); then −0.5 ten times → −4 each.
#[test]
fn t23_two_bit_residual_sequence() {
    let gc = GradientCompression::from_pairs([("type", "2bit"), ("threshold", "0.5")]).unwrap();
    let devices = 4;
    let step = 0.5 * RATE * devices as f32;
    for (key, n) in [(3, 16), (5, 100 * 100), (7, 1211)] {
        let res = Residuals::new();
        let mut w = vec![0.0f32; n];
        for _ in 0..10 {
            push(&gc, &res, key, &mut w, &full(devices, n, 0.0));
            assert_all(&w, 0.0, "zeros");
        }
        for (g, want) in [(0.4f32, 0.0), (0.2, step), (0.2, step), (0.2, 2.0 * step)] {
            push(&gc, &res, key, &mut w, &full(devices, n, g));
            assert_all(&w, want, "residual sequence");
        }
        for d in 0..devices {
            assert_all(&res.get(&(key, d)).unwrap().to_vec(), 0.0, "residual after the sequence");
        }
        let mut want = 2.0 * step;
        for _ in 0..10 {
            push(&gc, &res, key, &mut w, &full(devices, n, -0.5));
            want -= step;
            assert_all(&w, want, "negative pushes");
        }
    }
}

/// T28, 2-bit on a dist store with `n` workers: 0.4, 0.1, 0.2, 0.3 → 0, n, n, 2n; then
/// `ones·t` → += rate·n·t; random values → Δ = rate · Σ dequantized.
#[test]
fn t28_dist_two_bit_sequence() {
    let gc = GradientCompression::from_pairs([("type", "2bit"), ("threshold", "0.5")]).unwrap();
    for workers in [1usize, 2, 3] {
        let nf = workers as f32;
        for (key, n) in [(1000, 6), (1200, 1211 * 13)] {
            let res = Residuals::new();
            let mut w = vec![0.0f32; n];
            push(&gc, &res, key, &mut w, &full(workers, n, 0.0));
            assert_all(&w, 0.0, "zeros");
            for (g, want) in [(0.4f32, 0.0), (0.1, nf), (0.2, nf), (0.3, 2.0 * nf)] {
                push(&gc, &res, key, &mut w, &full(workers, n, g));
                assert_all(&w, want, "residual sequence");
            }
            push(&gc, &res, key, &mut w, &full(workers, n, 0.5));
            assert_all(&w, 2.0 * nf + RATE * nf * 0.5, "ones·t");
        }
    }
}

/// T23 (1-bit, t ∈ {−0.5, 0, 0.5}, 4 devices) and T29 (1-bit dist, t = 0): ones ten times →
/// +rate·n each; −ones ten times → back to 0; then 2, 0, −2 → ±rate·n following the residual.
#[test]
fn t23_t29_one_bit_sequences() {
    for (sources, thresholds) in [(4usize, &[-0.5f32, 0.0, 0.5][..]), (3, &[0.0][..])] {
        for &t in thresholds {
            let gc = GradientCompression::from_pairs([("type", "1bit"), ("threshold", &t.to_string())]).unwrap();
            let step = RATE * sources as f32;
            for (key, n) in [(3, 16), (5, 100 * 100), (7, 1211)] {
                let res = Residuals::new();
                let mut w = vec![0.0f32; n];
                for i in 0..10 {
                    push(&gc, &res, key, &mut w, &full(sources, n, 1.0));
                    assert_all(&w, (i + 1) as f32 * step, "ones");
                }
                for i in 0..10 {
                    push(&gc, &res, key, &mut w, &full(sources, n, -1.0));
                    assert_all(&w, (9 - i) as f32 * step, "minus ones");
                }
                // the upstream expectations, computed as the test computes them
                let mut r = 0.0f32;
                let mut want = 0.0f32;
                for g in [2.0f32, 0.0, -2.0] {
                    r += g;
                    if r > t {
                        want += step;
                        r -= 1.0;
                    } else {
                        want -= step;
                        r += 1.0;
                    }
                    push(&gc, &res, key, &mut w, &full(sources, n, g));
                    assert_all(&w, want, "2, 0, −2");
                }
                assert_eq!([want, r], [step, -1.0], "t={t}: the sequence is +, +, −");
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Error feedback loses nothing: after any number of pushes, the dequantized values sent
    /// plus the residual left equal the gradients pushed, up to f32 rounding.
    #[test]
    fn quantization_plus_residual_conserves_the_gradient(
        n in 1usize..300,
        steps in 1usize..12,
        seed in any::<u64>(),
        one_bit: bool,
        t in 0.05f32..1.5,
    ) {
        let gc = if one_bit {
            GradientCompression::new(CompressionType::OneBit, t - 0.75).unwrap()
        } else {
            GradientCompression::new(CompressionType::TwoBit, t).unwrap()
        };
        let mut rng = seed;
        let mut next = move || {
            rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((rng >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
        };
        let residual = Residual::zeros(n);
        let mut packed = vec![0u32; gc.compressed_len(n)];
        let mut sent = vec![0.0f64; n];
        let mut pushed = vec![0.0f64; n];
        let mut d = vec![0.0f32; n];
        for _ in 0..steps {
            let g: Vec<f32> = (0..n).map(|_| next()).collect();
            residual.quantize(&gc, &g, &mut packed).unwrap();
            gc.dequantize(&packed, n, &mut d).unwrap();
            for i in 0..n {
                sent[i] += f64::from(d[i]);
                pushed[i] += f64::from(g[i]);
            }
        }
        let r = residual.to_vec();
        for i in 0..n {
            let err = (sent[i] + f64::from(r[i]) - pushed[i]).abs();
            // two f32 roundings per step, on values below 2 + |t| + 1 + |residual|
            prop_assert!(err <= 1e-6 * steps as f64 * 8.0, "element {}: sent {} + residual {} vs pushed {}", i, sent[i], r[i], pushed[i]);
        }
    }
}

/// `n` test values from `seed`: mostly uniform in (−2, 2), with a sprinkling of the values
/// where comparisons and rounding are delicate (±0, ±0.5, ±1, subnormals, ±∞, NaN) and of
/// arbitrary bit patterns.
pub(super) fn sample(n: usize, seed: u64) -> Vec<f32> {
    const SPECIAL: [f32; 10] = [0.0, -0.0, 0.5, -0.5, 1.0, -1.0, 1e-40, f32::INFINITY, f32::NEG_INFINITY, f32::NAN];
    let mut s = seed ^ 0x9e37_79b9_7f4a_7c15;
    (0..n)
        .map(|_| {
            // splitmix64
            s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            match z % 16 {
                0 => SPECIAL[(z >> 8) as usize % SPECIAL.len()],
                1 => f32::from_bits((z >> 16) as u32),
                _ => ((z >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0,
            }
        })
        .collect()
}

/// The bits of each value, NaNs made one (LLVM does not preserve NaN payloads, and neither
/// path promises them; every other value must match bit for bit).
pub(super) fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| if x.is_nan() { 0x7fc0_0000 } else { x.to_bits() }).collect()
}
