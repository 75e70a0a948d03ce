#!/usr/bin/env bash
# The test command named in README.md: every unit, simulator and process-level test.
# Needs the Rust toolchain. As root it also installs iproute2 and nftables (when missing) for
# the network-namespace fault-injection tests, which otherwise skip and say why.
# On a 2-core machine it finishes well under 15 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" = 0 ] && ! { command -v nft >/dev/null && command -v ip >/dev/null; }; then
  echo "scripts/test.sh: installing iproute2 and nftables for the fault-injection tests" >&2
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iproute2 nftables) >/dev/null \
    || echo "scripts/test.sh: could not install them; the namespace tests will skip" >&2
fi

cargo test --workspace --locked "$@"
