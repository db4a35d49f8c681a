"""synkv.torch and torch tensors (issue 12): zero-copy CPU tensors in every dtype, the
Horovod/BytePS API in one process, and under `synkv launch` every mode of torch_worker.py
(collectives, worker- and server-side DistributedOptimizer, sparse embeddings, the DDP hook,
dist_async), each checked against a single-process reference inside the workers.

Skipped when torch is not importable (scripts/test-python.sh installs Debian's python3-torch)."""

import copy
import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import synkv  # noqa: E402
import synkv.torch as skv  # noqa: E402
from ports import free_port  # noqa: E402
from test_dist import BIN, HERE  # noqa: E402

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]


@pytest.fixture
def local_skv(monkeypatch):
    for var in ("DMLC_PS_ROOT_URI", "RANK", "WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SYNKV_KVSTORE"):
        monkeypatch.delenv(var, raising=False)
    skv.init()
    yield skv.store()
    skv.shutdown()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_tensors_are_pushed_and_pulled_in_place(dtype):
    kv = synkv.create("local")
    a = torch.arange(6, dtype=dtype).reshape(2, 3)
    kv.init("k", a)
    kv.push("k", [a, a])
    a.fill_(100)  # push has consumed its values: the store keeps its copy
    out = torch.empty(2, 3, dtype=dtype)
    ptr = out.data_ptr()
    kv.pull("k", out=out)
    assert out.data_ptr() == ptr
    assert torch.equal(out, (torch.arange(6, dtype=torch.float64).reshape(2, 3) * 2).to(dtype))


def test_a_tensor_that_requires_grad_is_a_value_and_an_output():
    kv = synkv.create("local")
    w = torch.nn.Parameter(torch.ones(4))
    kv.init(0, w)
    kv.push(0, torch.full((4,), 3.0))
    kv.pull(0, out=w.data)
    assert torch.equal(w.detach(), torch.full((4,), 3.0))


def test_non_contiguous_tensors_are_copied_as_values_and_refused_as_outputs():
    kv = synkv.create("local")
    t = torch.arange(6.0).reshape(2, 3).t()
    kv.init(0, t)
    out = torch.empty(3, 2)
    kv.pull(0, out=out)
    assert torch.equal(out, t)
    with pytest.raises(ValueError, match="contiguous"):
        kv.pull(0, out=torch.empty(2, 3).t())


def test_integer_tensors_are_refused_with_the_dtypes_synkv_holds():
    kv = synkv.create("local")
    with pytest.raises(synkv.KVStoreDTypeError, match="float32"):
        kv.init(0, torch.zeros(3, dtype=torch.int16))


def test_async_push_keeps_the_tensor_until_waited():
    kv = synkv.create("local")
    kv.init(0, torch.zeros(1000))
    req = kv.push(0, torch.ones(1000), block=False)
    req.wait()
    out = torch.zeros(1000)
    kv.pull(0, out=out)
    assert torch.equal(out, torch.ones(1000))


def test_one_process_api(local_skv):
    assert (skv.rank(), skv.size(), skv.local_rank(), skv.local_size()) == (0, 1, 0, 1)
    assert local_skv.type == "local"
    t = torch.arange(5.0)
    assert torch.equal(skv.push_pull(t), t)
    h = skv.push_pull_async(t, name="x")
    assert torch.equal(skv.synchronize(h), t)
    assert skv.broadcast_object({"a": 1}) == {"a": 1}
    with pytest.raises(ValueError, match="root_rank"):
        skv.broadcast(t, root_rank=3)
    with pytest.raises(TypeError, match="float32"):
        skv.push_pull(torch.arange(3))


def test_the_distributed_optimizer_is_the_wrapped_optimizer_in_one_process(local_skv):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.ReLU(), torch.nn.Linear(7, 2))
    ref = copy.deepcopy(model)
    opt = skv.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.01), named_parameters=model.named_parameters(), bucket_cap_mb=0.0001)
    ref_opt = torch.optim.Adam(ref.parameters(), lr=0.01)
    assert isinstance(opt, torch.optim.Adam)
    x, y = torch.randn(10, 5), torch.randint(0, 2, (10,))
    for _ in range(3):
        for m, o in ((model, opt), (ref, ref_opt)):
            o.zero_grad()
            torch.nn.functional.cross_entropy(m(x), y).backward()
            o.step()
    for p, q in zip(model.parameters(), ref.parameters()):
        assert torch.allclose(p, q)
    # A second backward without step() is more than backward_passes_per_step allows.
    torch.nn.functional.cross_entropy(model(x), y).backward()
    with pytest.raises(RuntimeError, match="backward_passes_per_step"):
        torch.nn.functional.cross_entropy(model(x), y).backward()


def test_named_parameters_must_cover_the_optimizer(local_skv):
    model = torch.nn.Linear(3, 3)
    with pytest.raises(ValueError, match="named_parameters lacks"):
        skv.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=[("weight", model.weight)])
    with pytest.raises(TypeError, match="torch.optim.Optimizer"):
        skv.DistributedOptimizer(object())


