//! [`DecodeError`] and [`EncodeError`]: cheap, copyable reasons a frame was refused.
//!
//! An incomplete frame is not an error (`check` returns `Ok(None)`). Messages name the field
//! and, where useful, the value and the limit; they never contain payload bytes.

use super::PROTOCOL_VERSION;

/// Why a received frame was rejected. The connection that sent it is closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The first four bytes are not `SKV1`.
    #[error("bad magic: not a synkv frame")]
    BadMagic,
    /// A version this build does not speak.
    #[error("unsupported protocol version {0} (this build speaks version {PROTOCOL_VERSION})")]
    UnsupportedVersion(u16),
    /// A command code not in [`Command`](super::Command).
    #[error("unknown command code {0}")]
    UnknownCommand(u16),
    /// Flag bits outside [`Flags::KNOWN`](super::Flags::KNOWN).
    #[error("unknown flag bits {0:#06x}")]
    UnknownFlags(u16),
    /// A dtype code outside 0..=12.
    #[error("unknown dtype code {0}")]
    UnknownDType(u8),
    /// A role code other than 1, 2 or 4.
    #[error("unknown role code {0}")]
    UnknownRole(u8),
    /// A count or length above its [`Limits`](super::Limits) bound.
    #[error("{field} is {value}, above the limit {max}")]
    TooLarge {
        /// The field.
        field: &'static str,
        /// Its value on the wire.
        value: u64,
        /// The bound it broke.
        max: u64,
    },
    /// A field runs past the end of the frame.
    #[error("{field} runs past the end of the frame")]
    Truncated {
        /// The field that did not fit.
        field: &'static str,
    },
    /// Bytes left over after the last chunk.
    #[error("{count} trailing bytes after the last field")]
    TrailingBytes {
        /// How many.
        count: u64,
    },
    /// Reserved bytes or padding that are not zero.
    #[error("non-zero {field}")]
    NonZeroPadding {
        /// Which reserved field or padding.
        field: &'static str,
    },
    /// A string field that is not UTF-8.
    #[error("{field} is not valid UTF-8")]
    InvalidUtf8 {
        /// The field.
        field: &'static str,
    },
    /// A field whose value is out of its allowed range.
    #[error("invalid {field}: {value}")]
    InvalidField {
        /// The field.
        field: &'static str,
        /// Its value (widened).
        value: u64,
    },
    /// Lengths that must agree do not.
    #[error("{field} do not add up")]
    LengthMismatch {
        /// What disagreed.
        field: &'static str,
    },
    /// Arithmetic on wire values overflowed.
    #[error("arithmetic overflow computing {field}")]
    Overflow {
        /// What was being computed.
        field: &'static str,
    },
}

/// Why a message could not be encoded (it would break the [`Limits`](super::Limits) or a layout
/// rule, so a peer would reject it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EncodeError {
    /// A count or length above its bound.
    #[error("cannot encode: {field} is {value}, above the limit {max}")]
    TooLarge {
        /// The field.
        field: &'static str,
        /// Its value.
        value: u64,
        /// The bound.
        max: u64,
    },
    /// Lengths that must agree do not (e.g. key lengths vs chunk lengths).
    #[error("cannot encode: {field} do not add up")]
    LengthMismatch {
        /// What disagreed.
        field: &'static str,
    },
}
