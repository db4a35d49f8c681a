#!/usr/bin/env bash
# Runs every test of synkv: formatting, lints, Rust unit + integration + doc tests.
# This is the README's test command; .ci/run calls it. It installs what it needs itself.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== cargo clippy (warnings are errors)"
cargo clippy --workspace --all-targets -- -D warnings

echo "== cargo test"
cargo test --workspace
