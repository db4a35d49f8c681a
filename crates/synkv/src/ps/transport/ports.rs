//! Free ports for a job's listeners, chosen outside the kernel's ephemeral range.
//!
//! A port found by binding `:0` and releasing it comes from the ephemeral range, which every
//! outgoing connection on the host also draws from: between the release and the listener's
//! bind, a connection (of the job's own nodes, often) can take it, and the listener fails with
//! "Address already in use" (seen in `synkv chaos` runs, and in CI when a torchrun-style job's
//! scheduler bound `MASTER_PORT + 1`). A port below the ephemeral range is only ever taken by
//! an explicit bind, so a free one stays free. `synkv launch` and `synkv chaos` choose their
//! scheduler's port here, and the tests that start processes choose theirs here too.
//!
//! Ports handed out are remembered for the life of the process, so threads asking at once
//! (tests run in parallel) never get the same one.

use std::collections::HashSet;
use std::io;
use std::net::TcpListener;
use std::sync::Mutex;

/// Ports this process has handed out.
static HANDED_OUT: Mutex<Option<HashSet<u16>>> = Mutex::new(None);

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

/// Where the first of `count` consecutive ports is looked for: below the ephemeral range
/// `(lo, hi)` when there is room (from 10000 up), else above it, else anywhere from 1024 (a
/// range that covers nearly every port); the last port `first + count - 1` stays ≤ 65535.
fn search_range((lo, hi): (u16, u16), count: u16) -> (u16, u16) {
    let last_first = u16::MAX - (count - 1);
    if lo > 11_000 && lo - 10_000 > count {
        (10_000, lo - count)
    } else if hi < last_first {
        (hi + 1, last_first)
    } else {
        (1024.min(last_first), last_first)
    }
}

/// A port of `host` (one of this machine's addresses) that binds now, below the ephemeral
/// range where there is room (from 10000 up), else any free port.
pub fn free_port(host: &str) -> io::Result<u16> {
    free_ports(host, 1)
}

/// The first of `count` consecutive ports of `host` that all bind now (for a job that derives
/// one port from another, as torchrun's `MASTER_PORT` and synkv's scheduler at
/// `MASTER_PORT + 1`), below the ephemeral range where there is room.
pub fn free_ports(host: &str, count: u16) -> io::Result<u16> {
    let count = count.max(1);
    let (start, end) = search_range(ephemeral_range(), count);
    let span = u64::from(end - start) + 1;
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    let mut x = u64::from(nanos) ^ (u64::from(std::process::id()) << 20);
    let addr = |port: u16| if host.contains(':') { format!("[{host}]:{port}") } else { format!("{host}:{port}") };
    let mut handed = HANDED_OUT.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let handed = handed.get_or_insert_with(HashSet::new);
    for _ in 0..256 {
        // A tiny LCG walk over the span: different processes start at different places.
        x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        let Ok(first) = u16::try_from(u64::from(start) + (x >> 33) % span) else { continue };
        let ports = first..=first + (count - 1);
        if ports.clone().any(|p| handed.contains(&p)) {
            continue;
        }
        // All bound together, then released together.
        let bound: Vec<_> = ports.clone().map_while(|p| TcpListener::bind(addr(p)).ok()).collect();
        if bound.len() == usize::from(count) {
            handed.extend(ports);
            return Ok(first);
        }
    }
    if count == 1 {
        let port = TcpListener::bind(addr(0))?.local_addr()?.port();
        handed.insert(port);
        return Ok(port);
    }
    Err(io::Error::new(io::ErrorKind::AddrInUse, format!("no {count} consecutive free ports on {host}")))
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

    #[test]
    fn the_search_range_never_runs_past_the_last_port() {
        assert_eq!(search_range((32768, 60999), 2), (10_000, 32766));
        assert_eq!(search_range((1024, 30000), 1), (30001, 65535));
        assert_eq!(search_range((1024, 65535), 2), (1024, 65534));
        assert_eq!(search_range((5000, 65534), 3), (1024, 65533));
    }

    #[test]
    fn consecutive_ports_all_bind_and_are_never_handed_out_twice() {
        let (lo, _) = ephemeral_range();
        let mut seen = HashSet::new();
        for _ in 0..50 {
            let first = free_ports("127.0.0.1", 2).expect("two free ports");
            assert!(lo <= 11_000 || first + 1 < lo, "{first}+1 reaches the ephemeral range from {lo}");
            for p in [first, first + 1] {
                assert!(seen.insert(p), "port {p} handed out twice");
                TcpListener::bind(("127.0.0.1", p)).expect("it binds");
            }
        }
    }
}