def test_compression_names():
    assert skv.Compression.fp16.wire_dtype(torch.float32) == torch.float16
    assert skv.Compression.none.wire_dtype(torch.float32) == torch.float32
    assert skv.Compression.twobit(threshold=1.5).store_params == {"type": "2bit", "threshold": 1.5}
    assert skv.Compression.onebit.store_params == {"type": "1bit", "threshold": 0.0}




def launch(workers, servers, mode, *args, launcher="local", **extra_env):
    if BIN is None:
        pytest.skip("the synkv binary is not built")
    cmd = [BIN, "launch", "--launcher", launcher, "-n", str(workers), "-s", str(servers), "--", sys.executable, str(HERE / "torch_worker.py"), mode, *args]
    env = dict(os.environ, SYNKV_TIMEOUT_MS="60000", OMP_NUM_THREADS="1", **extra_env)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert sum(f"of {workers}: ok" in line for line in out.splitlines()) == workers, out[-4000:]


@pytest.mark.parametrize("workers,servers", [(2, 2), (3, 1)])
def test_collectives(workers, servers):
    launch(workers, servers, "collectives")


def test_worker_side_distributed_optimizer_matches_one_process():
    launch(2, 1, "worker_optimizer")


def test_server_side_optimizer_with_a_sparse_embedding_matches_one_process():
    launch(2, 2, "server_optimizer")


def test_sparse_embedding_tables_on_the_servers_match_dense_ones():
    launch(2, 2, "sparse")


def test_ddp_communication_hook_matches_one_process():
    launch(2, 1, "ddp", str(free_port()))


def test_two_bit_compression_and_broadcasts_under_it():
    launch(3, 1, "twobit")


def test_dist_async_applies_every_push_once():
    launch(3, 1, "async")


EXAMPLES = HERE.parents[3] / "examples" / "python" / "torch"


@pytest.mark.parametrize(
    "script,args,metric,goal",
    [
        ("digits_cnn.py", [], "final accuracy", 0.95),
        ("digits_cnn.py", ["--server-optimizer"], "final accuracy", 0.95),
        ("ctr_sparse.py", [], "final auc", 0.75),
    ],
    ids=["digits-worker-optimizer", "digits-server-optimizer", "ctr-sparse-async"],
)
def test_examples_train_on_two_workers(script, args, metric, goal):
    if BIN is None:
        pytest.skip("the synkv binary is not built")
    if not (EXAMPLES / script).exists():
        pytest.skip("run from a synkv checkout")
    pytest.importorskip("sklearn")
    cmd = [BIN, "launch", "-n", "2", "-s", "1", "--", sys.executable, str(EXAMPLES / script), *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=dict(os.environ, SYNKV_TIMEOUT_MS="60000"))
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    finals = [line for line in done.stdout.splitlines() if metric in line]
    assert finals, out[-4000:]
    assert float(finals[-1].split(metric)[1].split()[0]) >= goal, finals


# What torchrun (and Kubeflow's PyTorchJob) give every process, besides RANK and LOCAL_RANK.
def torchrun_env(rank, world, port):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "SLURM_", "OMPI_", "PMI_", "PET_", "SYNKV_"))}
    env.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(world),
        GROUP_RANK="0",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        SYNKV_TIMEOUT_MS="60000",
        OMP_NUM_THREADS="1",
    )
    return env


@pytest.mark.parametrize("mode", ["collectives", "server_optimizer"])
def test_processes_started_with_torchruns_variables_form_a_job(mode):
    """No synkv launch: rank 0 hosts the scheduler, local rank 0 a server (docs/dist-env.md)."""
    port = free_port(2)  # MASTER_PORT, and synkv's scheduler at MASTER_PORT + 1
    procs = [
        subprocess.Popen([sys.executable, str(HERE / "torch_worker.py"), mode], env=torchrun_env(r, 2, port), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for r in range(2)
    ]
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=300)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out[-4000:]
        assert "of 2: ok" in out, out[-4000:]


@pytest.mark.parametrize("mode", ["collectives", "server_optimizer"])
def test_processes_hosting_a_server_each_over_tcp_match_one_process(mode):
    """`synkv launch --launcher hosted` with SYNKV_SHM=0: each process hosts a server, reaches
    its own through memory and the other over TCP (docs/dist.md, "A process's own server")."""
    launch(2, 2, mode, launcher="hosted", SYNKV_SHM="0")


def test_real_torchrun():
    if tuple(int(x) for x in torch.__version__.split(".")[:2]) < (2, 0) and sys.version_info >= (3, 11):
        pytest.skip("torch 1.13's torchrun fails on Python 3.11 (its Std enum); checked by hand with torch 2.5.1 (docs/torch.md)")
    port = free_port(2)  # MASTER_PORT, and synkv's scheduler at MASTER_PORT + 1
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "SLURM_", "OMPI_", "PMI_", "PET_", "SYNKV_"))}
    env.update(SYNKV_TIMEOUT_MS="60000", OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port), str(HERE / "torch_worker.py"), "collectives"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert out.count("of 2: ok") == 2, out[-4000:]
