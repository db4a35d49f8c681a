//! [`Error`]: what can go wrong when configuring compression or (de)quantizing a buffer.
//!
//! Configuration errors follow MXNet's checks (spec K7.2) in our own words; length errors
//! protect the kernels from buffers that do not belong together, which matters on a server,
//! where the packed words and the element count arrive from a peer.

/// A gradient-compression error.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The parameters have no `type` entry (MXNet: "Required parameter type … is not presented").
    #[error("gradient compression: the required parameter `type` is missing; pass type=\"2bit\" or type=\"1bit\"")]
    MissingType,
    /// `type` names no known compression.
    #[error("gradient compression: unknown type `{0}`; the supported types are \"2bit\" and \"1bit\"")]
    UnknownType(String),
    /// `threshold` is not a floating-point number.
    #[error("gradient compression: threshold `{0}` is not a number; give a float such as 0.5")]
    InvalidThreshold(String),
    /// A 2-bit threshold that is not greater than 0.
    #[error("gradient compression: threshold must be greater than 0 for 2bit compression, got {0}")]
    NonPositiveThreshold(f32),
    /// Parameters received from the wire are not `"<type-code>,<threshold>"`.
    #[error("gradient compression: malformed parameters `{0}` on the wire; expected \"<type-code>,<threshold>\" such as \"2,0.5\"")]
    Wire(String),
    /// A compressed payload whose byte length is not a whole number of 32-bit words.
    #[error("gradient compression: a compressed payload of {0} bytes is not a whole number of 32-bit words")]
    RaggedBytes(usize),
    /// Buffers whose lengths do not match the element count.
    #[error("{op}: {what} has {got} elements but {expected} are needed")]
    LengthMismatch {
        /// The operation, e.g. `twobit::quantize`.
        op: &'static str,
        /// Which buffer, e.g. `the residual`.
        what: &'static str,
        /// The length the operation needs.
        expected: usize,
        /// The length it was given.
        got: usize,
    },
}

/// A `Result` whose error is [`compression::Error`](Error).
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Returns a [`Error::LengthMismatch`] unless `got == expected`.
pub(super) fn check_len(op: &'static str, what: &'static str, expected: usize, got: usize) -> Result<()> {
    if got == expected {
        Ok(())
    } else {
        Err(Error::LengthMismatch { op, what, expected, got })
    }
}
