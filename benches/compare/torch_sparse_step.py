#!/usr/bin/env python3
"""Sparse-embedding training step: synkv.torch SparseEmbedding (dist_async, table on the
servers) vs DistributedDataParallel (gloo) with the same table as a dense ``nn.Embedding``.

Manual benchmark, driven by ``run_torch_sparse.sh`` (see BENCHMARKS.md, "synkv.torch vs DDP
(gloo)"). The model: ``--fields`` ids per example (uniformly random over ``--rows`` rows,
default 10M) looked up in a table of ``--dim`` (default 16) f32 columns (10M x 16 = 640 MB),
concatenated, then an MLP (fields*dim -> 64 -> 1) and a logistic loss on random labels; plain
SGD (lr 0.01) on both sides, CPU, 1 torch thread per worker.

    # synkv: table sharded on 1 server, server-side SGD (lazy: touched rows only), dist_async
    synkv launch -n 2 -s 1 -- python torch_sparse_step.py --impl synkv
    # DDP, dense nn.Embedding: the whole table's gradient is all-reduced every step
    python torch_sparse_step.py --impl ddp --nproc 2
    # DDP, nn.Embedding(sparse=True): gloo's sparse all-reduce (an allgather of the rows)
    python torch_sparse_step.py --impl ddp_sparse --nproc 2
    # summary
    python torch_sparse_step.py --table results.jsonl [--markdown out.md] [--json-out out.json]

Per step (warmup excluded, medians; a job's figure is its slower worker's): ``total`` =
zero_grad + forward + backward + optimizer step. Bytes per step and worker, values only (row
ids add 8 B per row and direction):

* synkv: (rows pulled + rows pushed) x dim x 4, the rows being the batch's unique ids, plus
  the MLP's gradient pushed and weights pulled;
* DDP dense: the all-reduced gradient, (table + MLP) x 4 (a ring all-reduce sends and
  receives about that much per worker with 2 workers);
* DDP sparse: this worker's uncoalesced embedding gradient (batch x fields rows) sent, every
  other worker's received, plus the MLP all-reduce.

Also reported: each worker's peak RSS (the synkv workers hold no table: it lives on the
server, which holds the 640 MB), and ``setup`` (building the table: synkv initialises it shard
by shard on the server; DDP allocates it and broadcasts it from rank 0).
"""
import argparse
import json
import os
import resource
import statistics
import sys
import time
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "crates", "synkv-python", "python", "tests"))
from ports import free_port  # noqa: E402  (below the ephemeral range, where no outgoing connection takes it)


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--impl", choices=["synkv", "ddp", "ddp_sparse"], help="the side to run")
    p.add_argument("--store", default="dist_async", help="--impl synkv: store type (default dist_async)")
    p.add_argument("--rows", type=int, default=10_000_000, help="table rows (default 10000000)")
    p.add_argument("--dim", type=int, default=16, help="table columns (default 16)")
    p.add_argument("--fields", type=int, default=4, help="ids per example (default 4)")
    p.add_argument("--batch", type=int, default=256, help="examples per worker per step (default 256)")
    p.add_argument("--steps", type=int, default=5, help="timed steps (default 5)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps (default 2)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per worker (default 1)")
    p.add_argument("--nproc", type=int, default=2, help="--impl ddp*, without RANK set: processes to start (default 2)")
    p.add_argument("--timeout", type=float, default=600.0, help="--impl ddp* launcher: seconds before the ranks are killed")
    p.add_argument("--run", default="", help="a run id copied into the JSON line")
    p.add_argument("--table", metavar="JSONL", help="summarise the JSON lines of a results file and exit")
    p.add_argument("--markdown", metavar="PATH", help="with --table: also write the table as markdown")
    p.add_argument("--json-out", metavar="PATH", help="with --table: also write the summary as JSON")
    return p.parse_args(argv)


def mlp(a):
    import torch.nn as nn

    return nn.Sequential(nn.Linear(a.fields * a.dim, 64), nn.ReLU(), nn.Linear(64, 1))


