//! [`ErrorCode`]: why a request was refused, carried in the `head` field of an `Error` frame so
//! the requester can return the same typed error a local store would (not only a message).
//!
//! Codes are part of the wire format: never renumber one. A code this build does not know
//! (from a newer peer) reads as [`ErrorCode::Other`]; the message text always says what
//! happened, so nothing is lost.

/// The kind of an `Error` reply (the frame's `head`; its text names the key and the fix).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorCode {
    /// 0: anything not listed below (and every control-connection error).
    Other,
    /// 1: the key (part) is not held by this server: `init` was not called, or workers cut
    /// keys differently.
    NotInitialized,
    /// 2: `init` of a key the server already holds.
    DuplicateInit,
    /// 3: the value's size differs from the key's (the size of a key cannot change).
    ShapeMismatch,
    /// 4: the value's dtype differs from the key's.
    DTypeMismatch,
    /// 5: dense values for a row_sparse key or the other way round, or a pull of the wrong
    /// kind.
    StorageMismatch,
    /// 6: a push whose round id was already counted (a retry or a duplicate): refused, not
    /// applied twice.
    DuplicatePush,
    /// 7: a push whose round id is ahead of the key's rounds (a lost push before it).
    RoundGap,
    /// 8: the request is malformed for its command (chunk layout, ids, configuration).
    InvalidRequest,
    /// 9: an optimizer command without an installed optimizer.
    NoOptimizer,
    /// 10: the optimizer refused the update or the states.
    Optimizer,
    /// 11: the answer would not fit in a frame (`SYNKV_MAX_FRAME_BYTES`).
    TooLarge,
}

impl ErrorCode {
    /// The wire code.
    pub const fn code(self) -> i32 {
        match self {
            ErrorCode::Other => 0,
            ErrorCode::NotInitialized => 1,
            ErrorCode::DuplicateInit => 2,
            ErrorCode::ShapeMismatch => 3,
            ErrorCode::DTypeMismatch => 4,
            ErrorCode::StorageMismatch => 5,
            ErrorCode::DuplicatePush => 6,
            ErrorCode::RoundGap => 7,
            ErrorCode::InvalidRequest => 8,
            ErrorCode::NoOptimizer => 9,
            ErrorCode::Optimizer => 10,
            ErrorCode::TooLarge => 11,
        }
    }

    /// The code for wire value `code`; unknown values are [`ErrorCode::Other`].
    pub const fn from_code(code: i32) -> ErrorCode {
        match code {
            1 => ErrorCode::NotInitialized,
            2 => ErrorCode::DuplicateInit,
            3 => ErrorCode::ShapeMismatch,
            4 => ErrorCode::DTypeMismatch,
            5 => ErrorCode::StorageMismatch,
            6 => ErrorCode::DuplicatePush,
            7 => ErrorCode::RoundGap,
            8 => ErrorCode::InvalidRequest,
            9 => ErrorCode::NoOptimizer,
            10 => ErrorCode::Optimizer,
            11 => ErrorCode::TooLarge,
            _ => ErrorCode::Other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ErrorCode;

    #[test]
    fn codes_round_trip_and_unknown_ones_read_as_other() {
        for code in 0..12 {
            assert_eq!(ErrorCode::from_code(code).code(), code);
        }
        assert_eq!(ErrorCode::from_code(99), ErrorCode::Other);
        assert_eq!(ErrorCode::from_code(-1), ErrorCode::Other);
    }
}
