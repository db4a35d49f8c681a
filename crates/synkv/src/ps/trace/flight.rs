//! The flight recorder's log form: one readable line per recorded operation, oldest first,
//! its start timed relative to the dump (`-1.532 s`), so a survivor's log shows what it was
//! doing when a peer died or a wait timed out. Operations are recorded when they end, so one
//! still waiting at the dump is not in it.

use std::fmt::Write as _;

use super::span::{Clock, Span};

/// One line describing `span`, `now` being the dump's time (nanoseconds since the epoch).
pub(crate) fn line(span: &Span, now: u64, peer_role: &str) -> String {
    let mut out = String::with_capacity(96);
    let ago = now.saturating_sub(span.start);
    let _ = write!(out, "-{}.{:03} s: {}", ago / 1_000_000_000, (ago / 1_000_000) % 1000, span.op.name());
    if let Some(label) = &span.label {
        if span.op.on_key() {
            let _ = write!(out, " key {label}");
            if span.offset > 0 {
                let _ = write!(out, " @{}", span.offset);
            }
        } else {
            let _ = write!(out, " ({label})");
        }
    }
    if let Some(peer) = span.peer {
        let _ = write!(out, " {peer_role} {peer}");
    }
    if let Some(round) = span.round {
        let _ = write!(out, ", round {round}");
    }
    if span.bytes > 0 {
        let _ = write!(out, ", {} bytes", span.bytes);
    }
    if !span.op.is_instant() {
        let _ = write!(out, ", {:.3} ms", span.dur as f64 / 1e6);
    }
    out.push_str(if span.ok { ", ok" } else { ", FAILED" });
    out
}

/// Every kept span as a line, oldest first.
pub(crate) fn lines<'a>(spans: impl Iterator<Item = &'a Span>, clock: Clock, peer_role: &str) -> Vec<String> {
    let now = clock.now();
    spans.map(|s| line(s, now, peer_role)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ps::trace::span::Op;
    use std::sync::Arc;

    #[test]
    fn a_line_names_the_op_key_peer_round_bytes_and_outcome() {
        let k: Arc<str> = Arc::from("w");
        let mut s = Span::new(Op::Push, std::time::Instant::now(), std::time::Instant::now()).key(&k, 64).peer(1).round(12).bytes(4096);
        s.start = 500_000_000;
        s.dur = 1_250_000;
        assert_eq!(line(&s, 2_032_000_000, "server"), "-1.532 s: push key w @64 server 1, round 12, 4096 bytes, 1.250 ms, ok");
        let mut dead = Span::instant(Op::NodeDead, "server rank 0 (id 8)");
        dead.start = 2_000_000_000;
        assert_eq!(line(&dead, 2_000_000_000, "server"), "-0.000 s: node dead (server rank 0 (id 8)), ok");
        let failed = s.clone().ok(false);
        assert!(line(&failed, 2_032_000_000, "server").ends_with("1.250 ms, FAILED"));
    }
}
