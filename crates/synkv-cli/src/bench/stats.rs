//! Timing statistics: median, min, max of a set of samples in milliseconds.

/// Summary of timed iterations.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Stats {
    pub(crate) median_ms: f64,
    pub(crate) min_ms: f64,
    pub(crate) max_ms: f64,
}

impl Stats {
    /// Summarises samples (milliseconds); an empty set gives zeros.
    pub(crate) fn of(samples: &[f64]) -> Stats {
        if samples.is_empty() {
            return Stats { median_ms: 0.0, min_ms: 0.0, max_ms: 0.0 };
        }
        let mut s = samples.to_vec();
        s.sort_by(f64::total_cmp);
        let n = s.len();
        let median_ms = if n % 2 == 1 { s[n / 2] } else { (s[n / 2 - 1] + s[n / 2]) / 2.0 };
        Stats { median_ms, min_ms: s[0], max_ms: s[n - 1] }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_min_max() {
        let s = Stats::of(&[3.0, 1.0, 2.0, 10.0]);
        assert_eq!(s.median_ms, 2.5);
        assert_eq!(s.min_ms, 1.0);
        assert_eq!(s.max_ms, 10.0);
        assert_eq!(Stats::of(&[5.0, 1.0, 3.0]).median_ms, 3.0);
    }
}
