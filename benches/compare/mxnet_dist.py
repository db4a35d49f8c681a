#!/usr/bin/env python3
"""MXNet 1.9.1 `dist_sync` peer of `synkv bench dist`. See benches/compare/README.md.

Launcher and worker in one file (MXNet's tools/launch.py is not in the pip package):

    mxnet_dist.py --workers 2 --servers 1 --size 1048576 --keys 1 --updater assign --iters 20 --json
    mxnet_dist.py --check          # push ones from both workers (assign), pull must give 2
    mxnet_dist.py --workers 4 --servers 1 --size 67108864 --iters 3 --warmup 1 --report-rss --json

Without --worker the script is the launcher: it picks a free port on 127.0.0.1 and starts
the scheduler and the servers as `python -c "import mxnet"` with DMLC_ROLE=scheduler/server
(importing mxnet in those roles runs the ps-lite loop and returns when the job is done),
then the workers (this script with --worker). Every process is bounded by --timeout and all
of them are killed (process groups) on exit. The workers' JSON lines are passed through;
if the job fails (MXNet aborts, a timeout), one JSON line with "median_ms": null and an
"error" field is printed instead, and the exit status is 1.

--report-rss: the launcher samples every server's peak resident set (VmHWM in
/proc/<pid>/status, a high-water mark kept by the kernel) every 50 ms while the job runs, and
again whenever a worker prints its result line (the servers are still alive then: the workers
pass a final barrier after printing). Each worker JSON line gets "server_peak_rss_mb" (one
float per server, MiB, the highest VmHWM seen) and "key_mb" (one key's size, size*4/2**20).

One timed iteration, as `synkv bench dist`: kv.push(keys, vals); kv.pull(keys, out=outs);
mx.nd.waitall(); timed with time.perf_counter per worker, warmup excluded. Worker r pushes
r+1 (as synkv), so assign leaves sum = W(W+1)/2 and SGD (lr 0.1, momentum 0.9, set with
kv.set_optimizer before any push) follows the momentum recurrence with that gradient; the
pulled values are checked against that after timing, and a mismatch fails the run.
"""

import argparse
import atexit
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "crates", "synkv-python", "python", "tests"))
from ports import free_port  # noqa: E402  (below the ephemeral range, where no outgoing connection takes it)

SGD_LR = 0.1
SGD_MOMENTUM = 0.9


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--servers", type=int, default=1)
    p.add_argument("--size", type=int, default=1 << 20)
    p.add_argument("--keys", type=int, default=1)
    p.add_argument("--updater", choices=["assign", "sgd"], default="assign")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--json", action="store_true")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds; bounds every process")
    p.add_argument("--check", action="store_true",
                   help="only the correctness check: ones pushed by every worker, assign, pull gives W")
    p.add_argument("--report-rss", action="store_true",
                   help="add the servers' peak RSS (VmHWM, MiB) and key_mb to every result line")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def case_name(a):
    return (f"dist size={a.size} keys={a.keys} workers={a.workers} servers={a.servers} "
            f"updater={a.updater}")


# ----------------------------------------------------------------------------- worker

