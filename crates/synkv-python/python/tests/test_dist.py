"""Distributed stores under `synkv launch` (spec K11 T24, T30, T35): every worker runs
dist_worker.py, which checks upstream's numbers and exits non-zero on a wrong value.

Needs the `synkv` binary: $SYNKV_BIN, `synkv` on PATH, or target/{debug,release}/synkv of
this checkout (scripts/test-python.sh builds it); skipped otherwise."""

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from envs import clean_env

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[3]


def synkv_binary():
    candidates = [os.environ.get("SYNKV_BIN"), shutil.which("synkv")]
    target = pathlib.Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    candidates += [str(target / "debug" / "synkv"), str(target / "release" / "synkv")]
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


BIN = synkv_binary()
pytestmark = pytest.mark.skipif(BIN is None, reason="the synkv binary is not built (set SYNKV_BIN or run scripts/test-python.sh)")


def launch(workers, servers, *args):
    cmd = [BIN, "launch", "-n", str(workers), "-s", str(servers), "--", sys.executable, str(HERE / "dist_worker.py"), *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=clean_env(SYNKV_TIMEOUT_MS="60000"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout + done.stderr
    assert sum(f"of {workers}: ok" in line for line in out.splitlines()) == workers, out[-3000:]


def test_dist_sync_two_workers_two_servers():
    launch(2, 2)


def test_dist_sync_three_workers_one_server_closed_at_exit():
    launch(3, 1, "--no-close")


def test_the_example_trains_under_launch_with_a_dist_store():
    example = HERE.parents[3] / "examples" / "python" / "train_logreg.py"
    if not example.exists():
        pytest.skip("run from a synkv checkout")
    cmd = [BIN, "launch", "-n", "2", "-s", "1", "--", sys.executable, str(example), "--store", "dist_sync"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=clean_env(SYNKV_TIMEOUT_MS="60000"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    finals = [line for line in done.stdout.splitlines() if "final accuracy" in line]
    assert len(finals) == 2, done.stdout[-3000:]
    for line in finals:
        assert float(line.split("final accuracy")[1].split()[0]) > 0.9, line
