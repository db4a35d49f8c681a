#!/usr/bin/env python3
"""Loopback TCP bandwidth on 127.0.0.1: one sender process, one receiver (this process).

    loopback_bw.py [--bytes 1073741824] [--chunk 4194304] [--runs 3] [--streams 1] [--json]

The sender writes --bytes in --chunk sendall()s; the receiver recv_into()s a preallocated
buffer. The time is from the first byte received to the last. Reports the best and median of
--runs as GB/s (1e9 B/s). With --streams N the bytes are split over N connections, each sent
and received by its own thread (the socket calls release the GIL, so the kernel's copies of
the streams run in parallel): whether one stream is the bottleneck between two processes
(issue 13, "several streams per peer"). Standard library only; independent of synkv.
"""
import argparse, json, multiprocessing as mp, socket, statistics, threading, time


def send_one(port, total, chunk):
    buf = bytearray(chunk)
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        left = total
        while left > 0:
            n = min(chunk, left)
            s.sendall(memoryview(buf)[:n])
            left -= n


def sender(port, total, chunk, streams):
    ts = [threading.Thread(target=send_one, args=(port, total // streams, chunk)) for _ in range(streams)]
    [t.start() for t in ts]; [t.join() for t in ts]


def one(total, chunk, streams=1):
    ls = socket.socket(); ls.bind(("127.0.0.1", 0)); ls.listen(streams)
    port = ls.getsockname()[1]
    p = mp.get_context("fork").Process(target=sender, args=(port, total, chunk, streams)); p.start()
    conns = [ls.accept()[0] for _ in range(streams)]
    first, last, got = [], [], [0] * streams

    def receive(i, c):
        buf = bytearray(chunk); mv = memoryview(buf)
        n = c.recv_into(mv); first.append((time.perf_counter(), n))
        got[i] = n
        while got[i] < total // streams:
            n = c.recv_into(mv)
            if n == 0:
                raise RuntimeError("sender closed early")
            got[i] += n
        last.append(time.perf_counter())

    ts = [threading.Thread(target=receive, args=(i, c)) for i, c in enumerate(conns)]
    [t.start() for t in ts]; [t.join() for t in ts]
    t0 = min(t for t, _ in first)
    dt = max(last) - t0
    [c.close() for c in conns]; ls.close(); p.join(30)
    return (sum(got) - sum(n for _, n in first)) / dt / 1e9


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--bytes", type=int, default=1 << 30)
    ap.add_argument("--chunk", type=int, default=4 << 20)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--streams", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.streams < 1:
        ap.error("--streams must be at least 1")
    xs = [one(a.bytes, a.chunk, a.streams) for _ in range(a.runs)]
    rec = {"impl": "loopback", "case": f"tcp 127.0.0.1 bytes={a.bytes} chunk={a.chunk} streams={a.streams}",
           "bytes": a.bytes, "chunk": a.chunk, "streams": a.streams, "runs": a.runs,
           "gbps": statistics.median(xs), "gbps_best": max(xs), "gbps_all": xs}
    print(json.dumps(rec) if a.json else f"loopback TCP: median {rec['gbps']:.2f} GB/s, best {max(xs):.2f} GB/s")
