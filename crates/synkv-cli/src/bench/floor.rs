//! `synkv bench floor`: the loopback floor of a parameter server's byte pattern, with and
//! without the frame MAC, against which the TCP layouts' figures are judged (issue 13).
//!
//! W worker processes each send `--bytes` to one middle process over TCP, which sends every
//! piece straight back as it arrives: each worker sends and receives the whole value, and the
//! middle receives and sends all of it, as a push and a pull through one separate server do.
//! There is no protocol, no sum and no wait for the other workers, so this is a lower bound of
//! what a push + pull through a server process can cost on the host.
//!
//! `--sealed` adds exactly the MAC work of a sealed synkv connection (`transport/seal.rs`):
//! every read and write call moves at most 1 MiB and the bytes it moved are fed to an
//! AEGIS-128X4 MAC, one MAC per piece and direction, finalized at the piece's end. The worker
//! MACs what it sends and what it receives, the middle what it receives (verifying) and what it
//! sends (sealing), so 4 × W × bytes go through the MAC per round, as through synkv's. Plain,
//! calls move up to a whole piece (4 MiB).
//!
//! The parent process is the middle; it starts the workers as child processes of the same
//! executable (`--connect`), which print one JSON line each. After the timed rounds every worker
//! checks that what came back is what it sent.

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use aegis::aegis128x4::Aegis128X4Mac;
use anyhow::{bail, ensure, Context, Result};
use clap::Args;
use serde::Serialize;

use super::stats::Stats;

/// Bytes of a piece: one "frame" of the pattern.
const PIECE: usize = 4 << 20;
/// The most bytes one call moves when sealed (synkv's `MAC_STEP`).
const MAC_STEP: usize = 1 << 20;

/// Arguments of `synkv bench floor`.
#[derive(Debug, Args)]
pub(crate) struct FloorArgs {
    /// Bytes each worker sends and receives per round (64 MiB: a 16M f32 value).
    #[arg(long, default_value_t = 64 << 20)]
    bytes: usize,
    /// Worker processes.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Timed rounds.
    #[arg(long, default_value_t = 20)]
    iters: usize,
    /// Untimed warm-up rounds.
    #[arg(long, default_value_t = 3)]
    warmup: usize,
    /// Connections per worker, each carrying an equal share of the value.
    #[arg(long, default_value_t = 1)]
    streams: usize,
    /// Feed every byte moved to a frame MAC, as a sealed synkv connection does.
    #[arg(long)]
    sealed: bool,
    /// Print one JSON object per worker instead of a summary.
    #[arg(long)]
    json: bool,
    /// Run as a worker connecting to this middle (started by the middle itself).
    #[arg(long, hide = true)]
    connect: Option<String>,
}

#[derive(Serialize)]
struct Record {
    #[serde(rename = "impl")]
    implementation: &'static str,
    case: String,
    sealed: bool,
    bytes: usize,
    workers: usize,
    streams: usize,
    iters: usize,
    median_ms: f64,
    min_ms: f64,
    max_ms: f64,
}

pub(crate) fn run(args: &FloorArgs) -> Result<()> {
    ensure!(
        args.bytes > 0 && args.workers > 0 && args.streams > 0 && args.iters > 0,
        "--bytes, --workers, --streams and --iters must be positive"
    );
    if let Some(addr) = &args.connect {
        return worker(args, addr);
    }
    let listener = TcpListener::bind("127.0.0.1:0").context("binding the middle's loopback port")?;
    let addr = listener.local_addr()?.to_string();
    let exe = std::env::current_exe().context("locating the synkv executable")?;
    let mut children = Vec::with_capacity(args.workers);
    for _ in 0..args.workers {
        let mut cmd = Command::new(&exe);
        cmd.args(["bench", "floor", "--connect", &addr])
            .args(["--bytes", &args.bytes.to_string(), "--workers", &args.workers.to_string()])
            .args(["--streams", &args.streams.to_string()])
            .args(["--iters", &args.iters.to_string(), "--warmup", &args.warmup.to_string()]);
        if args.sealed {
            cmd.arg("--sealed");
        }
        children.push(cmd.stdout(Stdio::piped()).spawn().context("starting a floor worker")?);
    }
    let sealed = args.sealed;
    let echoes: Vec<_> = accept_all(&listener, args.workers * args.streams, &mut children)?
        .into_iter()
        .map(|conn| std::thread::spawn(move || echo(conn, sealed)))
        .collect();
    let mut records = Vec::with_capacity(args.workers);
    for mut child in children {
        let out = child.stdout.take().context("a floor worker's output")?;
        let line = BufReader::new(out).lines().next().context("a floor worker printed nothing")??;
        ensure!(child.wait()?.success(), "a floor worker failed");
        records.push(serde_json::from_str::<serde_json::Value>(&line).context("a floor worker's line")?);
    }
    for e in echoes {
        e.join().map_err(|_| anyhow::anyhow!("the middle's echo thread panicked"))??;
    }
    for r in &records {
        if args.json {
            println!("{r}");
        } else {
            println!(
                "floor {} bytes, {} workers, {}: median {:.1} ms",
                args.bytes,
                args.workers,
                if sealed { "sealed" } else { "plain" },
                r["median_ms"].as_f64().unwrap_or(f64::NAN)
            );
        }
    }
    Ok(())
}

