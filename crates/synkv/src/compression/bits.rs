//! Bit layouts shared by the vector paths (the scalar reference in `twobit.rs` / `onebit.rs`
//! builds words element by element and uses none of this, so the tests compare two
//! independent derivations of the layout).
//!
//! A packed word is the `u32` whose little-endian bytes are the wire bytes (spec K7.6, K7.7):
//! - 2-bit: element `i` in byte `i/4`, the first of a byte's four elements in bits 7–6;
//! - 1-bit: element `i` in byte `i/8`, the first of a byte's eight elements in bit 7.
//!
//! So inside each byte the elements run from the most significant bit down, the opposite of a
//! comparison mask (lane `j` → bit `j`). The quantize kernels therefore reverse the lanes
//! inside each group of 4 (2-bit) or 8 (1-bit) before comparing — one in-register shuffle —
//! which makes lane `j`'s code land at bits `2j+1, 2j` (2-bit, see [`interleave`]) or at bit
//! `j` (1-bit, the mask *is* the word); the residual is shuffled back before it is stored.
//! The dequantize kernels instead test one bit per lane against the tables below.

/// The 2-bit word from the lane masks of a lane-reversed run of 16: bit `2j+1` = `hi` bit `j`,
/// bit `2j` = `lo` bit `j` (so `11` = `+t`, `10` = `−t`, `00` = 0).
#[inline(always)]
pub(super) fn interleave(hi: u16, lo: u16) -> u32 {
    // Spread both halves at once: bit j of each 32-bit half moves to bit 2j of that half.
    let mut x = (u64::from(hi) << 32) | u64::from(lo);
    x = (x | (x << 8)) & 0x00FF_00FF_00FF_00FF;
    x = (x | (x << 4)) & 0x0F0F_0F0F_0F0F_0F0F;
    x = (x | (x << 2)) & 0x3333_3333_3333_3333;
    x = (x | (x << 1)) & 0x5555_5555_5555_5555;
    (((x >> 32) << 1) | (x & 0xFFFF_FFFF)) as u32
}

/// Bit position of the low bit of 2-bit element `j`'s code in its word (`j < 16`).
const fn shift2(j: usize) -> u32 {
    (8 * (j / 4) + 6 - 2 * (j % 4)) as u32
}

/// Bit position of 1-bit element `j` in its word (`j < 32`).
const fn shift1(j: usize) -> u32 {
    (8 * (j / 8) + 7 - j % 8) as u32
}

/// Per lane `j` of a 2-bit word: the code's low bit (`1 << shift2(j)`).
pub(super) const TWO_BIT_LO: [u32; 16] = {
    let mut t = [0u32; 16];
    let mut j = 0;
    while j < 16 {
        t[j] = 1 << shift2(j);
        j += 1;
    }
    t
};

/// Per lane `j` of a 2-bit word: the code's high bit (`2 << shift2(j)`).
pub(super) const TWO_BIT_HI: [u32; 16] = {
    let mut t = [0u32; 16];
    let mut j = 0;
    while j < 16 {
        t[j] = 2 << shift2(j);
        j += 1;
    }
    t
};

/// Per lane `j` of a 1-bit word: its bit (`1 << shift1(j)`).
pub(super) const ONE_BIT: [u32; 32] = {
    let mut t = [0u32; 32];
    let mut j = 0;
    while j < 32 {
        t[j] = 1 << shift1(j);
        j += 1;
    }
    t
};

/// The layout of one vector of `L` lanes in a streaming dequantize, where vectors start at an
/// aligned address rather than at a word: lane `j` holds element `start + j` of the run that
/// begins at the first element of some word `w` (`start + L <= 2·table.len()`, so a vector
/// straddles at most one word boundary).
#[derive(Clone, Copy, Debug)]
pub(super) struct Lanes<const L: usize> {
    /// Per lane, its bit(s) in the word it reads: `table[(start + j) % F]`.
    pub(super) bits: [u32; L],
    /// Per lane, all ones if it reads word `w + 1` rather than `w`.
    pub(super) next: [u32; L],
    /// Bit `j` set if lane `j` reads word `w + 1`.
    pub(super) next_mask: u32,
}

