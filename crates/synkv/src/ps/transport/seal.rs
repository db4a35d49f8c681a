//! [`Seal`]: the integrity of every frame after a connection's handshake.
//!
//! Each frame is followed by a [`TRAILER_LEN`]-byte trailer: the frame's 256-bit AEGIS-128X4
//! MAC tag (RFC 10032), encrypted and authenticated by the connection's Noise transport state
//! (ChaCha20-Poly1305 under that direction's session key). The MAC is keyed per direction with
//! a key derived from the Noise split (so only the two ends of this connection hold it) and
//! takes the frame's number in that direction as its nonce, which is also the Noise nonce that
//! seals the trailer. A changed bit, or a frame inserted, dropped, replayed or reordered, makes
//! the trailer fail to open: the reader returns
//! [`AuthError::Integrity`](crate::ps::AuthError::Integrity) and the connection is closed.
//! AEGIS carries the bulk because, on AES hardware, it authenticates several times faster than
//! BLAKE3 hashes or either Noise AEAD authenticates; AEGIS-128X4 (four AEGIS-128L states side by
//! side) runs on 512-bit vector AES where the CPU has it (~99 GB/s per core in cache here, 2.4×
//! AEGIS-128X2), on two 256-bit lanes with VAES+AVX2 and interleaves the states on AES-NI
//! alone, with the 128-bit forgery security every AEGIS variant targets (BENCHMARKS.md,
//! 2026-12-07).
//!
//! The MAC is taken as the bytes move: the writer feeds it what each write call handed to the
//! kernel, the reader what each read received, while those bytes are still in cache.

use std::sync::{Mutex, MutexGuard, PoisonError};

use aegis::aegis128x4::Aegis128X4Mac;

/// Bytes after every sealed frame: a 32-byte MAC tag and a 16-byte Noise tag.
pub const TRAILER_LEN: usize = 32 + 16;
/// The most bytes one read or write call moves on a sealed connection, so the bytes just moved
/// are still in the core's caches when the MAC reads them. 1 MiB: on one host over TCP a sealed
/// 16M step took 1.03–1.10× the plain one, against 1.12–1.25× with 256 KiB steps (more system
/// calls; BENCHMARKS.md, 2026-12-07 morning).
pub(crate) const MAC_STEP: usize = 1 << 20;

/// Derivation context of the frame MAC keys (BLAKE3 `derive_key`, from a Noise split key).
const MAC_CONTEXT: &str = "synkv 2026-12-07 frame MAC key (AEGIS-128X4) from a Noise split key";

/// One connection's session keys and frame counters (both directions).
pub struct Seal {
    state: Mutex<snow::TransportState>,
    /// MAC key of the frames this end sends.
    send_key: MacKey,
    /// MAC key of the frames this end receives.
    recv_key: MacKey,
}

impl std::fmt::Debug for Seal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Seal(<session keys>)")
    }
}

impl Drop for Seal {
    fn drop(&mut self) {
        // Best effort (the optimizer may keep copies); the Noise state wipes its own keys.
        self.send_key.fill(0);
        self.recv_key.fill(0);
    }
}

impl Seal {
    /// The seal of a finished handshake: its transport state, and MAC keys derived from the
    /// split (the initiator sends under the first key, as in Noise).
    pub fn from_handshake(mut noise: snow::HandshakeState) -> Result<Seal, snow::Error> {
        let (first, second) = noise.dangerously_get_raw_split();
        let (send, recv) = if noise.is_initiator() { (first, second) } else { (second, first) };
        let state = noise.into_transport_mode()?;
        Ok(Seal { state: Mutex::new(state), send_key: mac_key(&send), recv_key: mac_key(&recv) })
    }

    fn state(&self) -> MutexGuard<'_, snow::TransportState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The MAC of the next frame this end sends (started at its first byte).
    pub(crate) fn outgoing(&self) -> FrameMac {
        FrameMac::new(&self.send_key, self.state().sending_nonce())
    }

    /// The MAC of the next frame this end receives (started at its first byte).
    pub(crate) fn incoming(&self) -> FrameMac {
        FrameMac::new(&self.recv_key, self.state().receiving_nonce())
    }

    /// The trailer of the next outgoing frame, whose bytes were fed to `mac`.
    pub(crate) fn seal(&self, mac: FrameMac) -> std::io::Result<[u8; TRAILER_LEN]> {
        let mut state = self.state();
        if mac.nonce != state.sending_nonce() {
            return Err(std::io::Error::other("sealing a frame: its MAC was started for another frame"));
        }
        let tag = mac.mac.finalize();
        let mut out = [0u8; TRAILER_LEN];
        let n = state.write_message(&tag, &mut out).map_err(|e| std::io::Error::other(format!("sealing a frame: {e}")))?;
        debug_assert_eq!(n, TRAILER_LEN);
        Ok(out)
    }

