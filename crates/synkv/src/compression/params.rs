//! [`GradientCompression`]: the configuration set by `set_gradient_compression`, its parsing
//! and validation (spec K7.2), its wire form (K7.12), compressed sizes (K7.3) and the
//! partition of a big key's compressed words across servers (K7.11).
//!
//! This file holds no kernels and no state; it only describes what to do.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::error::{Error, Result};

/// A compression scheme.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub enum CompressionType {
    /// `"2bit"`: 16 values per 32-bit word, each `+t`, `−t` or `0` (spec K7.4–K7.6).
    #[serde(rename = "2bit")]
    TwoBit,
    /// `"1bit"`: 32 values per 32-bit word, each `+1` or `−1` (spec K7.7; MXNet 2.0 only).
    #[serde(rename = "1bit")]
    OneBit,
}

impl CompressionType {
    /// The name used in the parameters: `"2bit"` or `"1bit"`.
    pub fn name(self) -> &'static str {
        match self {
            CompressionType::TwoBit => "2bit",
            CompressionType::OneBit => "1bit",
        }
    }

    /// Values packed into one 32-bit word: 16 for 2-bit, 32 for 1-bit (spec K7.3).
    pub fn factor(self) -> usize {
        match self {
            CompressionType::TwoBit => 16,
            CompressionType::OneBit => 32,
        }
    }

    /// The integer MXNet 2.0 sends for this type (`kOneBit = 1`, `kTwoBit = 2`; spec K7.12).
    pub fn wire_code(self) -> u8 {
        match self {
            CompressionType::OneBit => 1,
            CompressionType::TwoBit => 2,
        }
    }

    /// The type with this wire code, if any (0, MXNet's `kNone`, is not a compression).
    pub fn from_wire_code(code: u8) -> Option<CompressionType> {
        match code {
            1 => Some(CompressionType::OneBit),
            2 => Some(CompressionType::TwoBit),
            _ => None,
        }
    }

    /// 32-bit words holding `n` compressed values: `ceil(n / factor)` (spec K7.3).
    pub fn compressed_len(self, n: usize) -> usize {
        n.div_ceil(self.factor())
    }

    /// How a key of `n` elements is split across `servers` servers, as `(elements, words)`
    /// per server in server order (spec K7.11).
    ///
    /// With `c = ceil(n / factor)` words, server `i < S−1` gets
    /// `round(c/S·(i+1)) − round(c/S·i)` words (rounding half away from zero, in f64, as MXNet
    /// does) and `words·factor` elements; the last server gets the remaining words and
    /// elements. Boundaries fall on whole words, so the worker can quantize the whole key into
    /// one buffer and send each server its slice of words.
    ///
    /// Elements are clamped to `n`: for keys of fewer than about `S/2` words MXNet's formula
    /// would give the last server a negative count (it only applies it to keys above the
    /// big-array bound, where that cannot happen); here a server may then get the short final
    /// word and the last ones nothing. For every key MXNet does split, the result is MXNet's.
    /// `servers == 0` gives an empty vector.
    pub fn partition_words(self, n: usize, servers: usize) -> Vec<(usize, usize)> {
        let factor = self.factor();
        let c = self.compressed_len(n);
        let bound = |i: usize| -> usize {
            if i == servers {
                c
            } else {
                // c/S·i, as MXNet computes it: divide first, then multiply, then round.
                ((c as f64 / servers as f64 * i as f64).round() as usize).min(c)
            }
        };
        (0..servers)
            .map(|i| {
                let (w0, w1) = (bound(i), bound(i + 1).max(bound(i)));
                let elements = (w1 * factor).min(n) - (w0 * factor).min(n);
                (elements, w1 - w0)
            })
            .collect()
    }
}

impl fmt::Display for CompressionType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for CompressionType {
    type Err = Error;

    /// Parses `"2bit"` or `"1bit"` (case-sensitive, as MXNet).
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "2bit" => Ok(CompressionType::TwoBit),
            "1bit" => Ok(CompressionType::OneBit),
            other => Err(Error::UnknownType(other.to_owned())),
        }
    }
}

/// A validated gradient-compression configuration: a [`CompressionType`] and a threshold.
///
/// Build it from MXNet-style string pairs ([`from_pairs`](Self::from_pairs)), from typed
/// values ([`new`](Self::new)), from JSON (serde: `{"type": "2bit", "threshold": 0.5}`, with
/// the same defaults and checks), or from the wire ([`from_wire`](Self::from_wire)). Every
/// constructor applies MXNet's checks, so a value of this type is always usable: a 2-bit
/// threshold is greater than 0; a 1-bit threshold may be anything (it only decides the sign).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "RawParams")]
pub struct GradientCompression {
    #[serde(rename = "type")]
    kind: CompressionType,
    threshold: f32,
}

