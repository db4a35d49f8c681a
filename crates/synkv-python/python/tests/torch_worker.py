"""A synkv.torch worker for test_torch.py, run under `synkv launch`: each mode checks its
results against a reference computed in this process and exits non-zero on a mismatch.

Modes: collectives, worker_optimizer, server_optimizer, sparse, ddp, async."""

import copy
import sys

import torch
import torch.nn.functional as F

import synkv
import synkv.torch as skv

MODE = sys.argv[1]
skv.init("dist_async" if MODE == "async" else None)
R, N = skv.rank(), skv.size()
torch.manual_seed(0)


def check(ok, what):
    if not ok:
        print(f"rank {R}: FAILED {what}", flush=True)
        sys.exit(1)


def data(rank, step, n=8):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(n, 6, generator=g), torch.randint(0, 3, (n,), generator=g)


def net():
    torch.manual_seed(R + 7)  # different on every rank: broadcast/init must make them equal
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def reference_steps(model, steps, lr, passes=1, momentum=0.0):
    """Single-process training on every rank's batches (the mean of per-rank means)."""
    ref = copy.deepcopy(model)
    opt = torch.optim.SGD(ref.parameters(), lr=lr, momentum=momentum)
    for s in range(steps):
        opt.zero_grad()
        for p in range(passes):
            for r in range(N):
                x, y = data(r, s * passes + p)
                (F.cross_entropy(ref(x), y) / N).backward()
        opt.step()
    return ref


def close(a, b, tol):
    return all(torch.allclose(p, q, atol=tol, rtol=tol) for p, q in zip(a.parameters(), b.parameters()))


if MODE == "collectives":
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        t = torch.full((5, 3), float(R + 1), dtype=dtype)
        total = N * (N + 1) / 2
        check(torch.equal(skv.push_pull(t, average=False, name=f"s{dtype}"), torch.full((5, 3), total, dtype=dtype)), f"sum {dtype}")
        check(torch.equal(t, torch.full((5, 3), float(R + 1), dtype=dtype)), "push_pull leaves its input alone")
        skv.push_pull_(t, average=True, name=f"a{dtype}")
        check(torch.allclose(t.double(), torch.full((5, 3), total / N, dtype=torch.float64), rtol=1e-2), f"in-place average {dtype}")
    handles = [skv.push_pull_async(torch.arange(4.0) * (R + 1), average=False, name=f"h{i}", priority=i) for i in range(3)]
    for h in handles:
        check(torch.equal(skv.synchronize(h), torch.arange(4.0) * N * (N + 1) / 2), "async push_pull")
        check(skv.poll(h), "poll after synchronize")
    # A big value (several partitions) and a non-contiguous one.
    big = torch.full((3_000_001,), float(R))
    check(torch.equal(skv.push_pull(big, average=False, name="big"), torch.full((3_000_001,), float(sum(range(N))))), "big push_pull")
    nc = (torch.arange(12.0).view(3, 4) * (R + 1)).t()
    check(torch.equal(skv.push_pull(nc, average=False, name="nc"), (torch.arange(12.0).view(3, 4) * N * (N + 1) / 2).t()), "non-contiguous")
    root = N - 1
    b = torch.full((4,), float(R))
    skv.broadcast_(b, root_rank=root, name="b")
    check(torch.equal(b, torch.full((4,), float(root))), "broadcast from the last rank")
    model = net()
    skv.broadcast_parameters(model.state_dict(), root_rank=0)
    torch.manual_seed(7)
    rank0 = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    check(close(model, rank0, 0), "broadcast_parameters")
    obj = skv.broadcast_object({"rank": R, "text": "é" * 300}, root_rank=root)
    check(obj == {"rank": root, "text": "é" * 300}, "broadcast_object")
    opt = torch.optim.Adam(model.parameters(), lr=0.01 * (R + 1))
    x, y = data(R, 0)
    F.cross_entropy(model(x), y).backward()
    opt.step()
    skv.broadcast_optimizer_state(opt, root_rank=0)
    check(opt.param_groups[0]["lr"] == 0.01, "broadcast_optimizer_state: hyper-parameters")
    exp_avg = opt.state[next(iter(model.parameters()))]["exp_avg"]
    check(torch.equal(skv.broadcast(exp_avg, 0, name="ea"), exp_avg), "broadcast_optimizer_state: tensors")