def batches(a, rank):
    import torch

    g = torch.Generator().manual_seed(1000 + rank)
    while True:
        ids = torch.randint(0, a.rows, (a.batch, a.fields), generator=g)
        y = torch.randint(0, 2, (a.batch,), generator=g).float()
        yield ids, y


def timed_steps(a, rank, model, opt, zero_grad):
    import torch.nn.functional as F

    rec = {"fwd": [], "bwd": [], "opt": [], "total": [], "uniq": []}
    data = batches(a, rank)
    for i in range(a.warmup + a.steps):
        ids, y = next(data)
        t0 = time.perf_counter()
        zero_grad()
        loss = F.binary_cross_entropy_with_logits(model(ids), y)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        t3 = time.perf_counter()
        if i >= a.warmup:
            for k, v in (("fwd", t1 - t0), ("bwd", t2 - t1), ("opt", t3 - t2), ("total", t3 - t0)):
                rec[k].append(v)
            rec["uniq"].append(int(ids.unique().numel()))
    return rec


def run_synkv(a):
    import torch
    import torch.nn as nn

    import synkv
    import synkv.torch as skv

    skv.init(a.store)
    rank, size = skv.rank(), skv.size()
    torch.manual_seed(0)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = skv.SparseEmbedding(a.rows, a.dim, name="bench_table")
            self.mlp = mlp(a)

        def forward(self, ids):
            return self.mlp(self.emb(ids).flatten(1)).squeeze(1)

    t0 = time.perf_counter()
    model = Model()
    setup = time.perf_counter() - t0
    opt = skv.DistributedOptimizer(synkv.optimizer.SGD(learning_rate=0.01), named_parameters=model.named_parameters())
    skv.store().barrier()
    rec = timed_steps(a, rank, model, opt, opt.zero_grad)
    skv.store().barrier()
    skv.shutdown()
    dense = sum(p.numel() for p in model.mlp.parameters())
    u = statistics.median(rec["uniq"])
    bytes_step = 2 * u * a.dim * 4 + 2 * dense * 4
    return rank, size, rec, setup, bytes_step, {"rows_pulled": u, "rows_pushed": u, "ids_bytes": 2 * u * 8}


def run_ddp(a):
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    sparse = a.impl == "ddp_sparse"
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(a.rows, a.dim, sparse=sparse)
            nn.init.normal_(self.emb.weight, 0.0, 0.01)
            self.mlp = mlp(a)

        def forward(self, ids):
            return self.mlp(self.emb(ids).flatten(1)).squeeze(1)

    t0 = time.perf_counter()
    model = Model()
    # gradient_as_bucket_view: the buckets are the gradients (no second 640 MB copy).
    ddp = DDP(model, bucket_cap_mb=25, gradient_as_bucket_view=not sparse)
    setup = time.perf_counter() - t0
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    dist.barrier()
    rec = timed_steps(a, rank, ddp, opt, opt.zero_grad)
    dist.barrier()
    dist.destroy_process_group()
    dense = sum(p.numel() for p in model.mlp.parameters())
    if sparse:
        rows = a.batch * a.fields
        bytes_step = rows * a.dim * 4 * size + dense * 4  # own rows sent + others' received, MLP all-reduced
        extra = {"rows_sent": rows, "rows_received": rows * (size - 1)}
    else:
        bytes_step = (a.rows * a.dim + dense) * 4
        extra = {}
    return rank, size, rec, setup, bytes_step, extra


def worker(a):
    import torch

    torch.set_num_threads(a.threads)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    fn = run_synkv if a.impl == "synkv" else run_ddp
    rank, size, rec, setup, bytes_step, extra = fn(a)
    ms = lambda xs: statistics.median(xs) * 1e3
    out = {
        "bench": "torch_sparse",
        "impl": a.impl if a.impl != "synkv" else f"synkv_{a.store}",
        "run": a.run,
        "rank": rank,
        "workers": size,
        "rows": a.rows,
        "dim": a.dim,
        "table_bytes": a.rows * a.dim * 4,
        "fields": a.fields,
        "batch": a.batch,
        "steps": a.steps,
        "threads": a.threads,
        "loadavg": load,
        "setup_s": setup,
        "fwd_ms": ms(rec["fwd"]),
        "bwd_ms": ms(rec["bwd"]),
        "opt_ms": ms(rec["opt"]),
        "total_ms": ms(rec["total"]),
        "unique_ids": statistics.median(rec["uniq"]),
        "worker_peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "bytes_per_step": bytes_step,
        "torch": torch.__version__,
    }
    out.update(extra)
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
    return 0


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
            rc = rc or p.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        print(f"torch_sparse_step.py: ranks still running after {a.timeout} s; killing them", file=sys.stderr)
        rc = 124
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return rc