/// The serde input before validation: unknown fields ignored, `type` optional so that its
/// absence gets our message, `threshold` defaulting to 0.5.
#[derive(Deserialize)]
struct RawParams {
    #[serde(rename = "type")]
    kind: Option<String>,
    #[serde(default = "default_threshold")]
    threshold: f32,
}

fn default_threshold() -> f32 {
    GradientCompression::DEFAULT_THRESHOLD
}

impl TryFrom<RawParams> for GradientCompression {
    type Error = Error;

    fn try_from(raw: RawParams) -> Result<Self> {
        let kind: CompressionType = raw.kind.ok_or(Error::MissingType)?.parse()?;
        GradientCompression::new(kind, raw.threshold)
    }
}

impl GradientCompression {
    /// The threshold when none is given (MXNet's default).
    pub const DEFAULT_THRESHOLD: f32 = 0.5;

    /// A configuration of `kind` with `threshold`.
    ///
    /// # Errors
    /// [`Error::NonPositiveThreshold`] for 2-bit with `threshold <= 0` (or NaN).
    pub fn new(kind: CompressionType, threshold: f32) -> Result<Self> {
        // Anything but "greater than 0" fails, NaN included, as MXNet's `threshold > 0` check.
        if kind == CompressionType::TwoBit && threshold.partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater) {
            return Err(Error::NonPositiveThreshold(threshold));
        }
        Ok(GradientCompression { kind, threshold })
    }

    /// Parses MXNet's `set_gradient_compression` parameters, given as string key/value pairs
    /// (the Python front-end stringifies every value).
    ///
    /// - `type` is required: `"2bit"` or `"1bit"` (case-sensitive);
    /// - `threshold` is a float, default 0.5; it must be greater than 0 for 2-bit;
    /// - any other key is ignored, and a repeated key keeps its last value.
    ///
    /// # Errors
    /// In MXNet's order: [`Error::InvalidThreshold`], [`Error::MissingType`],
    /// [`Error::UnknownType`], [`Error::NonPositiveThreshold`].
    pub fn from_pairs<I, K, V>(pairs: I) -> Result<Self>
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<str>,
        V: AsRef<str>,
    {
        let mut kind = None;
        let mut threshold = None;
        for (k, v) in pairs {
            match k.as_ref() {
                "type" => kind = Some(v.as_ref().to_owned()),
                "threshold" => threshold = Some(v.as_ref().to_owned()),
                _ => {}
            }
        }
        // Field parsing comes before the required-field check, as in MXNet's parameter parser.
        let threshold = match threshold {
            Some(s) => s.trim().parse::<f32>().map_err(|_| Error::InvalidThreshold(s))?,
            None => Self::DEFAULT_THRESHOLD,
        };
        let kind: CompressionType = kind.ok_or(Error::MissingType)?.parse()?;
        Self::new(kind, threshold)
    }

    /// The compression scheme.
    pub fn kind(&self) -> CompressionType {
        self.kind
    }

    /// The threshold.
    pub fn threshold(&self) -> f32 {
        self.threshold
    }

    /// 32-bit words holding `n` compressed values (see [`CompressionType::compressed_len`]).
    pub fn compressed_len(&self, n: usize) -> usize {
        self.kind.compressed_len(n)
    }

    /// The split of a big key across servers (see [`CompressionType::partition_words`]).
    pub fn partition_words(&self, n: usize, servers: usize) -> Vec<(usize, usize)> {
        self.kind.partition_words(n, servers)
    }

    /// The parameters as rank 0 sends them to the servers: `"<type-code>,<threshold>"`, with
    /// MXNet 2.0's codes (`1` = 1-bit, `2` = 2-bit; spec K7.12).
    ///
    /// MXNet prints the threshold with six decimals (`"2,0.500000"`), which rounds small
    /// thresholds (1e-7 becomes 0, which the server would then refuse). We print the shortest
    /// decimal that reads back as the same `f32` (`"2,0.5"`), so worker and server dequantize
    /// with bit-identical thresholds; [`from_wire`](Self::from_wire) reads both forms.
    pub fn to_wire(&self) -> String {
        format!("{},{}", self.kind.wire_code(), self.threshold)
    }

    /// Parses [`to_wire`](Self::to_wire)'s form (or MXNet's six-decimal one) and validates it
    /// as [`new`](Self::new) does.
    ///
    /// # Errors
    /// [`Error::Wire`] if the text is not `"<1|2>,<float>"`; [`Error::NonPositiveThreshold`]
    /// for a 2-bit threshold that is not greater than 0.
    pub fn from_wire(s: &str) -> Result<Self> {
        let bad = || Error::Wire(s.chars().take(64).collect());
        let (code, threshold) = s.split_once(',').ok_or_else(bad)?;
        let kind = code.trim().parse::<u8>().ok().and_then(CompressionType::from_wire_code).ok_or_else(bad)?;
        let threshold = threshold.trim().parse::<f32>().map_err(|_| bad())?;
        Self::new(kind, threshold)
    }
}

