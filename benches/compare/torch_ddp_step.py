#!/usr/bin/env python3
"""Training-step time: synkv.torch DistributedOptimizer vs torch DistributedDataParallel (gloo).

Manual benchmark, driven by ``run_torch_step.sh`` (see BENCHMARKS.md, "synkv.torch vs DDP
(gloo)"). One worker process per rank; the same MLP (default 1024-1536x6-10: 7 layers, 13.4M
f32 parameters = 53.6 MB of gradients per step, in 3 buckets of <= 25 MiB that backward
completes one after another), the same batch (random data, fixed seed per rank) and the
same plain SGD on both sides, CPU, 1 torch thread per worker.

    # synkv: 2 workers, 1 server, dist_sync
    synkv launch -n 2 -s 1 -- python torch_ddp_step.py --impl synkv
    # DDP over gloo: 2 processes, started by the script itself (RANK, WORLD_SIZE, MASTER_ADDR,
    # MASTER_PORT of a free port; under torchrun, which sets them, the script runs as one rank;
    # Debian's torch 1.13 torchrun fails on Python 3.11: "'NoneType' object has no attribute 'get'")
    python torch_ddp_step.py --impl ddp --nproc 2
    # summary of the JSON lines both print
    python torch_ddp_step.py --table results.jsonl [--markdown out.md] [--json-out out.json]

Each worker runs, in order (timings per step, warmup steps excluded, medians):

1. **no-comm** and **train** steps, alternating. no-comm: a copy of the model with plain
   ``torch.optim.SGD``, nothing communicated: the compute floor, sampled under the same load
   as the step after it. train: the measured mode. synkv: ``DistributedOptimizer(SGD)``,
   gradients bucketed (25 MiB) and pushed from backward hooks; per step ``fwd``, ``bwd`` (the hooks fill buckets
   and start their push_pull), ``sync`` (``optimizer.synchronize()``: waits for the buckets,
   copies the averaged gradients into ``p.grad``), ``opt`` (the SGD update). DDP:
   ``DistributedDataParallel(bucket_cap_mb=25)``; its all-reduces run inside backward, so
   ``bwd`` includes them.
2. synkv only, **copy-out**: two steps where ``synchronize()`` is called 1 s after
   backward (every bucket has long arrived): its time is then only the copy of the averaged
   gradients into ``p.grad``. Exposed communication = ``sync`` - ``copy-out``.
3. **comm alone**: the same bucket sizes reduced with nothing else running (synkv:
   ``push_pull_async_`` of each bucket then wait; DDP: ``dist.all_reduce(async_op=True)``).

Derived figures:

* overhead = median over steps of (train step - the no-comm step just before it): what
  distribution costs per step;
* bwd +ms = median over steps of (bwd - the no-comm bwd just before it);
* synkv overlap = 1 - exposed / comm alone (the share of communication hidden behind
  backward; it does not count the CPU the communication takes from backward, which shows in
  bwd +ms); DDP's "exposed" is bwd +ms, which also counts DDP's copy of gradients into its
  buckets, so its overlap figure is a lower bound.

The table takes each job's slower worker (larger step time) for the step figures, and the mean
over its workers for bwd +ms, comm alone, exposed and overlap; then the median over jobs.
"""
import argparse
import copy
import json
import os
import socket
import statistics
import sys
import time
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "crates", "synkv-python", "python", "tests"))
from ports import free_port  # noqa: E402  (below the ephemeral range, where no outgoing connection takes it)


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--impl", choices=["synkv", "ddp"], help="the side to run (as one worker of a launched job)")
    p.add_argument("--widths", default="1024,1536,1536,1536,1536,1536,1536,10", help="MLP layer widths (default 1024,1536,1536,1536,1536,1536,1536,10)")
    p.add_argument("--batch", type=int, default=32, help="examples per worker per step (default 32)")
    p.add_argument("--steps", type=int, default=10, help="timed steps per phase (default 10)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per phase (default 2)")
    p.add_argument("--comm-iters", type=int, default=8, help="timed iterations of the comm-alone phase (default 8)")
    p.add_argument("--bucket-mb", type=float, default=25.0, help="bucket cap, both sides (default 25)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per worker (default 1)")
    p.add_argument("--nproc", type=int, default=2, help="--impl ddp without RANK set: processes to start (default 2)")
    p.add_argument("--timeout", type=float, default=600.0, help="--impl ddp launcher: seconds before the processes are killed")
    p.add_argument("--run", default="", help="a run id copied into the JSON line")
    p.add_argument("--table", metavar="JSONL", help="summarise the JSON lines of a results file and exit")
    p.add_argument("--markdown", metavar="PATH", help="with --table: also write the table as markdown")
    p.add_argument("--json-out", metavar="PATH", help="with --table: also write the summary as JSON")
    return p.parse_args(argv)