def worker(a):
    import mxnet as mx
    import numpy as np

    kv = mx.kv.create("dist_sync")
    rank, nw = kv.rank, kv.num_workers
    if a.check:
        k = 7
        kv.init(k, mx.nd.zeros((a.size,)))
        kv.push(k, mx.nd.ones((a.size,)))
        out = mx.nd.zeros((a.size,))
        kv.pull(k, out=out)
        mx.nd.waitall()
        v = out.asnumpy()
        ok = bool(np.all(v == nw))
        print(json.dumps({"impl": "mxnet", "check": "assign-ones", "rank": rank, "workers": nw,
                          "expected": nw, "got_min": float(v.min()), "got_max": float(v.max()),
                          "ok": ok}), flush=True)
        kv._barrier()
        return 0 if ok else 1

    if a.updater == "sgd":
        # On dist the optimizer goes to the servers; set it before any push.
        kv.set_optimizer(mx.optimizer.SGD(learning_rate=SGD_LR, momentum=SGD_MOMENTUM))
    keys = list(range(a.keys))
    kv.init(keys, [mx.nd.zeros((a.size,)) for _ in keys])
    vals = [mx.nd.full((a.size,), rank + 1, dtype="float32") for _ in keys]
    outs = [mx.nd.zeros((a.size,)) for _ in keys]
    mx.nd.waitall()
    kv._barrier()
    samples = []
    for i in range(a.warmup + a.iters):
        # MXNet 1.9.1 dist on CPU: push keeps the pushed array itself as the key's
        # communication buffer (comm_buf_[key] = merged, "avoid memory copy") and pull
        # receives into that same buffer, so a pull overwrites the caller's pushed array.
        # Restore the gradient before every round, untimed, or the pushes grow 3, 6, 12, ...
        for v in vals:
            v[:] = rank + 1
        mx.nd.waitall()
        t = time.perf_counter()
        kv.push(keys, vals)
        kv.pull(keys, out=outs)
        mx.nd.waitall()
        if i >= a.warmup:
            samples.append((time.perf_counter() - t) * 1e3)

    grad = nw * (nw + 1) / 2
    if a.updater == "assign":
        expected = grad
    else:
        w = m = 0.0
        for _ in range(a.warmup + a.iters):
            m = SGD_MOMENTUM * m - SGD_LR * grad
            w += m
        expected = w
    for k, o in enumerate(outs):
        v = o.asnumpy()
        for i in (0, v.size // 2, v.size - 1):
            if abs(v[i] - expected) > 1e-3 * max(abs(expected), 1.0):
                print(f"mxnet_dist.py: wrong result key {k} element {i}: {v[i]} != {expected}",
                      file=sys.stderr, flush=True)
                return 1

    med = statistics.median(samples)
    rec = {
        "impl": "mxnet", "case": case_name(a), "store": "dist_sync", "rank": rank,
        "size": a.size, "keys": a.keys, "workers": nw, "servers": kv.num_servers if hasattr(kv, "num_servers") else a.servers,
        "updater": a.updater, "dtype": "f32", "iters": a.iters,
        "median_ms": med, "min_ms": min(samples), "max_ms": max(samples),
        "gbps": a.keys * a.size * 4 * 2 / (med / 1e3) / 1e9,
    }
    rec["servers"] = a.servers  # MXNet's python KVStore has no num_servers; the launcher's value
    if a.json:
        print(json.dumps(rec), flush=True)
    else:
        print(f"{rec['case']} (rank {rank}, {a.iters} iters): median {med:.3f} ms, "
              f"min {rec['min_ms']:.3f} ms, max {rec['max_ms']:.3f} ms, {rec['gbps']:.2f} GB/s", flush=True)
    kv._barrier()
    return 0


# ----------------------------------------------------------------------------- launcher

_procs = []


def _kill_all():
    for p in _procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    for p in _procs:
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


def _vmhwm_kb(pid):
    """Peak resident set (VmHWM) of a live process in kB, or None (gone, zombie, no access)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


class RssMonitor:
    """Highest VmHWM seen per process: sampled every `period` s in a thread and on demand
    (sample()). VmHWM never decreases while the process lives, so the last value read before
    it exits is its peak; sampling often only narrows the window between the last read and the
    exit, and sample() is called at the moments that matter (a worker reporting)."""

    def __init__(self, procs, period=0.05):
        self.procs = list(procs)
        self.peak_kb = [0] * len(self.procs)
        self.period = period
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self):
        with self._lock:
            for i, p in enumerate(self.procs):
                if p.returncode is not None:
                    continue   # reaped: its pid may belong to another process by now
                kb = _vmhwm_kb(p.pid)
                if kb is not None and kb > self.peak_kb[i]:
                    self.peak_kb[i] = kb

    def _run(self):
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.period)

    def start(self):
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        self._thread.join(timeout=2)

    def peak_mb(self):
        with self._lock:
            return [round(kb / 1024, 2) for kb in self.peak_kb]


def _free_port():
    return free_port()


def launch(a, argv):
    atexit.register(_kill_all)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: sys.exit(130))
    port = _free_port()
    base = dict(os.environ)
    base.update({
        "DMLC_PS_ROOT_URI": "127.0.0.1",
        "DMLC_PS_ROOT_PORT": str(port),
        "DMLC_NUM_SERVER": str(a.servers),
        "DMLC_NUM_WORKER": str(a.workers),
        "DMLC_NODE_HOST": "127.0.0.1",   # advertise loopback, skip interface detection
        "PS_VERBOSE": base.get("PS_VERBOSE", "0"),
    })

    def start(role, cmd, capture):
        env = dict(base, DMLC_ROLE=role)
        p = subprocess.Popen(cmd, env=env, start_new_session=True,
                             stdout=subprocess.PIPE if capture else subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
        p.role = role
        _procs.append(p)
        return p

    stderr_tail = {}

    def drain_err(p, name):
        buf = []
        for line in p.stderr:
            buf.append(line)
            del buf[:-20]
        stderr_tail[name] = buf

    names = {}
    sched = start("scheduler", [sys.executable, "-c", "import mxnet"], False)
    names[sched] = "scheduler"
    servers = []
    for i in range(a.servers):
        s = start("server", [sys.executable, "-c", "import mxnet"], False)
        names[s] = f"server {i}"
        servers.append(s)
    rss = RssMonitor(servers).start() if a.report_rss else None
    workers = []
    for i in range(a.workers):
        w = start("worker", [sys.executable, os.path.abspath(__file__), "--worker"] + argv, True)
        names[w] = f"worker {i}"
        workers.append(w)
    threads = [threading.Thread(target=drain_err, args=(p, names[p]), daemon=True) for p in _procs]
    out_lines = {w: [] for w in workers}

    def drain_out(p):
        for line in p.stdout:
            if rss is not None and line.startswith("{"):
                rss.sample()   # the worker is done timing; the servers wait in its last barrier
            out_lines[p].append(line.rstrip("\n"))
    threads += [threading.Thread(target=drain_out, args=(w,), daemon=True) for w in workers]
    for t in threads:
        t.start()

    deadline = time.monotonic() + a.timeout
    error = None
    while True:
        codes = {names[p]: p.poll() for p in _procs}
        failed = [(n, c) for n, c in codes.items() if c not in (None, 0)]
        if failed:
            # give the others a moment, then stop
            error = "; ".join(f"{n} exited with {c}" + (f" (signal {-c})" if c < 0 else "") for n, c in failed)
            break
        if all(c == 0 for c in codes.values()):
            break
        if time.monotonic() > deadline:
            error = f"timeout after {a.timeout:.0f} s (still running: " + \
                ", ".join(n for n, c in codes.items() if c is None) + ")"
            break
        time.sleep(0.05)
    if rss is not None:
        rss.stop()   # before _kill_all: a killed server's VmHWM is gone, the last sample stays
    if error:
        _kill_all()
    for t in threads:
        t.join(timeout=2)

    def with_rss(rec):
        if rss is not None:
            rec["server_peak_rss_mb"] = rss.peak_mb()
            rec["key_mb"] = a.size * 4 / 2**20
        return rec

    recs = []
    for w in workers:
        for line in out_lines[w]:
            if line.startswith("{"):
                recs.append(line)
            else:
                print(f"[{names[w]}] {line}", file=sys.stderr)
    if error:
        for n, lines in stderr_tail.items():
            msg = "".join(lines).strip()
            if msg:
                print(f"--- {n} stderr (tail) ---\n{msg}", file=sys.stderr)
        last = ""
        for n, lines in stderr_tail.items():
            for l in lines:
                if "Check failed" in l or "Error" in l or "error" in l:
                    last = f"{n}: {l.strip()}"
        print(f"mxnet_dist.py: job failed: {error}", file=sys.stderr)
        if not a.check:
            print(json.dumps(with_rss({
                "impl": "mxnet", "case": case_name(a), "store": "dist_sync", "rank": None,
                "size": a.size, "keys": a.keys, "workers": a.workers, "servers": a.servers,
                "updater": a.updater, "dtype": "f32", "iters": a.iters,
                "median_ms": None, "min_ms": None, "max_ms": None, "gbps": None,
                "error": (error + (" | " + last if last else ""))[:400],
            })), flush=True)
        return 1
    for r in recs:
        if rss is not None:
            try:
                r = json.dumps(with_rss(json.loads(r)))
            except ValueError:
                pass
        print(r, flush=True)
    if rss is not None and not a.json and not a.check:
        print("server peak RSS (VmHWM): " + ", ".join(f"{m:.1f}" for m in rss.peak_mb()) +
              f" MiB  (key {a.size * 4 / 2**20:.1f} MiB)", flush=True)
    return 0


def main():
    argv = sys.argv[1:]
    a = parse_args(argv)
    if a.worker:
        return worker(a)
    if a.check:
        a.size = min(a.size, 1000)
    return launch(a, [x for x in argv if x != "--worker"])


if __name__ == "__main__":
    sys.exit(main())
