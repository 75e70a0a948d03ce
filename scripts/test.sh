#!/usr/bin/env bash
# The test command named in README.md: every unit, simulator and process-level test.
# Needs the Rust toolchain. As root it also installs (when missing):
# - iproute2 and nftables for the network-namespace fault-injection tests;
# - redis-tools (redis-cli, redis-benchmark) for the cluster-aware client tests (sharding.rs);
# - clang, llvm, libbpf-dev, bpftool and ethtool for the kernel data path (crates/group/bpf:
#   build.rs compiles the XDP program with clang; its tests run chains in namespaces).
# Without them those tests skip and say why. On a 2-core machine it finishes well under 15 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v nft >/dev/null || missing+=(nftables)
command -v ip >/dev/null || missing+=(iproute2)
command -v clang >/dev/null || missing+=(clang llvm)
[ -e /usr/include/bpf/bpf_helpers.h ] || missing+=(libbpf-dev)
command -v bpftool >/dev/null || missing+=(bpftool)
command -v ethtool >/dev/null || missing+=(ethtool)
command -v redis-benchmark >/dev/null || missing+=(redis-tools)
if [ "$(id -u)" = 0 ] && [ ${#missing[@]} -gt 0 ]; then
  echo "scripts/test.sh: installing ${missing[*]} for the namespace and kernel data path tests" >&2
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}") >/dev/null \
    || echo "scripts/test.sh: could not install them; the namespace, kernel-path and redis-cli tests will skip" >&2
fi

cargo test --workspace --locked "$@"