def make_model(widths):
    import torch.nn as nn

    layers = []
    for i in range(len(widths) - 1):
        layers.append(nn.Linear(widths[i], widths[i + 1]))
        if i < len(widths) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def bucket_sizes(model, cap_mb):
    """Element counts of gradient buckets: parameters in reverse order, cut at cap_mb (the
    rule of both synkv's DistributedOptimizer and DDP, less DDP's small first bucket)."""
    cap = int(cap_mb * (1 << 20))
    sizes, fill = [0], 0
    for p in reversed(list(model.parameters())):
        nbytes = p.numel() * p.element_size()
        if sizes[-1] and fill + nbytes > cap:
            sizes.append(0)
            fill = 0
        sizes[-1] += p.numel()
        fill += nbytes
    return sizes


def med(xs):
    return statistics.median(xs) * 1e3 if xs else float("nan")


class NoComm:
    """A copy of the model with plain SGD, nothing communicated: one step of it runs before
    every measured step, so the compute floor is sampled under the same machine load."""

    def __init__(self, model):
        import torch

        self.m = copy.deepcopy(model)
        self.opt = torch.optim.SGD(self.m.parameters(), lr=0.01)
        self.rec = {"fwd": [], "bwd": [], "opt": [], "total": []}

    def step(self, x, y, keep):
        import torch.nn.functional as F

        t0 = time.perf_counter()
        self.opt.zero_grad()
        loss = F.cross_entropy(self.m(x), y)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        self.opt.step()
        t3 = time.perf_counter()
        if keep:
            for k, v in (("fwd", t1 - t0), ("bwd", t2 - t1), ("opt", t3 - t2), ("total", t3 - t0)):
                self.rec[k].append(v)


def run_synkv(a, widths):
    import torch
    import torch.nn.functional as F

    import synkv.torch as skv

    kv = skv.init()
    rank, size = skv.rank(), skv.size()
    torch.manual_seed(0)
    model = make_model(widths)
    g = torch.Generator().manual_seed(100 + rank)
    x, y = torch.randn(a.batch, widths[0], generator=g), torch.randint(0, widths[-1], (a.batch,), generator=g)
    skv.broadcast_parameters(model.state_dict(), root_rank=0)

    base = NoComm(model)
    kv.barrier()

    opt = skv.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01), named_parameters=model.named_parameters(), bucket_cap_mb=a.bucket_mb)
    rec = {"fwd": [], "bwd": [], "sync": [], "opt": [], "total": []}
    for i in range(a.warmup + a.steps):
        base.step(x, y, i >= a.warmup)
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.synchronize()
        t3 = time.perf_counter()
        with opt.skip_synchronize():
            opt.step()
        t4 = time.perf_counter()
        if i >= a.warmup:
            for k, v in (("fwd", t1 - t0), ("bwd", t2 - t1), ("sync", t3 - t2), ("opt", t4 - t3), ("total", t4 - t0)):
                rec[k].append(v)

    # Copy-out: synchronize() long after every bucket has arrived.
    copyout = []
    for _ in range(2):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        time.sleep(1.0)
        t0 = time.perf_counter()
        opt.synchronize()
        copyout.append(time.perf_counter() - t0)
        with opt.skip_synchronize():
            opt.step()

    # Communication alone: the same bucket sizes, pushed and pulled with nothing else running.
    sizes = bucket_sizes(model, a.bucket_mb)
    bufs = [torch.ones(n) for n in sizes]
    comm = []
    kv.barrier()
    for i in range(2 + a.comm_iters):
        t0 = time.perf_counter()
        hs = [skv.push_pull_async_(b, average=False, name=f"bench.bucket.{j}", priority=j) for j, b in enumerate(bufs)]
        for h in hs:
            skv.synchronize(h)
        if i >= 2:
            comm.append(time.perf_counter() - t0)
    skv.shutdown()
    return rank, size, base.rec, rec, min(copyout), comm, sizes


