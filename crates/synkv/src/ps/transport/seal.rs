//! [`Seal`]: the integrity of every frame after a connection's handshake.
//!
//! Each frame is followed by a [`TRAILER_LEN`]-byte trailer: the BLAKE3 digest of the frame's
//! bytes, encrypted and authenticated by the connection's Noise transport state (ChaCha20-
//! Poly1305 under that direction's session key; the Noise nonce counts the frames). A changed
//! bit, or a frame inserted, dropped, replayed or reordered, makes the trailer fail to open:
//! the reader returns [`AuthError::Integrity`](crate::ps::AuthError::Integrity) and the
//! connection is closed. Keys and nonces are the Noise framework's (the `snow` crate); BLAKE3
//! carries the bulk because it hashes several times faster than either AEAD authenticates.
//!
//! The digest is taken as the bytes move: the writer hashes what each write call handed to the
//! kernel, the reader what each read received, while those bytes are still in cache.

use std::sync::{Mutex, PoisonError};

/// Bytes after every sealed frame: a 32-byte digest and a 16-byte tag.
pub const TRAILER_LEN: usize = 32 + 16;
/// The most bytes one read or write call moves on a sealed connection, so the bytes just moved
/// are still in the core's cache when they are hashed (BLAKE3 runs about twice as fast on
/// cached bytes as on bytes fetched from memory); a few more system calls are cheaper.
pub(crate) const HASH_STEP: usize = 256 << 10;

/// One connection's session keys and frame counters (both directions).
pub struct Seal {
    state: Mutex<snow::TransportState>,
}

impl std::fmt::Debug for Seal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Seal(<session keys>)")
    }
}

impl Seal {
    /// The seal of a finished handshake.
    pub fn new(state: snow::TransportState) -> Seal {
        Seal { state: Mutex::new(state) }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, snow::TransportState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The trailer of the next outgoing frame, whose bytes hashed to `digest`.
    pub(crate) fn seal(&self, digest: &blake3::Hash) -> std::io::Result<[u8; TRAILER_LEN]> {
        let mut out = [0u8; TRAILER_LEN];
        let n =
            self.state().write_message(digest.as_bytes(), &mut out).map_err(|e| std::io::Error::other(format!("sealing a frame: {e}")))?;
        debug_assert_eq!(n, TRAILER_LEN);
        Ok(out)
    }

    /// Whether `trailer` seals the next incoming frame, whose bytes hashed to `digest`.
    pub(crate) fn open(&self, trailer: &[u8], digest: &blake3::Hash) -> bool {
        let mut sealed = [0u8; TRAILER_LEN];
        match self.state().read_message(trailer, &mut sealed) {
            // `blake3::Hash` compares in constant time.
            Ok(32) => {
                let mut sent = [0u8; 32];
                sent.copy_from_slice(&sealed[..32]);
                blake3::Hash::from_bytes(sent) == *digest
            }
            _ => false,
        }
    }
}

/// A running digest of one frame's bytes, fed as they move.
#[derive(Default)]
pub(crate) struct FrameDigest {
    hasher: blake3::Hasher,
    /// Bytes of the current frame already hashed.
    pub(crate) hashed: usize,
}

impl FrameDigest {
    pub(crate) fn update(&mut self, bytes: &[u8]) {
        self.hasher.update(bytes);
        self.hashed += bytes.len();
    }

    /// The frame's digest; starts over for the next frame.
    pub(crate) fn finish(&mut self) -> blake3::Hash {
        let digest = self.hasher.finalize();
        self.hasher.reset();
        self.hashed = 0;
        digest
    }
}
