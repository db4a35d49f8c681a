//! Run-time choices shared by every kernel: which instruction set to use, when to split work
//! across rayon's threads, and when to write the destination with non-temporal stores.
//!
//! The choices live in process-wide atomics ([`set_tuning`] writes them, each kernel call reads
//! three of them with relaxed loads into a [`Plan`]). Nothing here changes results: every path
//! produces bit-identical output, so the knobs only trade speed.
//!
//! This module does not detect CPU features itself; `simd::best_isa` does, and caches the answer.

use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

use super::simd;

/// An instruction-set level the kernels can run at.
///
/// Levels are ordered: a CPU that runs [`Isa::Avx512`] also runs [`Isa::Avx2`]. [`Isa::Scalar`]
/// is portable Rust that the compiler may auto-vectorise for the build's baseline target; it is
/// the reference every other level is tested against, and the only level off x86-64.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum Isa {
    /// Portable code, compiled for the build's baseline target.
    Scalar,
    /// x86-64 AVX2 (with F16C), 256-bit vectors.
    Avx2,
    /// x86-64 AVX-512F, 512-bit vectors.
    Avx512,
}

impl Isa {
    /// The best level this CPU supports (detected once, then cached).
    pub fn detected() -> Isa {
        simd::best_isa()
    }

    fn to_u8(self) -> u8 {
        match self {
            Isa::Scalar => 1,
            Isa::Avx2 => 2,
            Isa::Avx512 => 3,
        }
    }

    fn from_u8(v: u8) -> Option<Isa> {
        match v {
            1 => Some(Isa::Scalar),
            2 => Some(Isa::Avx2),
            3 => Some(Isa::Avx512),
            _ => None,
        }
    }
}

/// The knobs of the kernels, read by every call.
///
/// Change them with [`set_tuning`] (e.g. once at start-up, from a `Config`). The defaults come
/// from measurements on the development host (2 cores of an AMD EPYC, 32 MiB L3, a VM):
/// - waking rayon's pool costs about 10 µs per call there, so two threads lose to one on a
///   2-source f32 sum up to 256 Ki elements and win from 512 Ki;
/// - non-temporal stores pay off once the arrays no longer fit in the last-level cache: for
///   a push + pull (sum of 2, copy to 2) they lose at 4 MiB per array and win clearly from
///   8 MiB (0.43 ms vs 0.91 ms). About a quarter of the L3 is a good setting elsewhere.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tuning {
    /// Arrays with at least this many elements are split across rayon's threads; shorter ones
    /// run on the calling thread with no rayon overhead. `usize::MAX` disables threading.
    pub parallel_min_len: usize,
    /// Destinations of at least this many bytes that are written without being read (`sum_into`,
    /// `copy`, `fill`, `cast`) use non-temporal stores, which skip the read-for-ownership and
    /// keep the destination out of the cache. `usize::MAX` disables them.
    pub stream_min_bytes: usize,
    /// The best instruction set the kernels may use; the CPU's own limit still applies.
    pub max_isa: Isa,
}

impl Tuning {
    /// The default knobs: threads from 512 Ki elements, streaming from 8 MiB, best ISA.
    pub const DEFAULT: Tuning = Tuning { parallel_min_len: 512 * 1024, stream_min_bytes: 8 << 20, max_isa: Isa::Avx512 };
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning::DEFAULT
    }
}

static PARALLEL_MIN_LEN: AtomicUsize = AtomicUsize::new(Tuning::DEFAULT.parallel_min_len);
static STREAM_MIN_BYTES: AtomicUsize = AtomicUsize::new(Tuning::DEFAULT.stream_min_bytes);
/// The requested cap (`max_isa`), as `Isa::to_u8`.
static MAX_ISA: AtomicU8 = AtomicU8::new(3);
/// The effective level, `min(MAX_ISA, detected)`; 0 until first computed.
static ISA: AtomicU8 = AtomicU8::new(0);

/// The knobs in force now.
pub fn tuning() -> Tuning {
    Tuning {
        parallel_min_len: PARALLEL_MIN_LEN.load(Ordering::Relaxed),
        stream_min_bytes: STREAM_MIN_BYTES.load(Ordering::Relaxed),
        max_isa: Isa::from_u8(MAX_ISA.load(Ordering::Relaxed)).unwrap_or(Isa::Scalar),
    }
}

/// Replaces the knobs for every later kernel call in this process.
///
/// Calls already running keep the plan they started with.
pub fn set_tuning(t: Tuning) {
    PARALLEL_MIN_LEN.store(t.parallel_min_len, Ordering::Relaxed);
    STREAM_MIN_BYTES.store(t.stream_min_bytes, Ordering::Relaxed);
    MAX_ISA.store(t.max_isa.to_u8(), Ordering::Relaxed);
    ISA.store(t.max_isa.min(Isa::detected()).to_u8(), Ordering::Relaxed);
}

/// The resolved knobs for one kernel call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Plan {
    /// The level to run at; never above what the CPU supports.
    pub(crate) isa: Isa,
    pub(crate) parallel_min_len: usize,
    pub(crate) stream_min_bytes: usize,
}

impl Plan {
    /// The plan from the process-wide knobs: three relaxed atomic loads.
    #[inline]
    pub(crate) fn current() -> Plan {
        let isa = match Isa::from_u8(ISA.load(Ordering::Relaxed)) {
            Some(isa) => isa,
            None => Self::init_isa(),
        };
        Plan { isa, parallel_min_len: PARALLEL_MIN_LEN.load(Ordering::Relaxed), stream_min_bytes: STREAM_MIN_BYTES.load(Ordering::Relaxed) }
    }

    #[cold]
    fn init_isa() -> Isa {
        let cap = Isa::from_u8(MAX_ISA.load(Ordering::Relaxed)).unwrap_or(Isa::Scalar);
        let isa = cap.min(Isa::detected());
        ISA.store(isa.to_u8(), Ordering::Relaxed);
        isa
    }

    /// A plan with the given level (capped by the CPU) and explicit thresholds (tests, and
    /// kernels whose destination calls for other thresholds than the tuning's).
    pub(crate) fn with(isa: Isa, parallel_min_len: usize, stream_min_bytes: usize) -> Plan {
        Plan { isa: isa.min(Isa::detected()), parallel_min_len, stream_min_bytes }
    }

    /// Whether a destination of `bytes` bytes, written without being read, should stream.
    #[inline]
    pub(crate) fn stream(&self, bytes: usize) -> bool {
        self.isa != Isa::Scalar && bytes >= self.stream_min_bytes
    }
}
