//! A free port for a job's scheduler, chosen outside the kernel's ephemeral range.
//!
//! A port found by binding `:0` and releasing it comes from the ephemeral range, which every
//! outgoing connection on the host also draws from: between the release and the scheduler's
//! bind, a connection (of this job's own nodes, often) can take it, and the scheduler fails
//! with "Address already in use" (seen in `synkv chaos` runs). A port below the ephemeral range
//! is only ever taken by an explicit bind, so a free one stays free.

use std::net::TcpListener;

use anyhow::{bail, Result};

/// The ephemeral port range (Linux: `/proc/sys/net/ipv4/ip_local_port_range`; elsewhere the
/// IANA range).
fn ephemeral_range() -> (u16, u16) {
    let text = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap_or_default();
    let mut it = text.split_whitespace().filter_map(|w| w.parse::<u16>().ok());
    match (it.next(), it.next()) {
        (Some(lo), Some(hi)) if lo <= hi => (lo, hi),
        _ => (49152, 65535),
    }
}

/// A port of `host` (one of this machine's addresses) that binds now, below the ephemeral
/// range where there is room (from 10000 up), else any free port.
pub(crate) fn free_port(host: &str) -> Result<u16> {
    let (lo, hi) = ephemeral_range();
    let (start, end) = if lo > 11_000 { (10_000u16, lo - 1) } else { (hi.saturating_add(1).max(1024), u16::MAX) };
    let span = u64::from(end - start) + 1;
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    let mut x = u64::from(nanos) ^ (u64::from(std::process::id()) << 20);
    let addr = |port: u16| if host.contains(':') { format!("[{host}]:{port}") } else { format!("{host}:{port}") };
    for _ in 0..64 {
        // A tiny LCG walk over the span: different processes start at different places.
        x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        let port = start + ((x >> 33) % span) as u16;
        if TcpListener::bind(addr(port)).is_ok() {
            return Ok(port);
        }
    }
    match TcpListener::bind(addr(0)).and_then(|l| l.local_addr()) {
        Ok(a) => Ok(a.port()),
        Err(e) => bail!("no free port on {host}: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_port_is_free_and_outside_the_ephemeral_range() {
        let (lo, hi) = ephemeral_range();
        let port = free_port("127.0.0.1").expect("a free port");
        assert!(port < lo || port > hi || lo <= 11_000, "{port} in {lo}..={hi}");
        TcpListener::bind(("127.0.0.1", port)).expect("it binds");
    }
}
