#!/usr/bin/env bash
# The whole test suite: what `.ci/run` and the README's test command run.
set -euo pipefail
cd "$(dirname "$0")/.."

bash tests/setup.sh
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace
