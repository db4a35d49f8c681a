//! [`ServerError`]: why the server refused a request — an [`ErrorCode`] the worker turns back
//! into a typed error, a message that names the key and the fix, and the key part it is about.

use std::fmt;

use super::entry::EntryKey;
use crate::ps::proto::{ErrorCode, Message};

/// A refused request (or one key of it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct ServerError {
    pub(super) code: ErrorCode,
    pub(super) text: String,
    /// The key part the error is about, when there is one.
    pub(super) key: Option<EntryKey>,
}

impl ServerError {
    pub(super) fn new(code: ErrorCode, text: impl Into<String>) -> ServerError {
        ServerError { code, text: text.into(), key: None }
    }

    /// A malformed request.
    pub(super) fn invalid(text: impl Into<String>) -> ServerError {
        ServerError::new(ErrorCode::InvalidRequest, text)
    }

    /// The same error, about key part `key` (kept if already set).
    #[must_use]
    pub(super) fn at(mut self, key: EntryKey) -> ServerError {
        self.key.get_or_insert(key);
        self
    }

    /// The `Error` frame answering request `request_id`.
    pub(super) fn to_message(&self, request_id: u64) -> Message {
        let mut m = Message::coded_error(request_id, self.code, self.text.clone());
        if let Some((ps, offset)) = self.key {
            m.meta.push_key(ps, 0, offset);
        }
        m
    }
}

impl fmt::Display for ServerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}