impl fmt::Display for GradientCompression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{{type: {}, threshold: {}}}", self.kind, self.threshold)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn parse(pairs: &[(&str, &str)]) -> Result<GradientCompression> {
        GradientCompression::from_pairs(pairs.iter().copied())
    }

    #[test]
    fn parses_like_mxnet() {
        let gc = parse(&[("type", "2bit"), ("threshold", "0.5")]).unwrap();
        assert_eq!((gc.kind(), gc.threshold()), (CompressionType::TwoBit, 0.5));
        // default threshold, unknown keys ignored
        let gc = parse(&[("type", "2bit"), ("compression", "1bit"), ("foo", "bar")]).unwrap();
        assert_eq!((gc.kind(), gc.threshold()), (CompressionType::TwoBit, 0.5));
        // 1bit accepts any threshold (the upstream tests use −0.5, 0, 0.5) and defaults to 0.5
        for t in ["-0.5", "0", "0.5"] {
            let gc = parse(&[("type", "1bit"), ("threshold", t)]).unwrap();
            assert_eq!(gc.threshold(), t.parse::<f32>().unwrap());
        }
        assert_eq!(parse(&[("type", "1bit")]).unwrap().threshold(), 0.5);
        // last value of a repeated key wins
        assert_eq!(parse(&[("type", "1bit"), ("type", "2bit")]).unwrap().kind(), CompressionType::TwoBit);
    }

    #[test]
    fn rejects_like_mxnet() {
        assert_eq!(parse(&[("threshold", "0.5")]), Err(Error::MissingType));
        assert_eq!(parse(&[]), Err(Error::MissingType));
        assert_eq!(parse(&[("type", "3bit")]), Err(Error::UnknownType("3bit".into())));
        assert_eq!(parse(&[("type", "2BIT")]), Err(Error::UnknownType("2BIT".into())));
        assert_eq!(parse(&[("type", "2bit"), ("threshold", "0")]), Err(Error::NonPositiveThreshold(0.0)));
        assert_eq!(parse(&[("type", "2bit"), ("threshold", "-0.5")]), Err(Error::NonPositiveThreshold(-0.5)));
        assert!(matches!(parse(&[("type", "2bit"), ("threshold", "NaN")]), Err(Error::NonPositiveThreshold(_))));
        assert_eq!(parse(&[("type", "2bit"), ("threshold", "half")]), Err(Error::InvalidThreshold("half".into())));
        // a bad threshold is reported before a missing type, as MXNet's parser does
        assert_eq!(parse(&[("threshold", "x")]), Err(Error::InvalidThreshold("x".into())));
        let msg = parse(&[]).unwrap_err().to_string();
        assert!(msg.contains("required parameter `type`"), "{msg}");
        let msg = parse(&[("type", "4bit")]).unwrap_err().to_string();
        assert!(msg.contains("unknown type `4bit`"), "{msg}");
        let msg = parse(&[("type", "2bit"), ("threshold", "0")]).unwrap_err().to_string();
        assert!(msg.contains("threshold must be greater than 0 for 2bit"), "{msg}");
    }

    #[test]
    fn serde_json_uses_the_same_rules() {
        let gc: GradientCompression = serde_json::from_str(r#"{"type": "1bit", "threshold": -0.5, "extra": 1}"#).unwrap();
        assert_eq!((gc.kind(), gc.threshold()), (CompressionType::OneBit, -0.5));
        let gc: GradientCompression = serde_json::from_str(r#"{"type": "2bit"}"#).unwrap();
        assert_eq!(gc.threshold(), 0.5);
        assert_eq!(serde_json::to_string(&gc).unwrap(), r#"{"type":"2bit","threshold":0.5}"#);
        let err = serde_json::from_str::<GradientCompression>(r#"{"threshold": 0.5}"#).unwrap_err().to_string();
        assert!(err.contains("required parameter `type`"), "{err}");
        let err = serde_json::from_str::<GradientCompression>(r#"{"type": "8bit"}"#).unwrap_err().to_string();
        assert!(err.contains("unknown type `8bit`"), "{err}");
        let err = serde_json::from_str::<GradientCompression>(r#"{"type": "2bit", "threshold": 0}"#).unwrap_err().to_string();
        assert!(err.contains("greater than 0"), "{err}");
    }

    #[test]
    fn wire_round_trip_and_mxnet_form() {
        let gc = GradientCompression::new(CompressionType::TwoBit, 0.5).unwrap();
        assert_eq!(gc.to_wire(), "2,0.5");
        assert_eq!(GradientCompression::from_wire("2,0.500000").unwrap(), gc);
        let one = GradientCompression::new(CompressionType::OneBit, -0.5).unwrap();
        assert_eq!(one.to_wire(), "1,-0.5");
        assert_eq!(GradientCompression::from_wire(&one.to_wire()).unwrap(), one);
        // a tiny threshold survives (MXNet's "%f" would send 0.000000)
        let tiny = GradientCompression::new(CompressionType::TwoBit, 1e-7).unwrap();
        assert_eq!(GradientCompression::from_wire(&tiny.to_wire()).unwrap(), tiny);
        for bad in ["", "2", "0,0.5", "3,0.5", "x,0.5", "2,abc", "2;0.5"] {
            assert!(matches!(GradientCompression::from_wire(bad), Err(Error::Wire(_))), "{bad}");
        }
        assert_eq!(GradientCompression::from_wire("2,0"), Err(Error::NonPositiveThreshold(0.0)));
    }

    #[test]
    fn sizes() {
        assert_eq!(CompressionType::TwoBit.compressed_len(0), 0);
        assert_eq!(CompressionType::TwoBit.compressed_len(6), 1);
        assert_eq!(CompressionType::TwoBit.compressed_len(16), 1);
        assert_eq!(CompressionType::TwoBit.compressed_len(17), 2);
        assert_eq!(CompressionType::TwoBit.compressed_len(1211 * 1211), 91_658);
        assert_eq!(CompressionType::OneBit.compressed_len(32), 1);
        assert_eq!(CompressionType::OneBit.compressed_len(33), 2);
    }

    #[test]
    fn partition_example_k7_11() {
        let parts = CompressionType::TwoBit.partition_words(1_466_521, 3);
        assert_eq!(parts, vec![(488_848, 30_553), (488_832, 30_552), (488_841, 30_553)]);
        assert!(CompressionType::TwoBit.partition_words(10, 0).is_empty());
        assert_eq!(CompressionType::OneBit.partition_words(100, 1), vec![(100, 4)]);
        // fewer words than servers: still a partition
        assert_eq!(CompressionType::TwoBit.partition_words(10, 3), vec![(0, 0), (10, 1), (0, 0)]);
    }

    proptest! {
        #[test]
        fn partition_covers_the_key(n in 0usize..5_000_000, servers in 1usize..16, one_bit: bool) {
            let kind = if one_bit { CompressionType::OneBit } else { CompressionType::TwoBit };
            let parts = kind.partition_words(n, servers);
            prop_assert_eq!(parts.len(), servers);
            prop_assert_eq!(parts.iter().map(|p| p.0).sum::<usize>(), n);
            prop_assert_eq!(parts.iter().map(|p| p.1).sum::<usize>(), kind.compressed_len(n));
            // every part's words hold exactly its elements
            for &(elements, words) in &parts {
                prop_assert_eq!(kind.compressed_len(elements), words);
            }
        }

        #[test]
        fn wire_round_trips(t in proptest::num::f32::ANY, one_bit: bool) {
            let kind = if one_bit { CompressionType::OneBit } else { CompressionType::TwoBit };
            if let Ok(gc) = GradientCompression::new(kind, t) {
                let back = GradientCompression::from_wire(&gc.to_wire()).unwrap();
                prop_assert_eq!(back.kind(), kind);
                if t.is_nan() {
                    prop_assert!(back.threshold().is_nan());
                } else {
                    prop_assert_eq!(back.threshold().to_bits(), t.to_bits());
                }
            }
        }
    }
}
