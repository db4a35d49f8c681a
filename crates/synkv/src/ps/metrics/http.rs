//! The metrics endpoint: a minimal HTTP/1.1 responder on its own thread and single-threaded
//! tokio runtime, so it neither shares nor slows the roles' runtimes.
//!
//! Bounded by design: one request per connection (`Connection: close`), a request head of at
//! most [`MAX_REQUEST`] bytes read within [`READ_TIMEOUT`], at most [`MAX_CONNECTIONS`]
//! connections at once (more wait in the listen backlog). Only `GET /metrics` (any query) is
//! served; other paths get 404, other methods 405, malformed heads 400, oversized ones 431.
//! Not a general HTTP server: no keep-alive, no request bodies, no TLS.

use std::io::Write as _;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

/// Largest request head accepted, in bytes.
pub(crate) const MAX_REQUEST: usize = 8 << 10;
/// How long a client may take to send its request head.
pub(crate) const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections served at once.
pub(crate) const MAX_CONNECTIONS: usize = 8;

/// Why the metrics endpoint could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MetricsError {
    /// `SYNKV_METRICS_ADDR` is neither a port nor `host:port`.
    #[error("SYNKV_METRICS_ADDR={0:?} is not a port (9100) or host:port (127.0.0.1:9100, 127.0.0.1:0 for any free port)")]
    BadAddress(String),
    /// Binding or starting the endpoint failed.
    #[error("metrics endpoint on {addr}: {source}; with several processes on one host use SYNKV_METRICS_ADDR=127.0.0.1:0 (a free port each, listed in SYNKV_METRICS_FILE)")]
    Io {
        /// The address tried.
        addr: String,
        /// The cause.
        source: std::io::Error,
    },
}

/// Where `spec` says to listen: a bare port means loopback.
pub(crate) fn parse_addr(spec: &str) -> Result<SocketAddr, MetricsError> {
    let spec = spec.trim();
    if let Ok(port) = spec.parse::<u16>() {
        return Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port));
    }
    let bad = || MetricsError::BadAddress(spec.to_owned());
    spec.to_socket_addrs().map_err(|_| bad())?.next().ok_or_else(bad)
}

/// Binds `spec` and serves on a thread of its own; returns the bound address.
pub(crate) fn spawn(spec: &str) -> Result<SocketAddr, MetricsError> {
    let addr = parse_addr(spec)?;
    let io = |source| MetricsError::Io { addr: addr.to_string(), source };
    let std_listener = std::net::TcpListener::bind(addr).map_err(io)?;
    std_listener.set_nonblocking(true).map_err(io)?;
    let bound = std_listener.local_addr().map_err(io)?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(io)?;
    std::thread::Builder::new()
        .name("synkv-metrics".into())
        .spawn(move || {
            rt.block_on(async move {
                match TcpListener::from_std(std_listener) {
                    Ok(listener) => serve(listener).await,
                    Err(e) => tracing::warn!("metrics endpoint stopped: {e}"),
                }
            });
        })
        .map_err(io)?;
    Ok(bound)
}

/// Appends `http://addr/metrics` as a line to `file` (one short `O_APPEND` write, so the
/// processes of a host can share one file).
pub(crate) fn record(file: &str, addr: SocketAddr) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(file)?;
    f.write_all(format!("http://{addr}/metrics\n").as_bytes())
}

/// Accepts connections for ever (the thread ends with the process).
pub(crate) async fn serve(listener: TcpListener) {
    let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(permit) = permits.clone().acquire_owned().await else { return };
        match listener.accept().await {
            Ok((stream, _)) => {
                tokio::spawn(async move {
                    let _ = tokio::time::timeout(READ_TIMEOUT * 2, answer(stream)).await;
                    drop(permit);
                });
            }
            Err(e) => {
                tracing::debug!("metrics accept: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Reads one request head and writes one response.
async fn answer(mut stream: TcpStream) {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    let head = loop {
        if let Some(end) = find_end(&buf) {
            break Ok(end);
        }
        if buf.len() > MAX_REQUEST {
            break Err(Status::TooLarge);
        }
        match tokio::time::timeout(READ_TIMEOUT, stream.read(&mut chunk)).await {
            Ok(Ok(0)) | Err(_) => break Err(Status::BadRequest),
            Ok(Ok(n)) => buf.extend_from_slice(&chunk[..n]),
            Ok(Err(_)) => return,
        }
    };
    let (status, body) = match head {
        Ok(end) if end > MAX_REQUEST => (Status::TooLarge, String::new()),
        Ok(end) => respond(&buf[..end]),
        Err(s) => (s, String::new()),
    };
    let _ = stream.write_all(&response(status, &body)).await;
    let _ = stream.shutdown().await;
}

/// Where the request head ends (after its blank line), if it is all here.
fn find_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|p| p + 4)
}

/// A response status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Status {
    Ok,
    BadRequest,
    NotFound,
    MethodNotAllowed,
    TooLarge,
}

impl Status {
    fn line(self) -> &'static str {
        match self {
            Status::Ok => "200 OK",
            Status::BadRequest => "400 Bad Request",
            Status::NotFound => "404 Not Found",
            Status::MethodNotAllowed => "405 Method Not Allowed",
            Status::TooLarge => "431 Request Header Fields Too Large",
        }
    }
}

