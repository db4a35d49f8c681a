#!/usr/bin/env python3
"""torch.distributed (gloo) all_reduce peer of `synkv bench dist`. See benches/compare/README.md.

    torch_gloo.py --workers 2 --size 1048576 --keys 1 --iters 20 --json

Launcher and worker in one file: starts --workers copies of itself (RANK, WORLD_SIZE,
MASTER_ADDR=127.0.0.1, MASTER_PORT=<free port>), each bounded by --timeout and killed on exit.
One timed iteration: dist.all_reduce (SUM) of every key's tensor, one call per key, in place,
timed with time.perf_counter per worker, warmup excluded. Rank r contributes r+1; the tensors
are refilled untimed before each round (all_reduce is in place) and checked after timing.
There are no servers and no optimizer: this is the collective-communication floor for the
same bytes, not a parameter server. Prints one JSON line per worker with "impl":"torch".
"""
import argparse, json, os, signal, statistics, subprocess, sys, time
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "crates", "synkv-python", "python", "tests"))
from ports import free_port  # noqa: E402  (below the ephemeral range, where no outgoing connection takes it)


def parse(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--size", type=int, default=1 << 20)
    p.add_argument("--keys", type=int, default=1)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--json", action="store_true")
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def worker(a):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://")
    rank, ws = dist.get_rank(), dist.get_world_size()
    ts = [torch.empty(a.size, dtype=torch.float32) for _ in range(a.keys)]
    dist.barrier()
    samples = []
    for i in range(a.warmup + a.iters):
        for t in ts:
            t.fill_(rank + 1)
        t0 = time.perf_counter()
        for t in ts:
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        if i >= a.warmup:
            samples.append((time.perf_counter() - t0) * 1e3)
    exp = ws * (ws + 1) / 2
    for k, t in enumerate(ts):
        for j in (0, a.size // 2, a.size - 1):
            if float(t[j]) != exp:
                print(f"torch_gloo.py: wrong result key {k}[{j}] = {float(t[j])} != {exp}", file=sys.stderr)
                return 1
    med = statistics.median(samples)
    rec = {"impl": "torch", "case": f"allreduce size={a.size} keys={a.keys} workers={ws} backend=gloo",
           "store": "gloo", "rank": rank, "size": a.size, "keys": a.keys, "workers": ws, "servers": 0,
           "updater": "allreduce", "dtype": "f32", "iters": a.iters, "median_ms": med,
           "min_ms": min(samples), "max_ms": max(samples),
           "gbps": a.keys * a.size * 4 * 2 / (med / 1e3) / 1e9, "torch": torch.__version__}
    line = json.dumps(rec) if a.json else f"{rec['case']} rank {rank}: median {med:.3f} ms"
    # One write per line: both workers share the pipe, and print() under PYTHONUNBUFFERED
    # writes the text and the newline separately, so two records could land on one line.
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
    dist.barrier()
    dist.destroy_process_group()
    return 0


def launch(a, argv):
    port = free_port()
    procs = []
    try:
        for r in range(a.workers):
            env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(a.workers), MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
            procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker"] + argv,
                                          env=env, start_new_session=True))
        deadline = time.monotonic() + a.timeout
        while any(p.poll() is None for p in procs):
            if any(p.poll() not in (None, 0) for p in procs) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        codes = [p.poll() for p in procs]
        if all(c == 0 for c in codes):
            return 0
        print(f"torch_gloo.py: job failed (exit codes {codes})", file=sys.stderr)
        return 1
    finally:
        for p in procs:
            if p.poll() is None:
                try: os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError: pass
            p.wait()


if __name__ == "__main__":
    argv = sys.argv[1:]
    a = parse(argv)
    sys.exit(worker(a) if a.worker else launch(a, argv))
