//! [`Landing`]: where the chunks of an expected reply go, so that a reader writes them from the
//! socket straight into their destinations (a pulled value into its output) instead of into
//! its buffer and then, by a second copy, into the output (issue 13 item 2, over TCP).
//!
//! A worker registers a landing with a request; its reader, on the reply's header, claims the
//! landing's targets, reads the head (header and meta section), checks that the chunks are
//! exactly those expected (count, lengths, dtypes), and reads each chunk's bytes into its
//! target, hashing them as they arrive on a sealed connection. The message it returns carries
//! [`Flags::LANDED`](crate::ps::proto::Flags::LANDED) and chunks without bytes. Any other
//! layout, a reply in shared memory, or a small reply is read the usual way, and the targets
//! stay with the landing for the receiver to fill.
//!
//! A landed reply whose trailer then fails to open (or whose connection breaks midway) has
//! written into its targets: the request fails (or, with replicas, is answered again by the
//! server that took over), so a failed pull leaves its output unspecified.

use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::ps::proto::DTypeCode;

/// Replies smaller than this are read into the buffer and copied: a read per chunk costs more
/// than the copy.
pub const LAND_MIN: usize = 32 << 10;

/// Memory a chunk can be written into and read back from.
pub trait Target: Send {
    /// The bytes.
    fn bytes(&self) -> &[u8];
    /// The bytes, to write.
    fn bytes_mut(&mut self) -> &mut [u8];
}

impl<T: AsRef<[u8]> + AsMut<[u8]> + Send> Target for T {
    fn bytes(&self) -> &[u8] {
        self.as_ref()
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        self.as_mut()
    }
}

/// The destinations of an expected reply's chunks, in order.
pub struct Landing {
    dtypes: Vec<DTypeCode>,
    targets: Mutex<Option<Vec<Box<dyn Target>>>>,
}

impl std::fmt::Debug for Landing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Landing").field("dtypes", &self.dtypes).finish_non_exhaustive()
    }
}

impl Landing {
    /// A landing for a reply of exactly these chunks (dtype, and the target whose length is
    /// the chunk's).
    pub fn new(chunks: Vec<(DTypeCode, Box<dyn Target>)>) -> Landing {
        let (dtypes, targets) = chunks.into_iter().unzip();
        Landing { dtypes, targets: Mutex::new(Some(targets)) }
    }

    /// The targets, if nobody holds them (a reader landing a reply).
    pub fn targets(&self) -> MutexGuard<'_, Option<Vec<Box<dyn Target>>>> {
        self.targets.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes the targets for a reply of `body` bytes (after its header), if they are free and
    /// big enough to be worth it; with the length of the head (header and meta section) that
    /// body implies when its chunks are the expected ones.
    pub(crate) fn claim(&self, body: usize) -> Option<(Vec<Box<dyn Target>>, usize)> {
        let mut slot = self.targets();
        let targets = slot.as_ref()?;
        let chunks: usize = targets.iter().map(|t| padded(t.bytes().len())).sum();
        if chunks < LAND_MIN || targets.iter().any(|t| t.bytes().is_empty()) {
            return None;
        }
        let meta = body.checked_sub(chunks).filter(|m| m % 8 == 0)?;
        Some((slot.take()?, crate::ps::proto::HEADER_LEN + meta))
    }

    /// Whether a reply's chunks (`lens`, `dtypes`) are exactly the expected ones.
    pub(crate) fn fits(&self, targets: &[Box<dyn Target>], lens: &[u64], dtypes: &[DTypeCode]) -> bool {
        lens.len() == targets.len()
            && dtypes == self.dtypes.as_slice()
            && lens.iter().zip(targets).all(|(l, t)| usize::try_from(*l).ok() == Some(t.bytes().len()))
    }

    /// Returns the targets taken by [`claim`](Landing::claim).
    pub(crate) fn give_back(&self, targets: Vec<Box<dyn Target>>) {
        *self.targets() = Some(targets);
    }
}

/// `len` rounded up to a multiple of 8 (a chunk and its padding).
pub(crate) fn padded(len: usize) -> usize {
    len.div_ceil(8) * 8
}
