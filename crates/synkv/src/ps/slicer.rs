//! Where keys live: ps keys for int and str keys, the server of a small key, and the slices
//! of a big key ([`Slice`]).
//!
//! - **ps keys.** An int key `k` is `k` as a two's-complement `u32` (so `0..2^32`); a str key
//!   is the 64-bit FNV-1a hash of its UTF-8 bytes with the top bit set (so int and str ps keys
//!   never meet). The hash is stable across processes, platforms and runs, so workers need not
//!   initialise string keys in the same order (MXNet #8224, spec K12.4). Two names with the
//!   same hash are refused by the worker that sees both.
//! - **Small keys** (fewer than `MXNET_KVSTORE_BIGARRAY_BOUND` units) live whole on server
//!   `(ps_key · 9973) mod S` (MXNet's rule for int keys, K8.8, computed without overflow).
//! - **Big keys** are split into `S` contiguous ranges: server `i` gets
//!   `round(n/S·(i+1)) − round(n/S·i)` units, rounding half away from zero in `f64` (K8.8).
//!   Units are elements for dense keys and rows for row_sparse keys (K8.10). Empty ranges
//!   (only possible when `n < S`) are left out.
//!
//! Pure functions; no I/O.

/// Top bit of every str ps key.
const STR_KEY_BIT: u64 = 1 << 63;

/// The ps key of an int key.
pub fn int_key(k: i32) -> u64 {
    u64::from(u32::from_ne_bytes(k.to_ne_bytes()))
}

/// The ps key of a str key: FNV-1a 64 of the UTF-8 bytes, top bit set.
pub fn str_key(name: &str) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let hash = name.bytes().fold(OFFSET, |h, b| (h ^ u64::from(b)).wrapping_mul(PRIME));
    hash | STR_KEY_BIT
}

/// The server (0-based rank) holding a small key among `servers` servers.
pub fn server_of(ps_key: u64, servers: u32) -> u32 {
    let s = u128::from(servers.max(1));
    // Fits: the remainder is below `servers`.
    u32::try_from((u128::from(ps_key) * 9973) % s).unwrap_or(0)
}

/// A contiguous range of a key held by one server, in units (elements or rows).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slice {
    /// The server's rank.
    pub server: u32,
    /// First unit.
    pub offset: usize,
    /// Number of units.
    pub len: usize,
}

/// The slices of a key of `units` units, each `unit_elems` elements, over `servers` servers:
/// one slice on [`server_of`] if `units · unit_elems < bound`, else K8.8's even split.
pub fn slices(ps_key: u64, units: usize, unit_elems: usize, servers: u32, bound: u64) -> Vec<Slice> {
    let elems = u64::try_from(units.saturating_mul(unit_elems)).unwrap_or(u64::MAX);
    if elems < bound || servers <= 1 {
        return vec![Slice { server: server_of(ps_key, servers), offset: 0, len: units }];
    }
    let s = f64::from(servers);
    // `f64::round` rounds half away from zero, as MXNet's `std::lround` does; units are far
    // below 2^53 in practice (the frame limit caps a key at 1 GiB per server).
    let bound_at = |i: u32| -> usize { (units as f64 / s * f64::from(i)).round() as usize };
    (0..servers)
        .map(|i| {
            let (begin, end) = (bound_at(i), bound_at(i + 1).min(units));
            Slice { server: i, offset: begin, len: end.saturating_sub(begin) }
        })
        .filter(|sl| sl.len > 0)
        .collect()
}

/// `slices` with every slice longer than `max_units` cut into the fewest near-equal parts of
/// at most `max_units` units, on the same server (parts of one server's share, in order).
pub fn cut(slices: &[Slice], max_units: usize) -> Vec<Slice> {
    let max_units = max_units.max(1);
    let mut out = Vec::with_capacity(slices.len());
    for s in slices {
        let parts = s.len.div_ceil(max_units).max(1);
        let (base, extra) = (s.len / parts, s.len % parts);
        let mut offset = s.offset;
        for p in 0..parts {
            let len = base + usize::from(p < extra);
            out.push(Slice { server: s.server, offset, len });
            offset += len;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lens(units: usize, servers: u32) -> Vec<usize> {
        slices(0, units, 1, servers, 1_000_000).iter().map(|s| s.len).collect()
    }

    #[test]
    fn k8_8_examples() {
        assert_eq!(lens(1_440_000, 3), vec![480_000; 3]);
        assert_eq!(lens(1_466_521, 3), vec![488_840, 488_841, 488_840]);
        assert_eq!(lens(1_000_000, 3), vec![333_333, 333_334, 333_333]);
        assert_eq!(lens(999_999, 3), vec![999_999], "below the bound: one server");
        assert_eq!((server_of(3, 3), server_of(5, 3), server_of(1, 3)), (0, 2, 1));
    }

    #[test]
    fn every_unit_is_placed_exactly_once() {
        for units in [1usize, 2, 3, 7, 10, 1000, 12_345] {
            for servers in 1..=7u32 {
                let sl = slices(42, units, 1, servers, 1);
                let mut next = 0;
                for s in &sl {
                    assert_eq!(s.offset, next, "{units} units over {servers}");
                    assert!(s.len > 0 && s.server < servers);
                    next += s.len;
                }
                assert_eq!(next, units);
            }
        }
    }

    #[test]
    fn cutting_keeps_every_unit_once_on_the_same_server_in_parts_below_the_bound() {
        let shares = slices(1, 1_466_521, 1, 3, 1_000_000);
        for max in [1usize, 7, 100_000, 488_840, 488_841, 10_000_000] {
            let parts = cut(&shares, max);
            let mut next = 0;
            for p in &parts {
                assert_eq!(p.offset, next);
                assert!(p.len >= 1 && p.len <= max);
                let share = shares.iter().find(|s| s.offset <= p.offset && p.offset < s.offset + s.len).unwrap();
                assert_eq!(p.server, share.server, "a part stays on its share's server");
                next += p.len;
            }
            assert_eq!(next, 1_466_521);
        }
        assert_eq!(cut(&shares, 10_000_000), shares, "nothing to cut");
        let lens: Vec<usize> = cut(&[Slice { server: 0, offset: 0, len: 10 }], 4).iter().map(|s| s.len).collect();
        assert_eq!(lens, vec![4, 3, 3], "the fewest parts, near-equal");
    }

    #[test]
    fn ps_keys_are_stable_and_disjoint() {
        assert_eq!(int_key(3), 3);
        assert_eq!(int_key(-1), u64::from(u32::MAX));
        // FNV-1a 64 reference values (empty string, "a"), top bit set.
        assert_eq!(str_key(""), 0xcbf2_9ce4_8422_2325 | STR_KEY_BIT);
        assert_eq!(str_key("a"), 0xaf63_dc4c_8601_ec8c | STR_KEY_BIT);
        assert_ne!(str_key("weight"), str_key("bias"));
        assert!(str_key("3") > u64::from(u32::MAX));
        // rows × row length decide the split of a row_sparse key
        assert_eq!(slices(7, 10, 100, 2, 1000).len(), 2);
        assert_eq!(slices(7, 9, 100, 2, 1000).len(), 1);
    }
}