elif MODE == "worker_optimizer":
    for passes, compression, cap, tol in ((1, skv.Compression.none, 25, 1e-5), (2, skv.Compression.none, 0.0005, 1e-5), (1, skv.Compression.fp16, 0.0005, 2e-3)):
        model = net()
        full = torch.nn.ModuleDict({"net": model, "unused": torch.nn.Linear(2, 2)})  # never gets a gradient
        skv.broadcast_parameters(full.state_dict(), root_rank=0)
        start = copy.deepcopy(model)
        opt = skv.DistributedOptimizer(
            torch.optim.SGD(full.parameters(), lr=0.5, momentum=0.9),
            named_parameters=full.named_parameters(),
            compression=compression,
            backward_passes_per_step=passes,
            bucket_cap_mb=cap,
        )
        check(isinstance(opt, torch.optim.SGD), "DistributedOptimizer is an SGD")
        for s in range(4):
            opt.zero_grad()
            for p in range(passes):
                x, y = data(R, s * passes + p)
                F.cross_entropy(model(x), y).backward()
            opt.step()
        ref = reference_steps(start, 4, 0.5, passes, momentum=0.9)
        # The reference averages over ranks (divides by N) but sums passes, as Horovod does.
        check(close(model, ref, tol), f"worker-side optimizer passes={passes} {compression}")

elif MODE == "server_optimizer":
    model = net()
    emb = torch.nn.Embedding(50, 6, sparse=True)
    torch.manual_seed(3)
    emb.weight.data.normal_()
    full = torch.nn.ModuleDict({"mlp": model, "emb": emb})
    opt = skv.DistributedOptimizer(synkv.optimizer.SGD(learning_rate=0.5), named_parameters=full)
    check(skv.has_server_optimizer(), "server optimizer noted")
    # init kept rank 0's weights: compare with rank 0's construction.
    torch.manual_seed(7)
    rank0 = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    check(close(model, rank0, 0), "server init keeps rank 0's weights")
    ref = copy.deepcopy(full)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.5)
    for s in range(3):
        opt.zero_grad()
        x, y = data(R, s)
        ids = (torch.arange(8) * 3 + s + R) % 50
        opt.pull_rows(emb.weight, ids)  # rows the other worker changed last step
        (F.cross_entropy(model(x + emb(ids)), y)).backward()
        opt.step()
        ref_opt.zero_grad()
        for r in range(N):
            x, y = data(r, s)
            ids = (torch.arange(8) * 3 + s + r) % 50
            (F.cross_entropy(ref["mlp"](x + ref["emb"](ids)), y) / N).backward()
        ref_opt.step()
    check(close(model, ref["mlp"], 1e-5), "server-side SGD matches the single-process reference")
    # Rows this worker touched in the last step are fresh; pull every row to compare the table.
    out = synkv.RowSparseNDArray.zeros((50, 6))
    skv.store().row_sparse_pull("torch/weight/emb.weight", out=out, row_ids=list(range(50)))
    check(torch.allclose(torch.from_numpy(out.todense()), ref["emb"].weight, atol=1e-5), "sparse rows updated on the servers")

elif MODE == "sparse":
    table = skv.SparseEmbedding(1000, 4, name="t", shard_rows=300, init_std=0.1, seed=5)
    bag = skv.SparseEmbeddingBag(500, 4, name="bag", mode="sum", init_std=0.0)
    head = torch.nn.Linear(4, 1)
    model = torch.nn.ModuleDict({"table": table, "bag": bag, "head": head})
    opt = skv.DistributedOptimizer(synkv.optimizer.SGD(learning_rate=0.1), named_parameters=model.named_parameters())
    # Reference: dense tables with the same start.
    ref_table = torch.zeros(1000, 4)
    for s in range(table.num_shards):
        g = torch.Generator().manual_seed(5 * 1_000_003 + s)
        rows = table._rows_in(s)
        ref_table[s * 300 : s * 300 + rows] = torch.randn(rows, 4, generator=g) * 0.1
    ref = torch.nn.ModuleDict({"table": torch.nn.Embedding.from_pretrained(ref_table, freeze=False), "bag": torch.nn.EmbeddingBag(500, 4, mode="sum"), "head": copy.deepcopy(head)})
    torch.nn.init.zeros_(ref["bag"].weight)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)

    def batch(r, s):
        g = torch.Generator().manual_seed(77 * s + r)
        return torch.randint(0, 1000, (6, 3), generator=g), torch.randint(0, 500, (12,), generator=g), torch.randn(6, generator=g)

    def loss_of(m, ids, bag_ids, y):
        h = m["table"](ids).sum(1) + m["bag"](bag_ids, torch.arange(0, 12, 2))
        return ((m["head"](h).squeeze(1) - y) ** 2).mean()

    for s in range(3):
        opt.zero_grad()
        loss_of(model, *batch(R, s)).backward()
        opt.step()
        ref_opt.zero_grad()
        for r in range(N):
            (loss_of(ref, *batch(r, s)) / N).backward()
        ref_opt.step()
    table.eval()
    with torch.no_grad():
        got = table(torch.arange(1000))
    check(torch.allclose(got, ref["table"].weight, atol=1e-5), "SparseEmbedding rows after training")
    check(torch.allclose(head.weight, ref["head"].weight, atol=1e-5), "dense head with the sparse tables")