/// [`Lanes`] for a vector whose first lane holds element `start` of its run, given the
/// per-position bit table of the word layout (16 entries for 2-bit, 32 for 1-bit).
pub(super) fn lanes<const L: usize>(table: &[u32], start: usize) -> Lanes<L> {
    let f = table.len();
    debug_assert!(start + L <= 2 * f && L <= 32);
    let mut l = Lanes { bits: [0; L], next: [0; L], next_mask: 0 };
    for j in 0..L {
        let e = start + j;
        l.bits[j] = table[e % f];
        if e >= f {
            l.next[j] = u32::MAX;
            l.next_mask |= 1 << j;
        }
    }
    l
}

/// `[3, 2, 1, 0, 7, 6, 5, 4, …]`: the lane order that reverses each group of 4 (2-bit).
#[cfg(test)]
fn reversed4(j: usize) -> usize {
    4 * (j / 4) + 3 - j % 4
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interleave_puts_hi_above_lo() {
        assert_eq!(interleave(0, 0), 0);
        assert_eq!(interleave(1, 0), 0b10);
        assert_eq!(interleave(0, 1), 0b01);
        assert_eq!(interleave(0x8000, 0x8000), 0b11 << 30);
        assert_eq!(interleave(0xffff, 0), 0xAAAA_AAAA);
        assert_eq!(interleave(0, 0xffff), 0x5555_5555);
        for (hi, lo) in [(0x1234u16, 0xfedcu16), (0xa5a5, 0x5a5a)] {
            let mut want = 0u32;
            for j in 0..16 {
                want |= u32::from(hi >> j & 1) << (2 * j + 1) | u32::from(lo >> j & 1) << (2 * j);
            }
            assert_eq!(interleave(hi, lo), want);
        }
    }

    /// K7.6: codes 11 10 00 11 | 10 00 11 00 for elements 0..8; with lanes reversed in fours,
    /// the masks give the spec's word.
    #[test]
    fn lane_reversal_gives_the_spec_layout() {
        let codes = [0b11u32, 0b10, 0b00, 0b11, 0b10, 0b00, 0b11, 0b00];
        let (mut hi, mut lo) = (0u16, 0u16);
        for j in 0..16 {
            let c = codes.get(reversed4(j)).copied().unwrap_or(0);
            hi |= ((c >> 1) as u16) << j;
            lo |= ((c & 1) as u16) << j;
        }
        assert_eq!(interleave(hi, lo), 0x0000_8ce3);
        // the tables agree with the shifts of the reference layout
        assert_eq!(TWO_BIT_HI[0] | TWO_BIT_LO[0], 0xc0);
        assert_eq!(TWO_BIT_LO[3], 1);
        assert_eq!(TWO_BIT_HI[15], 1 << 25);
        assert_eq!(ONE_BIT[0], 0x80);
        assert_eq!(ONE_BIT[7], 1);
        assert_eq!(ONE_BIT[31], 1 << 24);
    }

    #[test]
    fn lanes_straddle_one_word_boundary() {
        let l = lanes::<16>(&TWO_BIT_LO, 12);
        assert_eq!(l.bits[0], TWO_BIT_LO[12]);
        assert_eq!(l.bits[4], TWO_BIT_LO[0]);
        assert_eq!(l.next_mask, 0xfff0);
        assert_eq!(l.next[3..5], [0, u32::MAX]);
        let l = lanes::<8>(&ONE_BIT, 7 + 24);
        assert_eq!(l.bits[1], ONE_BIT[0]);
        assert_eq!(l.next_mask, 0xfe);
        assert_eq!(lanes::<16>(&TWO_BIT_HI, 0).next_mask, 0);
    }
}
