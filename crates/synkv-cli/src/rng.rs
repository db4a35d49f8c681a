//! [`SplitMix64`]: a tiny deterministic random generator for the demo, the benchmarks and the
//! self-tests, so every run (and every worker of a job) draws the same numbers without a
//! dependency.

/// SplitMix64 (Steele, Lea, Flood 2014): a 64-bit state advanced by a constant and mixed.
pub(crate) struct SplitMix64(pub(crate) u64);

impl SplitMix64 {
    /// The next 64 random bits.
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1), 53 random bits.
    pub(crate) fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in [0, 1) as f32, 24 random bits.
    pub(crate) fn uniform_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// A standard normal sample (Box–Muller).
    pub(crate) fn normal(&mut self) -> f64 {
        let (u, v) = (self.uniform().max(1e-300), self.uniform());
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }
}

#[cfg(test)]
mod tests {
    use super::SplitMix64;

    #[test]
    fn the_reference_sequence_and_ranges() {
        // SplitMix64 from seed 0: the first output of the reference implementation.
        assert_eq!(SplitMix64(0).next_u64(), 0xe220_a839_7b1d_cdaf);
        let mut r = SplitMix64(7);
        assert!((0..1000).all(|_| (0.0..1.0).contains(&r.uniform()) && (0.0..1.0).contains(&r.uniform_f32())));
    }
}