elif MODE == "ddp":
    import torch.distributed as dist

    port = int(sys.argv[2])
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=R, world_size=N)
    for hook in (skv.push_pull_hook, skv.fp16_push_pull_hook):
        model = net()
        ddp = torch.nn.parallel.DistributedDataParallel(model)  # broadcasts rank 0's weights
        start = copy.deepcopy(model)
        ddp.register_comm_hook(None, hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.5)
        for s in range(3):
            opt.zero_grad()
            x, y = data(R, s)
            F.cross_entropy(ddp(x), y).backward()
            opt.step()
        ref = reference_steps(start, 3, 0.5)
        check(close(model, ref, 1e-5 if hook is skv.push_pull_hook else 2e-3), f"DDP with {hook.__name__}")
    # 2-bit quantized buckets: lossy, but every worker applies the same averaged gradients.
    model = net()
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    ddp.register_comm_hook(None, skv.push_pull_hook_with(skv.Compression.twobit(threshold=0.01)))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.5)
    start = [p.detach().clone() for p in model.parameters()]
    for s in range(3):
        opt.zero_grad()
        x, y = data(R, s)
        F.cross_entropy(ddp(x), y).backward()
        opt.step()
    check(any(not torch.equal(p, q) for p, q in zip(model.parameters(), start)), "DDP with 2-bit buckets trains")
    for i, p in enumerate(model.parameters()):
        check(torch.equal(skv.broadcast(p.detach(), 0, name=f"ddp2bit/{i}"), p.detach()), "DDP with 2-bit buckets: workers agree")
    dist.destroy_process_group()

elif MODE == "async":
    # A loss whose gradient is a constant c_r: whatever the order, the servers' Test
    # optimizer (w += rescale_grad * g) ends at w0 + sum over pushes.
    w = torch.nn.Parameter(torch.zeros(1000))
    opt = skv.DistributedOptimizer(synkv.optimizer.Test(rescale_grad=1.0), named_parameters=[("w", w)])
    c = torch.linspace(0, 1, 1000) * (R + 1)
    for s in range(20):
        opt.zero_grad()
        (w * c).sum().backward()
        opt.step()
    skv.store().barrier()
    out = torch.zeros(1000)
    skv.store().pull("torch/weight/w", out=out)
    check(torch.allclose(out, torch.linspace(0, 1, 1000) * 20 * N * (N + 1) / 2, rtol=1e-5), "async: every push applied once")
elif MODE == "twobit":
    # Gradients of +-threshold or 0 quantize exactly: the averaged step is exact.
    w = torch.nn.Parameter(torch.zeros(64))
    c = torch.tensor([0.5, -0.5, 0.0, 0.5] * 16) * (1 if R % 2 == 0 else -1)
    opt = skv.DistributedOptimizer(torch.optim.SGD([w], lr=1.0), named_parameters=[("w", w)], compression=skv.Compression.twobit(threshold=0.5))
    for s in range(3):
        opt.zero_grad()
        (w * c).sum().backward()
        opt.step()
    mean_c = sum(torch.tensor([0.5, -0.5, 0.0, 0.5] * 16) * (1 if r % 2 == 0 else -1) for r in range(N)) / N
    check(torch.equal(w.detach(), -3 * mean_c), "2-bit compressed gradients")
    # Broadcasts after compression is on travel as init values (uncompressed).
    model = net()
    skv.broadcast_parameters(model.state_dict(), root_rank=0)
    torch.manual_seed(7)
    rank0 = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    check(close(model, rank0, 0), "broadcast_parameters with compression on")
    try:
        skv.push_pull(torch.ones(3), compression=skv.Compression.onebit, name="other")
        check(False, "a second compression setting is refused")
    except ValueError:
        pass
else:
    raise SystemExit(f"unknown mode {MODE}")

print(f"worker {R} of {N}: ok", flush=True)
skv.shutdown()