/// Accepts `n` connections, failing instead of waiting if a worker exits before connecting.
fn accept_all(listener: &TcpListener, n: usize, children: &mut [Child]) -> Result<Vec<TcpStream>> {
    listener.set_nonblocking(true)?;
    let mut conns = Vec::with_capacity(n);
    while conns.len() < n {
        match listener.accept() {
            Ok((conn, _)) => {
                conn.set_nonblocking(false)?;
                conns.push(conn);
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                for child in children.iter_mut() {
                    if let Some(status) = child.try_wait()? {
                        bail!("a floor worker exited ({status}) before connecting");
                    }
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => return Err(e).context("accepting a floor worker"),
        }
    }
    Ok(conns)
}

/// A running MAC of one piece's bytes (started at its first byte).
struct PieceMac {
    mac: Aegis128X4Mac<32>,
    fed: usize,
    nonce: u64,
}

impl PieceMac {
    fn new() -> PieceMac {
        PieceMac { mac: Aegis128X4Mac::new_with_nonce(&[7; 16], &[0; 16]), fed: 0, nonce: 0 }
    }

    /// Feeds `bytes`, finishing a piece's tag (and starting the next) at each piece boundary.
    fn feed(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let n = bytes.len().min(PIECE - self.fed);
            self.mac.update(&bytes[..n]);
            self.fed += n;
            bytes = &bytes[n..];
            if self.fed == PIECE {
                self.nonce += 1;
                let mut nonce = [0u8; 16];
                nonce[..8].copy_from_slice(&self.nonce.to_le_bytes());
                let done = std::mem::replace(&mut self.mac, Aegis128X4Mac::new_with_nonce(&[7; 16], &nonce));
                std::hint::black_box(done.finalize());
                self.fed = 0;
            }
        }
    }
}

/// The middle's side of one worker: every received chunk is sent straight back.
fn echo(mut conn: TcpStream, sealed: bool) -> Result<()> {
    conn.set_nodelay(true)?;
    let step = if sealed { MAC_STEP } else { PIECE };
    let mut buf = vec![0u8; step];
    let (mut incoming, mut outgoing) = (PieceMac::new(), PieceMac::new());
    loop {
        let n = conn.read(&mut buf).context("the middle reading")?;
        if n == 0 {
            return Ok(());
        }
        if sealed {
            incoming.feed(&buf[..n]);
        }
        conn.write_all(&buf[..n]).context("the middle writing")?;
        if sealed {
            outgoing.feed(&buf[..n]);
        }
    }
}

/// One connection of a worker and its share of the value.
struct Stream {
    conn: TcpStream,
    range: std::ops::Range<usize>,
    sent_mac: PieceMac,
    recv_mac: PieceMac,
}

/// A worker: per round and stream, send its share from one thread while receiving it back on
/// another.
fn worker(args: &FloorArgs, addr: &str) -> Result<()> {
    let n = args.streams;
    let mut streams = (0..n)
        .map(|k| {
            let conn = TcpStream::connect(addr).with_context(|| format!("connecting to the middle at {addr}"))?;
            conn.set_nodelay(true)?;
            Ok(Stream { conn, range: k * args.bytes / n..(k + 1) * args.bytes / n, sent_mac: PieceMac::new(), recv_mac: PieceMac::new() })
        })
        .collect::<Result<Vec<_>>>()?;
    let step = if args.sealed { MAC_STEP } else { PIECE };
    let src: Vec<u8> = (0..args.bytes).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let mut dst = vec![0u8; args.bytes];
    let mut times = Vec::with_capacity(args.iters);
    for round in 0..args.warmup + args.iters {
        let start = Instant::now();
        std::thread::scope(|s| -> Result<()> {
            let mut threads = Vec::with_capacity(2 * n);
            let mut rest = dst.as_mut_slice();
            for stream in streams.iter_mut() {
                let (mine, tail) = rest.split_at_mut(stream.range.len());
                rest = tail;
                let (sealed, src) = (args.sealed, &src[stream.range.clone()]);
                let (mut out, mut input) = (&stream.conn, &stream.conn);
                let (sent_mac, recv_mac) = (&mut stream.sent_mac, &mut stream.recv_mac);
                threads.push(s.spawn(move || -> Result<()> {
                    for chunk in src.chunks(step) {
                        out.write_all(chunk).context("a worker sending")?;
                        if sealed {
                            sent_mac.feed(chunk);
                        }
                    }
                    Ok(())
                }));
                threads.push(s.spawn(move || -> Result<()> {
                    let mut got = 0;
                    while got < mine.len() {
                        let end = (got + step).min(mine.len());
                        let n = input.read(&mut mine[got..end]).context("a worker receiving")?;
                        if n == 0 {
                            bail!("the middle closed the connection");
                        }
                        if sealed {
                            recv_mac.feed(&mine[got..got + n]);
                        }
                        got += n;
                    }
                    Ok(())
                }));
            }
            for t in threads {
                t.join().map_err(|_| anyhow::anyhow!("a worker's thread panicked"))??;
            }
            Ok(())
        })?;
        if round >= args.warmup {
            times.push(start.elapsed().as_secs_f64() * 1e3);
        }
    }
    ensure!(dst == src, "the bytes that came back differ from those sent");
    for st in &streams {
        st.conn.shutdown(Shutdown::Both).ok();
    }
    let stats = Stats::of(&times);
    let record = Record {
        implementation: "floor",
        case: format!(
            "loopback echo bytes={} workers={} streams={}{}",
            args.bytes,
            args.workers,
            args.streams,
            if args.sealed { " sealed" } else { "" }
        ),
        sealed: args.sealed,
        bytes: args.bytes,
        workers: args.workers,
        streams: args.streams,
        iters: args.iters,
        median_ms: stats.median_ms,
        min_ms: stats.min_ms,
        max_ms: stats.max_ms,
    };
    println!("{}", serde_json::to_string(&record)?);
    std::io::stdout().flush()?;
    Ok(())
}
