"""The Python example trains: its loss goes down (it asserts so itself) and it prints the
final accuracy."""

import pathlib
import subprocess
import sys

import pytest

EXAMPLE = pathlib.Path(__file__).resolve().parents[4] / "examples" / "python" / "train_logreg.py"


@pytest.mark.skipif(not EXAMPLE.exists(), reason="run from a synkv checkout")
def test_train_logreg_example():
    done = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("final accuracy")
    assert float(last.split()[2]) > 0.9