def run_ddp(a, widths):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = make_model(widths)
    g = torch.Generator().manual_seed(100 + rank)
    x, y = torch.randn(a.batch, widths[0], generator=g), torch.randint(0, widths[-1], (a.batch,), generator=g)

    base = NoComm(model)
    ddp = DDP(model, bucket_cap_mb=a.bucket_mb)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    rec = {"fwd": [], "bwd": [], "opt": [], "total": []}
    dist.barrier()
    for i in range(a.warmup + a.steps):
        base.step(x, y, i >= a.warmup)
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = F.cross_entropy(ddp(x), y)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        t3 = time.perf_counter()
        if i >= a.warmup:
            for k, v in (("fwd", t1 - t0), ("bwd", t2 - t1), ("opt", t3 - t2), ("total", t3 - t0)):
                rec[k].append(v)

    sizes = bucket_sizes(model, a.bucket_mb)
    bufs = [torch.ones(n) for n in sizes]
    comm = []
    dist.barrier()
    for i in range(2 + a.comm_iters):
        t0 = time.perf_counter()
        ws = [dist.all_reduce(b, async_op=True) for b in bufs]
        for w in ws:
            w.wait()
        if i >= 2:
            comm.append(time.perf_counter() - t0)
    dist.barrier()
    dist.destroy_process_group()
    return rank, size, base.rec, rec, None, comm, sizes


def worker(a):
    import torch

    torch.set_num_threads(a.threads)
    widths = [int(w) for w in a.widths.split(",")]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    fn = run_synkv if a.impl == "synkv" else run_ddp
    rank, size, base, rec, copyout, comm, sizes = fn(a, widths)
    params = sum(widths[i] * widths[i + 1] + widths[i + 1] for i in range(len(widths) - 1))
    out = {
        "bench": "torch_step",
        "impl": a.impl,
        "run": a.run,
        "rank": rank,
        "workers": size,
        "params": params,
        "grad_bytes": params * 4,
        "buckets": sizes,
        "batch": a.batch,
        "steps": a.steps,
        "threads": a.threads,
        "loadavg": load,
        "torch": torch.__version__,
        "host": socket.gethostname(),
    }
    for k, v in base.items():
        out[f"nocomm_{k}_ms"] = med(v)
    for k, v in rec.items():
        out[f"{k}_ms"] = med(v)
    out["comm_alone_ms"] = med(comm)
    # Paired: how much longer backward is than the no-comm backward just before it (DDP: its
    # exposed all-reduces and bucket copies; synkv: bucket copies, launches, and the CPU the
    # communication takes from backward on a small machine).
    out["bwd_extra_ms"] = med([t - b for t, b in zip(rec["bwd"], base["bwd"])])
    if copyout is not None:
        out["copyout_ms"] = copyout * 1e3
        out["exposed_ms"] = max(0.0, out["sync_ms"] - out["copyout_ms"])
    else:
        out["exposed_ms"] = max(0.0, out["bwd_extra_ms"])
    out["overlap"] = max(0.0, 1.0 - out["exposed_ms"] / out["comm_alone_ms"])
    # Paired: each measured step minus the no-comm step run just before it.
    out["overhead_ms"] = med([t - b for t, b in zip(rec["total"], base["total"])])
    # One write per line: both workers share the launcher's pipe.
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
    return 0


FIELDS = [
    ("step ms", "total_ms"),
    ("no-comm step ms", "nocomm_total_ms"),
    ("overhead ms", "overhead_ms"),
    ("fwd ms", "fwd_ms"),
    ("bwd ms", "bwd_ms"),
    ("bwd +ms vs no-comm", "bwd_extra_ms"),
    ("sync ms", "sync_ms"),
    ("comm alone ms", "comm_alone_ms"),
    ("exposed ms", "exposed_ms"),
    ("overlap", "overlap"),
]
# Averaged over a job's workers (the others are the slower worker's): in dist_sync the worker
# that finishes backward first also waits for the other's backward, which is not communication.
MEAN_OVER_RANKS = ("bwd_extra_ms", "exposed_ms", "overlap", "comm_alone_ms")