MEDIANS = ("total_ms", "fwd_ms", "bwd_ms", "opt_ms", "bytes_per_step", "setup_s", "unique_ids")
LABELS = {
    "synkv_dist_async": "synkv SparseEmbedding, dist_async, 1 server",
    "synkv_dist_sync": "synkv SparseEmbedding, dist_sync, 1 server",
    "ddp": "DDP gloo, dense nn.Embedding",
    "ddp_sparse": "DDP gloo, nn.Embedding(sparse=True)",
}


def table(a):
    recs = []
    with open(a.table) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                r = json.loads(line)
                if r.get("bench") == "torch_sparse":
                    recs.append(r)
    if not recs:
        print(f"{a.table}: no torch_sparse results", file=sys.stderr)
        return 1
    jobs = {}
    for r in recs:
        k = (r["impl"], r["run"])
        if k not in jobs or r["total_ms"] > jobs[k]["total_ms"]:
            jobs[k] = r
    summary = {}
    for impl in LABELS:
        js = [r for (i, _), r in jobs.items() if i == impl]
        if js:
            summary[impl] = {
                "jobs": len(js),
                **{k: statistics.median(r[k] for r in js) for k in MEDIANS},
                "worker_peak_rss_mb": max(r.get("worker_peak_rss_mb", 0) for r in recs if r["impl"] == impl),
                "per_job_total_ms": [round(r["total_ms"], 1) for r in sorted(js, key=lambda r: r["run"])],
            }
    r0 = recs[0]
    head = (f"table {r0['rows']:,} x {r0['dim']} f32 = {r0['table_bytes'] / 1e6:.0f} MB, batch {r0['batch']} x {r0['fields']} ids per worker "
            f"(~{r0['unique_ids']:.0f} unique rows), {r0['workers']} workers, {r0['threads']} thread(s) each")
    cols = ["step ms", "fwd ms", "bwd ms", "opt ms", "MB per step per worker", "worker peak RSS MB", "setup s", "jobs"]
    lines = [head, "", "| | " + " | ".join(cols) + " |", "|" + " --- |" * (len(cols) + 1)]
    for impl, s in summary.items():
        lines.append(f"| {LABELS[impl]} | {s['total_ms']:.1f} | {s['fwd_ms']:.1f} | {s['bwd_ms']:.1f} | {s['opt_ms']:.1f} | "
                     f"{s['bytes_per_step'] / 1e6:.3f} | {s['worker_peak_rss_mb']:.0f} | {s['setup_s']:.1f} | {s['jobs']} |")
    base = summary.get("synkv_dist_async") or summary.get("synkv_dist_sync")
    if base:
        lines.append("")
        for impl in ("ddp", "ddp_sparse"):
            if impl in summary:
                s = summary[impl]
                t, b = s["total_ms"] / base["total_ms"], s["bytes_per_step"] / base["bytes_per_step"]
                lines.append(f"{LABELS[impl]}: step time {t:.1f}x synkv's, bytes {b:.0f}x")
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
        print("give --impl synkv|ddp|ddp_sparse, or --table RESULTS.jsonl", file=sys.stderr)
        return 2
    if a.impl != "synkv" and "RANK" not in os.environ:
        return spawn(a)
    # Every impl runs with the same BLAS threads: DDP's ranks get OMP_NUM_THREADS from
    # spawn(); a synkv worker (started by `synkv launch`) sets it here, before torch loads.
    os.environ["OMP_NUM_THREADS"] = str(a.threads)
    return worker(a)


if __name__ == "__main__":
    sys.exit(main())