    /// Whether `trailer` seals the next incoming frame, whose bytes were fed to `mac`.
    pub(crate) fn open(&self, trailer: &[u8], mac: FrameMac) -> bool {
        let mut state = self.state();
        if mac.nonce != state.receiving_nonce() {
            return false;
        }
        let mut sealed = [0u8; TRAILER_LEN];
        match state.read_message(trailer, &mut sealed) {
            // `verify` compares in constant time.
            Ok(32) => {
                let mut tag = [0u8; 32];
                tag.copy_from_slice(&sealed[..32]);
                mac.mac.verify(&tag).is_ok()
            }
            _ => false,
        }
    }
}

type MacKey = [u8; 16];

/// The MAC key derived from a Noise split key.
fn mac_key(split: &[u8; 32]) -> MacKey {
    let mut key = [0u8; 16];
    key.copy_from_slice(&blake3::derive_key(MAC_CONTEXT, split)[..16]);
    key
}

/// The running MAC of one frame's bytes, fed as they move.
pub(crate) struct FrameMac {
    mac: Aegis128X4Mac<32>,
    /// The frame's number in its direction (the MAC's and the trailer's nonce).
    nonce: u64,
    /// Bytes of the frame fed so far.
    pub(crate) fed: usize,
}

impl FrameMac {
    fn new(key: &MacKey, nonce: u64) -> FrameMac {
        let mut n = [0u8; 16];
        n[..8].copy_from_slice(&nonce.to_le_bytes());
        FrameMac { mac: Aegis128X4Mac::new_with_nonce(key, &n), nonce, fed: 0 }
    }

    pub(crate) fn update(&mut self, bytes: &[u8]) {
        self.mac.update(bytes);
        self.fed += bytes.len();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOISE: &str = "Noise_NNpsk0_25519_ChaChaPoly_BLAKE2s";

    /// Both ends' seals after a real handshake under `psk`.
    fn pair(psk: &[u8; 32]) -> (Seal, Seal) {
        let build = |initiator: bool| {
            let b = snow::Builder::new(NOISE.parse().unwrap()).psk(0, psk).unwrap();
            if initiator {
                b.build_initiator().unwrap()
            } else {
                b.build_responder().unwrap()
            }
        };
        let (mut i, mut r) = (build(true), build(false));
        let (mut m, mut p) = ([0u8; 256], [0u8; 256]);
        let n = i.write_message(&[], &mut m).unwrap();
        r.read_message(&m[..n], &mut p).unwrap();
        let n = r.write_message(&[], &mut m).unwrap();
        i.read_message(&m[..n], &mut p).unwrap();
        (Seal::from_handshake(i).unwrap(), Seal::from_handshake(r).unwrap())
    }

    fn sealed(seal: &Seal, frame: &[u8]) -> [u8; TRAILER_LEN] {
        let mut mac = seal.outgoing();
        // Fed in uneven steps, as write calls do.
        frame.chunks(1000).for_each(|c| mac.update(c));
        seal.seal(mac).unwrap()
    }

    fn opens(seal: &Seal, frame: &[u8], trailer: &[u8]) -> bool {
        let mut mac = seal.incoming();
        frame.chunks(777).for_each(|c| mac.update(c));
        seal.open(trailer, mac)
    }

    #[test]
    fn frames_open_in_order_both_ways() {
        let (a, b) = pair(&[7; 32]);
        let frames: Vec<Vec<u8>> = (0..5).map(|i| (0..10_000 + i).map(|j| (j * 31 + i) as u8).collect()).collect();
        for f in &frames {
            assert!(opens(&b, f, &sealed(&a, f)));
            assert!(opens(&a, f, &sealed(&b, f)));
        }
    }

    #[test]
    fn a_changed_bit_a_dropped_or_replayed_frame_or_another_sessions_trailer_fails() {
        let f: Vec<u8> = (0..4096).map(|j| j as u8).collect();
        let mut g = f.clone();
        g[2000] ^= 1;
        let (a, b) = pair(&[7; 32]);
        assert!(!opens(&b, &g, &sealed(&a, &f)), "a changed bit");

        let (a, b) = pair(&[7; 32]);
        let (_t0, t1) = (sealed(&a, &f), sealed(&a, &g));
        assert!(!opens(&b, &g, &t1), "frame 1 where frame 0 was due (frame 0 dropped)");

        let (a, b) = pair(&[7; 32]);
        let t0 = sealed(&a, &f);
        assert!(opens(&b, &f, &t0));
        assert!(!opens(&b, &f, &t0), "frame 0 replayed");

        // Same secret, another connection: fresh keys, so its trailers do not open here.
        let ((a, _), (_, b)) = (pair(&[7; 32]), pair(&[7; 32]));
        assert!(!opens(&b, &f, &sealed(&a, &f)), "another session's trailer");
    }

    #[test]
    fn a_mac_started_for_another_frame_is_refused() {
        let (a, b) = pair(&[7; 32]);
        let early = a.outgoing();
        let t0 = sealed(&a, b"first");
        assert!(a.seal(early).is_err(), "the writer refuses a MAC of another frame's number");
        let mut stale = b.incoming();
        assert!(opens(&b, b"first", &t0));
        let t1 = sealed(&a, b"second");
        stale.update(b"second");
        assert!(!b.open(&t1, stale), "a reader's MAC started for an earlier frame does not open");
        assert!(opens(&b, b"second", &t1), "the right one still does");
    }
}