/// The status and body for a complete request head.
pub(crate) fn respond(head: &[u8]) -> (Status, String) {
    let Ok(text) = std::str::from_utf8(head) else { return (Status::BadRequest, String::new()) };
    let line = text.split("\r\n").next().unwrap_or("");
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
        return (Status::BadRequest, String::new());
    };
    if !version.starts_with("HTTP/1.") || !target.starts_with('/') {
        return (Status::BadRequest, String::new());
    }
    if method != "GET" {
        return (Status::MethodNotAllowed, String::new());
    }
    match target.split('?').next() {
        Some("/metrics") => (Status::Ok, super::render()),
        _ => (Status::NotFound, String::new()),
    }
}

/// The whole response: status line, headers, body.
fn response(status: Status, body: &str) -> Vec<u8> {
    let (kind, body) = match status {
        Status::Ok => ("text/plain; version=0.0.4; charset=utf-8", body.to_owned()),
        other => ("text/plain; charset=utf-8", format!("{}; try GET /metrics\n", other.line())),
    };
    let mut out = format!("HTTP/1.1 {}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n", status.line(), body.len());
    if status == Status::MethodNotAllowed {
        out.push_str("Allow: GET\r\n");
    }
    out.push_str("\r\n");
    out.push_str(&body);
    out.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn get_metrics_is_served_with_the_text_format() {
        let (status, body) = respond(b"GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\n\r\n");
        assert_eq!(status, Status::Ok);
        assert!(body.contains("synkv_up 1"), "{body}");
        let bytes = response(status, &body);
        let text = String::from_utf8(bytes).unwrap();
        assert!(text.starts_with("HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4"), "{text}");
    }

    #[test]
    fn other_paths_methods_and_malformed_heads_are_refused() {
        assert_eq!(respond(b"GET / HTTP/1.1\r\n\r\n").0, Status::NotFound);
        assert_eq!(respond(b"GET /metricsx HTTP/1.1\r\n\r\n").0, Status::NotFound);
        assert_eq!(respond(b"POST /metrics HTTP/1.1\r\n\r\n").0, Status::MethodNotAllowed);
        assert_eq!(respond(b"GET /metrics\r\n\r\n").0, Status::BadRequest);
        assert_eq!(respond(b"GET /metrics HTTP/1.1 extra\r\n\r\n").0, Status::BadRequest);
        assert_eq!(respond(b"GET metrics HTTP/1.1\r\n\r\n").0, Status::BadRequest);
        assert_eq!(respond(b"GET /metrics SPDY/3\r\n\r\n").0, Status::BadRequest);
        assert_eq!(respond(b"\xff\xfe /metrics HTTP/1.1\r\n\r\n").0, Status::BadRequest);
    }

    #[test]
    fn addresses_are_a_port_on_loopback_or_host_and_port() {
        assert_eq!(parse_addr("9100").unwrap(), "127.0.0.1:9100".parse().unwrap());
        assert_eq!(parse_addr("0.0.0.0:0").unwrap(), "0.0.0.0:0".parse().unwrap());
        assert!(matches!(parse_addr("nonsense"), Err(MetricsError::BadAddress(_))));
        assert!(matches!(parse_addr("99999"), Err(MetricsError::BadAddress(_))));
    }

    async fn exchange(addr: SocketAddr, request: &[u8]) -> String {
        let mut s = TcpStream::connect(addr).await.unwrap();
        let _ = s.write_all(request).await;
        let _ = s.shutdown().await;
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out).await;
        String::from_utf8_lossy(&out).into_owned()
    }

    #[tokio::test]
    async fn the_endpoint_answers_over_tcp_and_refuses_oversized_and_unfinished_requests() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve(listener));
        let ok = exchange(addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(ok.starts_with("HTTP/1.1 200 OK") && ok.contains("synkv_up 1"), "{ok}");
        let missing = exchange(addr, b"GET /nope HTTP/1.0\r\n\r\n").await;
        assert!(missing.starts_with("HTTP/1.1 404"), "{missing}");
        let mut big = b"GET /metrics HTTP/1.1\r\nX: ".to_vec();
        big.extend(std::iter::repeat_n(b'a', MAX_REQUEST + 10));
        big.extend_from_slice(b"\r\n\r\n");
        let large = exchange(addr, &big).await;
        assert!(large.starts_with("HTTP/1.1 431"), "{large}");
        // A client that closes before its blank line gets 400.
        let cut = exchange(addr, b"GET /metrics HTTP/1.1\r\n").await;
        assert!(cut.starts_with("HTTP/1.1 400"), "{cut}");
    }
}
