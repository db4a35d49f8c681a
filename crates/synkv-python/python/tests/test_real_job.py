"""Issue 10's reproductions, as a Python user meets them (`synkv launch` + the package, no
explicit kv.close()): workers finishing far apart, a slow worker between sync pushes, and a
close that fails at interpreter exit (a non-zero exit, not a printed line)."""

import pathlib
import signal
import subprocess
import sys
import time

import pytest

from envs import clean_env
from ports import free_port
from test_dist import BIN

HERE = pathlib.Path(__file__).resolve().parent
WORKER = str(HERE / "real_job_worker.py")
pytestmark = pytest.mark.skipif(BIN is None, reason="the synkv binary is not built (set SYNKV_BIN or run scripts/test-python.sh)")

# Short deadlines, so that "three times the timeout" is seconds; fast failure detection.
FAST = {"SYNKV_TIMEOUT_MS": "1000", "SYNKV_HEARTBEAT_INTERVAL_MS": "200", "SYNKV_HEARTBEAT_TIMEOUT_MS": "2000"}


def env(**extra):
    return clean_env(**{**FAST, **extra})


def launch(case, secs, **extra):
    cmd = [BIN, "launch", "-n", "2", "-s", "1", "--", sys.executable, WORKER, case, str(secs)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env(**extra))


def test_workers_finishing_three_times_the_timeout_apart_all_exit_zero():
    started = time.monotonic()
    done = launch("finish-apart", 3)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert out.count(": ok") == 2, out[-3000:]
    for label in ("scheduler", "server 0", "worker 0", "worker 1"):
        assert f"[launch] {label} exited successfully" in out, out[-3000:]
    assert time.monotonic() - started < 60


def test_a_worker_sleeping_three_times_the_timeout_between_sync_pushes_is_waited_for():
    done = launch("straggler", 3, SYNKV_STRAGGLER_WARN_MS="2000")
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert out.count(": ok") == 2, out[-3000:]
    reports = [l for l in out.splitlines() if l.startswith("[server 0]") and "straggler:" in l]
    assert 1 <= len(reports) <= 2, out[-3000:]
    assert "for worker rank 1 (of 2 workers)" in reports[0], reports
    # The waiting Python worker logs the report too (the package logs to stderr).
    heard = [l for l in out.splitlines() if l.startswith("[worker 0]") and "reports: straggler:" in l]
    assert len(heard) == len(reports), out[-3000:]


def test_a_close_that_fails_at_interpreter_exit_is_a_nonzero_exit():
    # A job started role by role: worker 0 finishes and waits, at interpreter exit, for worker
    # 1 (which trains on); then the scheduler dies. Worker 0's close fails: exit status 1.
    port = free_port()
    base = env(DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT=str(port), DMLC_NUM_SERVER="1", DMLC_NUM_WORKER="2")
    procs = []
    try:
        def start(args, **role):
            p = subprocess.Popen(args, env=dict(base, **role), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            procs.append(p)
            return p

        scheduler = start([BIN, "scheduler"], DMLC_ROLE="scheduler")
        start([BIN, "server"], DMLC_ROLE="server", DMLC_TASK_ID="0")
        early = start([sys.executable, WORKER, "finish-apart", "60"], DMLC_ROLE="worker", DMLC_TASK_ID="0")
        start([sys.executable, WORKER, "finish-apart", "60"], DMLC_ROLE="worker", DMLC_TASK_ID="1")
        line = early.stdout.readline()
        while line and ": ok" not in line:
            line = early.stdout.readline()
        assert ": ok" in line, "worker 0 never finished its work"
        time.sleep(1.0)  # worker 0 now waits in close(), at exit, for worker 1
        assert early.poll() is None, "worker 0 left before the others finished"
        scheduler.send_signal(signal.SIGKILL)
        status = early.wait(timeout=60)
        rest = early.stdout.read()
        assert status == 1, f"exit status {status}:\n{rest}"
        assert "synkv: error at exit" in rest and "lost scheduler" in rest, rest
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=30)


def test_a_job_resumed_from_a_checkpoint_ends_with_the_same_weights(tmp_path):
    ckpt = HERE / "checkpoint_worker.py"

    def run(*args, **extra):
        cmd = [BIN, "launch", "-n", "2", "-s", "2", "--", sys.executable, str(ckpt), *map(str, args)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env(SYNKV_TIMEOUT_MS="30000", **extra))
        out = done.stdout + done.stderr
        assert done.returncode == 0, out[-3000:]
        finals = sorted(l.split("final ")[1] for l in done.stdout.splitlines() if " final " in l)
        assert len(finals) == 2 and finals[0] == finals[1], out[-3000:]
        return finals[0], out

    whole, _ = run(6)
    _, first = run(6, 3, tmp_path)
    assert "checkpoint 1 at round 3" in first, first[-3000:]
    resumed, out = run(6, SYNKV_CHECKPOINT_DIR=str(tmp_path))
    assert "starts after round 3" in out, out[-3000:]
    assert "resuming from checkpoint 1" in out, out[-3000:]
    assert resumed == whole, f"resumed {resumed} vs uninterrupted {whole}"
