#!/usr/bin/env bash
# Runs the Perl module's tests (perl/SynKV/t) against a freshly built C ABI library.
# Installs what it needs first: Debian's PDL and FFI::Platypus packages (CI runs as root on a
# fresh Debian machine). The C API's own tests (a C program and the C tutorial, compiled with
# cc) run under `cargo test -p synkv-capi`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if ! command -v prove >/dev/null || ! perl -MPDL -MFFI::Platypus -e 1 2>/dev/null; then
    echo "== installing perl, pdl and libffi-platypus-perl"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update
    apt-get install -y --no-install-recommends perl pdl libffi-platypus-perl
fi

echo "== cargo build -p synkv-capi"
cargo build -p synkv-capi
target_dir=$(cargo metadata --format-version 1 --no-deps | perl -MJSON::PP -0777 -ne 'print decode_json($_)->{target_directory}')
export SYNKV_LIB="$target_dir/debug/libsynkv_capi.so"

echo "== prove -r perl/SynKV/t (SYNKV_LIB=$SYNKV_LIB)"
prove -r perl/SynKV/t
