#!/usr/bin/env bash
# The test command named in README.md: every unit, simulator and process-level test.
# Needs only the Rust toolchain; on a 2-core machine it finishes well under 15 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace --locked "$@"
