#!/usr/bin/env bash
# Runs the Perl module's tests (perl/SynKV/t) against a freshly built C ABI library.
# Installs what it needs first: Debian's PDL and FFI::Platypus packages (CI runs as root on a
# fresh Debian machine). Also builds the `synkv` executable, which t/dist.t uses to launch a
# distributed job of Perl workers (SYNKV_BIN), so that test never skips here. The C API's own
# tests (C programs compiled with cc) run under `cargo test -p synkv-capi`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if ! command -v prove >/dev/null || ! perl -MPDL -MFFI::Platypus -e 1 2>/dev/null; then
    echo "== installing perl, pdl and libffi-platypus-perl"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update
    apt-get install -y --no-install-recommends perl pdl libffi-platypus-perl
fi

echo "== cargo build -p synkv-capi -p synkv-cli"
cargo build -p synkv-capi -p synkv-cli
target_dir=$(cargo metadata --format-version 1 --no-deps | perl -MJSON::PP -0777 -ne 'print decode_json($_)->{target_directory}')
export SYNKV_LIB="$target_dir/debug/libsynkv_capi.so"
export SYNKV_BIN="$target_dir/debug/synkv"

echo "== prove -r perl/SynKV/t (SYNKV_LIB=$SYNKV_LIB SYNKV_BIN=$SYNKV_BIN)"
prove -r perl/SynKV/t