def table(a):
    recs = []
    with open(a.table) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                r = json.loads(line)
                if r.get("bench") == "torch_step":
                    recs.append(r)
    if not recs:
        print(f"{a.table}: no torch_step results", file=sys.stderr)
        return 1
    # A job's figure is its slower worker's (the larger step time), but for MEAN_OVER_RANKS the
    # mean over its workers; then the median over jobs.
    jobs, ranks = {}, {}
    for r in recs:
        k = (r["impl"], r["run"])
        ranks.setdefault(k, []).append(r)
        if k not in jobs or r["total_ms"] > jobs[k]["total_ms"]:
            jobs[k] = r
    for k, r in jobs.items():
        jobs[k] = dict(r, **{f: statistics.mean(x[f] for x in ranks[k]) for f in MEAN_OVER_RANKS if f in r})
    summary = {}
    for impl in ("synkv", "ddp"):
        js = [r for (i, _), r in jobs.items() if i == impl]
        if not js:
            continue
        s = {"jobs": len(js)}
        for _, key in FIELDS:
            vals = [r[key] for r in js if key in r]
            if vals:
                s[key] = statistics.median(vals)
        s["per_job_total_ms"] = [round(r["total_ms"], 1) for r in sorted(js, key=lambda r: r["run"])]
        summary[impl] = s
    any_rec = recs[0]
    head = (f"MLP {any_rec['params'] / 1e6:.1f}M params ({any_rec['grad_bytes'] / 1e6:.1f} MB of gradients), batch {any_rec['batch']}/worker, "
            f"{any_rec['workers']} workers, {any_rec['threads']} thread(s) each, buckets {[round(b * 4 / 1e6, 1) for b in any_rec['buckets']]} MB")
    lines = [head, "", "| | " + " | ".join(name for name, _ in FIELDS) + " | jobs |", "|" + " --- |" * (len(FIELDS) + 2)]
    for impl, s in summary.items():
        cells = []
        for _, key in FIELDS:
            v = s.get(key)
            cells.append("–" if v is None else (f"{v * 100:.0f} %" if key == "overlap" else f"{v:.1f}"))
        label = "synkv DistributedOptimizer (1 server)" if impl == "synkv" else "DDP gloo"
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {s['jobs']} |")
    if "synkv" in summary and "ddp" in summary:
        r = summary["synkv"]["total_ms"] / summary["ddp"]["total_ms"]
        o = summary["synkv"]["overhead_ms"] / summary["ddp"]["overhead_ms"] if summary["ddp"]["overhead_ms"] > 0 else float("nan")
        lines += ["", f"step time synkv / DDP = {r:.2f}; overhead synkv / DDP = {o:.2f}"]
        summary["ratio_step"] = r
        summary["ratio_overhead"] = o
    text = "\n".join(lines)
    print(text)
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(text + "\n")
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump(summary, f, indent=1)
    return 0


def main():
    a = parse()
    if a.table:
        return table(a)
    if not a.impl:
        print("give --impl synkv|ddp (as a worker of a launched job) or --table RESULTS.jsonl", file=sys.stderr)
        return 2
    if a.impl == "ddp" and "RANK" not in os.environ:
        return spawn(a)
    # Both impls run with the same BLAS threads: DDP's ranks get OMP_NUM_THREADS from
    # spawn(); a synkv worker (started by `synkv launch`) sets it here, before torch loads its
    # BLAS, whose own pool would otherwise use every core besides torch.set_num_threads.
    os.environ["OMP_NUM_THREADS"] = str(a.threads)
    return worker(a)


def spawn(a):
    """Starts a.nproc copies of this script as the ranks of a gloo job on 127.0.0.1."""
    import subprocess

    port = free_port(2)  # MASTER_PORT, and synkv's scheduler at MASTER_PORT + 1
    procs = []
    for r in range(a.nproc):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(a.nproc), LOCAL_WORLD_SIZE=str(a.nproc),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS=str(a.threads))
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__)] + sys.argv[1:], env=env))
    deadline = time.monotonic() + a.timeout
    rc = 0
    try:
        for p in procs:
            left = max(1.0, deadline - time.monotonic())
            rc = rc or p.wait(timeout=left)
    except subprocess.TimeoutExpired:
        print(f"torch_ddp_step.py: ranks still running after {a.timeout} s; killing them", file=sys.stderr)
        rc = 124
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return rc


if __name__ == "__main__":
    sys.exit(main())
