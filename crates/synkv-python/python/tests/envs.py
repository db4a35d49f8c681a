"""The environment of the tests and of the processes they start (issue 14, item 7): nothing a
synkv job reads is taken from the contributor's shell (``RUST_BACKTRACE=1``, a leftover
``DMLC_ROLE``, ``SYNKV_SECRET``, a torchrun or Slurm allocation, ...); each test sets what it
needs. ``PATH``, ``HOME``, ``VIRTUAL_ENV``, ``PYTHONPATH``, ``LD_LIBRARY_PATH`` and the rest
are kept.

The same list as the Rust tests' ``crates/synkv-cli/tests/util/clean_env.rs``; keep them in
step.

    from envs import clean_env
    subprocess.run([BIN, "launch", ...], env=clean_env(SYNKV_TIMEOUT_MS="60000"))

conftest.py also removes these variables from the pytest process itself
(:func:`scrub_process_environment`), so in-process tests (``synkv.create``, ``synkv.torch``,
the engine's thread count, ``SYNKV_LOG``) do not see them either.
"""

import os

# Name prefixes: synkv's own, ps-lite's and MXNet's, and the rank and size variables of the
# orchestrators synkv detects (torchrun, Slurm, Open MPI, PMI / PMIx launchers).
JOB_VARIABLE_PREFIXES = ("SYNKV_", "DMLC_", "MXNET_", "PS_", "PET_", "TORCHELASTIC_", "SLURM_", "OMPI_", "PMI_", "PMIX_")

# Whole names: a server's PORT, Rust's backtrace and log switches (the ssh launcher forwards
# RUST_LOG, RUST_BACKTRACE and OMP_NUM_THREADS), colour switches (output is parsed), torchrun's
# and MPI's rank variables.
JOB_VARIABLES = frozenset(
    {
        "PORT",
        "RUST_BACKTRACE",
        "RUST_LIB_BACKTRACE",
        "RUST_LOG",
        "OMP_NUM_THREADS",
        "NO_COLOR",
        "CLICOLOR",
        "CLICOLOR_FORCE",
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "GROUP_WORLD_SIZE",
        "ROLE_RANK",
        "ROLE_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "MPI_LOCALRANKID",
        "MPI_LOCALNRANKS",
    }
)

# Read by the test suite itself (which synkv binary to run; see test_dist.py), not by a job:
# kept in the pytest process, never passed to a child.
HARNESS_VARIABLES = frozenset({"SYNKV_BIN"})


def is_job_variable(name):
    """Whether a synkv job (the binary, the library, synkv.torch, a launched program) reads
    ``name``."""
    return name in JOB_VARIABLES or name.startswith(JOB_VARIABLE_PREFIXES)


def clean_env(**overrides):
    """A copy of ``os.environ`` without the job variables, with ``overrides`` set: the ``env``
    of a process a test starts."""
    env = {k: v for k, v in os.environ.items() if not is_job_variable(k)}
    env.update(overrides)
    return env


def scrub_process_environment():
    """Removes the job variables, but for :data:`HARNESS_VARIABLES`, from this process's
    environment (and so from the C environment the synkv extension reads). conftest.py calls
    it before importing synkv. Returns the names removed."""
    removed = sorted(k for k in os.environ if is_job_variable(k) and k not in HARNESS_VARIABLES)
    for k in removed:
        del os.environ[k]
    return removed
