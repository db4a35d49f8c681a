#!/usr/bin/env python3
"""Loopback TCP bandwidth on 127.0.0.1: one sender process, one receiver (this process).

    loopback_bw.py [--bytes 1073741824] [--chunk 4194304] [--runs 3] [--json]

The sender writes --bytes in --chunk sendall()s; the receiver recv_into()s a preallocated
buffer. The time is from the first byte received to the last. Reports the best and median of
--runs as GB/s (1e9 B/s). Standard library only; independent of synkv.
"""
import argparse, json, multiprocessing as mp, socket, statistics, time


def sender(port, total, chunk):
    buf = bytearray(chunk)
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        left = total
        while left > 0:
            n = min(chunk, left)
            s.sendall(memoryview(buf)[:n])
            left -= n


def one(total, chunk):
    ls = socket.socket(); ls.bind(("127.0.0.1", 0)); ls.listen(1)
    port = ls.getsockname()[1]
    p = mp.get_context("fork").Process(target=sender, args=(port, total, chunk)); p.start()
    c, _ = ls.accept()
    buf = bytearray(chunk); mv = memoryview(buf)
    got = c.recv_into(mv); t0 = time.perf_counter()
    first = got
    while got < total:
        n = c.recv_into(mv)
        if n == 0:
            raise RuntimeError("sender closed early")
        got += n
    dt = time.perf_counter() - t0
    c.close(); ls.close(); p.join(30)
    return (total - first) / dt / 1e9


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--bytes", type=int, default=1 << 30)
    ap.add_argument("--chunk", type=int, default=4 << 20)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    xs = [one(a.bytes, a.chunk) for _ in range(a.runs)]
    rec = {"impl": "loopback", "case": f"tcp 127.0.0.1 bytes={a.bytes} chunk={a.chunk}",
           "bytes": a.bytes, "chunk": a.chunk, "runs": a.runs,
           "gbps": statistics.median(xs), "gbps_best": max(xs), "gbps_all": xs}
    print(json.dumps(rec) if a.json else f"loopback TCP: median {rec['gbps']:.2f} GB/s, best {max(xs):.2f} GB/s")
