"""The GIL is released while synkv works or waits, and one store serves many threads."""

import subprocess
import sys
import textwrap
import threading

import numpy as np

import synkv
from conftest import assert_all

# A pull that can only finish after another Python thread has run: the updater it waits for
# blocks until a helper thread sets an event. If the pull held the GIL, neither the updater
# (which needs the GIL) nor the helper could run, and the script would hang; it runs in a
# subprocess so that a hang is a test failure (timeout), not a stuck test run.
GIL_SCRIPT = textwrap.dedent(
    """
    import threading, numpy as np, synkv
    kv = synkv.create("local")
    kv.init(3, np.zeros(4, np.float32))
    started, release = threading.Event(), threading.Event()
    progress = []

    def updater(key, recv, stored):
        started.set()
        assert release.wait(30), "helper never ran"
        stored += recv

    def helper():
        assert started.wait(30), "updater never started"
        for i in range(1000):
            progress.append(i)  # Python work while the main thread is inside pull
        release.set()

    kv.set_updater(updater)
    threading.Thread(target=lambda: kv.push(3, np.ones(4, np.float32))).start()
    assert started.wait(30)
    threading.Thread(target=helper).start()
    out = np.zeros(4, np.float32)
    kv.pull(3, out=out)  # waits for the update, which waits for the helper
    assert (out == 1).all() and len(progress) == 1000, (out, len(progress))
    print("ok")
    """
)


def test_gil_is_released_while_waiting():
    done = subprocess.run([sys.executable, "-c", GIL_SCRIPT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


EXIT_SCRIPT = textwrap.dedent(
    """
    import threading, time, numpy as np, synkv
    kv = synkv.create("local")
    kv.init([0, 1], [np.zeros(1 << 14, np.float32)] * 2)
    kv.set_updater(lambda k, i, s: (time.sleep(0.001), s.__iadd__(i)))

    def loop():
        g = [np.ones(1 << 14, np.float32)] * 2
        while True:
            kv.push([0, 1], g)

    for _ in range(3):
        threading.Thread(target=loop, daemon=True).start()
    time.sleep(0.2)
    print("exiting")
    """
)


def test_exit_while_daemon_threads_push():
    """At exit, new calls are refused and scheduled updates finish before finalisation."""
    for _ in range(3):
        done = subprocess.run([sys.executable, "-c", EXIT_SCRIPT], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "exiting"


def test_threads_share_one_store():
    kv = synkv.create("local")
    n_threads, rounds = 8, 50
    for t in range(n_threads):
        kv.init(t, np.zeros(1000, np.float32))
    errors = []

    def worker(t):
        try:
            out = np.zeros(1000, np.float32)
            for r in range(rounds):
                kv.push(t, np.full(1000, r + t, np.float32))
                kv.pull(t, out=out)
                assert (out == r + t).all()
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []


def test_concurrent_pushes_to_one_key_are_all_applied():
    kv = synkv.create("local")
    kv.init("w", np.zeros(256, np.float64))
    kv.set_updater(lambda key, recv, stored: stored.__iadd__(recv))
    n_threads, pushes = 4, 100

    def worker():
        g = np.ones(256)
        for _ in range(pushes):
            kv.push("w", g)

    threads = [threading.Thread(target=worker) for _ in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    out = np.zeros(256)
    kv.pull("w", out=out)
    assert_all(out, n_threads * pushes)


def test_many_keys_in_one_push_pipeline():
    """One call with many keys schedules them all before waiting once."""
    kv = synkv.create("local")
    keys = list(range(64))
    kv.init(keys, [np.zeros(4096, np.float32) for _ in keys])
    grads = [np.full(4096, k, np.float32) for k in keys]
    kv.push(keys, grads)
    outs = [np.empty(4096, np.float32) for _ in keys]
    kv.pull(keys, out=outs)
    for k, o in zip(keys, outs):
        assert_all(o, k)


def test_close_and_context_manager():
    with synkv.create("local") as kv:
        kv.init(1, np.zeros(3, np.float32))
        kv.push(1, np.ones(3, np.float32))
    kv.close()  # again: harmless
    out = np.zeros(3, np.float32)
    kv.pull(1, out=out)  # a closed local store still works (close only waits)
    assert_all(out, 1)
