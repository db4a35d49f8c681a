# Shared by scripts/test-slurm.sh and scripts/test-mpi.sh (sourced, not run): the synkv binary,
# a clean environment, a free port, package installation and the expected output of t24.

# Prints a clear skip message and exits 0.
skip() {
    echo "SKIPPED ($ENGINE): $*"
    exit 0
}

# Removes every variable a synkv job reads, so the engine's own variables decide the job (the
# same prefixes and names as crates/synkv-cli/tests/util/clean_env.rs).
clean_job_env() {
    local v
    for v in $(compgen -e); do
        case "$v" in
            SYNKV_* | DMLC_* | MXNET_* | PS_* | PET_* | TORCHELASTIC_* | SLURM_* | OMPI_* | PMI_* | PMIX_*) unset "$v" ;;
            PORT | RANK | WORLD_SIZE | LOCAL_RANK | LOCAL_WORLD_SIZE | GROUP_RANK | GROUP_WORLD_SIZE | ROLE_RANK | ROLE_WORLD_SIZE | MASTER_ADDR | MASTER_PORT | MPI_LOCALRANKID | MPI_LOCALNRANKS) unset "$v" ;;
        esac
    done
    # The tests' fast failure detection, and 1 MiB partitions so key 99 is split into parts.
    export SYNKV_HEARTBEAT_INTERVAL_MS=200 SYNKV_HEARTBEAT_TIMEOUT_MS=2000 SYNKV_TIMEOUT_MS=30000
    export SYNKV_PARTITION_BYTES=1048576 SYNKV_LOG=warn
}

# Installs the Debian packages "$@" when a command of theirs is missing; returns non-zero when
# that fails.
ensure_packages() {
    local need=$1
    shift
    command -v "$need" >/dev/null 2>&1 && return 0
    echo "installing $* (Debian packages)"
    export DEBIAN_FRONTEND=noninteractive
    timeout 300 apt-get -o DPkg::Lock::Timeout=120 install -y --no-install-recommends "$@" >/tmp/synkv-apt-$ENGINE.log 2>&1 ||
        { timeout 300 apt-get update >>/tmp/synkv-apt-$ENGINE.log 2>&1 &&
            timeout 300 apt-get -o DPkg::Lock::Timeout=120 install -y --no-install-recommends "$@" >>/tmp/synkv-apt-$ENGINE.log 2>&1; } ||
        { tail -5 /tmp/synkv-apt-$ENGINE.log; return 1; }
    command -v "$need" >/dev/null 2>&1
}

# A TCP port that is free on 127.0.0.1 right now, below the ephemeral range (where outgoing
# connections could take it before the process we hand it to binds it): the tests' ports.py.
free_port() {
    PYTHONPATH="$(dirname "${BASH_SOURCE[0]}")/../crates/synkv-python/python/tests" python3 -c 'from ports import free_port; print(free_port())'
}

# The synkv binary: $SYNKV_BIN, else the debug build (which `cargo test` has just built).
synkv_bin() {
    if [[ -n "${SYNKV_BIN:-}" ]]; then
        echo "$SYNKV_BIN"
        return
    fi
    cargo build -q -p synkv-cli >&2
    echo "$PWD/target/debug/synkv"
}

PASSED=0
FAILED=0

# check NAME STATUS OUTPUT_FILE WORKERS SERVERS: the run exited 0 and every rank printed its t24
# line.
check_t24() {
    local name=$1 status=$2 out=$3 n=$4 s=$5 ok=1 r
    if [[ "$status" != 0 ]]; then
        echo "FAIL $name: exit status $status"
        ok=0
    fi
    for ((r = 0; r < n; r++)); do
        if ! grep -qF "selftest t24 ok (rank $r of $n workers, $s servers)" "$out"; then
            echo "FAIL $name: no 'selftest t24 ok (rank $r of $n workers, $s servers)'"
            ok=0
        fi
    done
    if ((ok)); then
        echo "ok   $name"
        PASSED=$((PASSED + 1))
    else
        echo "---- output of $name:"
        cat "$out"
        echo "----"
        FAILED=$((FAILED + 1))
    fi
}

# check_contains NAME OUTPUT_FILE TEXT...: each TEXT is in the output.
check_contains() {
    local name=$1 out=$2 ok=1 t
    shift 2
    for t in "$@"; do
        if ! grep -qF -- "$t" "$out"; then
            echo "FAIL $name: expected $t"
            ok=0
        fi
    done
    if ((ok)); then
        echo "ok   $name"
        PASSED=$((PASSED + 1))
    else
        echo "---- output of $name:"
        cat "$out"
        echo "----"
        FAILED=$((FAILED + 1))
    fi
}

# The closing line, and the exit status.
finish() {
    echo "$ENGINE: $PASSED passed, $FAILED failed"
    ((FAILED == 0))
}
