"""Loopback floor of the parameter-server byte pattern (issue 13, the TCP goal).

W client processes each send M bytes to one process, which sends every piece straight back
(4 MiB pieces, no protocol, no sum): each client sends and receives the whole value, and the
middle process receives and sends all of it, as a push + pull through one server does.
Prints each client's median milliseconds per round.

usage: python3 benches/compare/tcp_floor.py BYTES WORKERS ROUNDS   (e.g. 67108864 2 12)
"""
import socket, threading, time, sys, os, statistics
M = int(sys.argv[1]); W = int(sys.argv[2]); ITERS = int(sys.argv[3]); CH = 4 << 20
def server(lsock):
    conns = [lsock.accept()[0] for _ in range(W)]
    def serve(c):
        buf = bytearray(CH); mv = memoryview(buf)
        while True:
            n = c.recv_into(mv)
            if n == 0: return
            c.sendall(mv[:n])
    ts = [threading.Thread(target=serve, args=(c,)) for c in conns]
    [t.start() for t in ts]; [t.join() for t in ts]
def worker(port, res):
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    src = bytearray(M); dst = bytearray(M); mv = memoryview(dst)
    times = []
    for it in range(ITERS):
        t0 = time.perf_counter()
        def send():
            for o in range(0, M, CH): s.sendall(memoryview(src)[o:o+CH])
        th = threading.Thread(target=send); th.start()
        got = 0
        while got < M: got += s.recv_into(mv[got:])
        th.join()
        times.append((time.perf_counter() - t0) * 1e3)
    res.append(statistics.median(times[2:]))
    s.close()
l = socket.socket(); l.bind(("127.0.0.1", 0)); l.listen(); port = l.getsockname()[1]
if os.fork() == 0:
    server(l); os._exit(0)
pids = []
r, w = os.pipe()
for i in range(W):
    pid = os.fork()
    if pid == 0:
        res = []; worker(port, res); os.write(w, f"{res[0]:.1f}\n".encode()); os._exit(0)
    pids.append(pid)
for p in pids: os.waitpid(p, 0)
os.close(w); print("echo floor per worker median ms:", os.read(r, 100).decode().split())
