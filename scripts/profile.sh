#!/usr/bin/env bash
# Profile one Chorus node under a redis-benchmark load and save what perf says, so the
# benchmark report can say *why* a target is missed (docs/benchmarks.md, "Profiles").
#
#   scripts/profile.sh [--protocol hermes] [--clients 64] [--test set] [--seconds 5] [--out DIR]
#
# Starts `chorus up` (3 replicas) on ports it picks, drives replica 0 with
# `redis-benchmark -t <test> -c <clients>`, samples replica 0 with `perf record --call-graph
# dwarf` for <seconds>, and writes DIR/profile-<protocol>-<test>-c<clients>.txt: the share of
# samples in the kernel vs user space, the top functions by self time, and the top Chorus
# functions including their callees. Installs linux-perf and redis-tools with apt-get when
# missing (as root).
set -euo pipefail
cd "$(dirname "$0")/.."

protocol=hermes clients=64 test=set seconds=5 out=docs/benchmarks
while [ $# -gt 0 ]; do
  case "$1" in
    --protocol) protocol=$2; shift 2 ;;
    --clients) clients=$2; shift 2 ;;
    --test) test=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "scripts/profile.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

need() {
  command -v "$1" >/dev/null && return
  if [ "$(id -u)" != 0 ]; then
    echo "scripts/profile.sh: $1 is missing; install package $2 (needs root)" >&2
    exit 1
  fi
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2") >/dev/null
}
need perf linux-perf
need redis-benchmark redis-tools

cargo build --release --quiet -p chorus
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
data=$(mktemp -d /dev/shm/chorus-profile-XXXXXX)
target/release/chorus up --protocol "$protocol" --port "$port" --peer-port $((port + 10)) \
  --data-dir "$data" >"$data/up.log" 2>&1 &
up=$!
trap 'kill $up 2>/dev/null; wait $up 2>/dev/null; rm -rf "$data"' EXIT
for _ in $(seq 100); do
  grep -q "Ctrl-C stops" "$data/up.log" 2>/dev/null && break
  sleep 0.1
done
node=$(pgrep -f "$data/node-0.toml")

redis-benchmark -p "$port" -c "$clients" -n 100000000 -t "$test" -r 100000 -q >/dev/null 2>&1 &
load=$!
sleep 1
perf record --call-graph dwarf,16384 -p "$node" -o "$data/perf.data" -- sleep "$seconds" 2>/dev/null
kill $load 2>/dev/null || true

mkdir -p "$out"
set +o pipefail # `head` closes the pipes early on purpose
report="$out/profile-$protocol-$test-c$clients.txt"
{
  echo "# scripts/profile.sh --protocol $protocol --test $test --clients $clients --seconds $seconds"
  echo "# $(date -u +%FT%TZ), $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg)"
  echo
  echo "## Samples by binary (kernel vs Chorus vs libc)"
  perf report -i "$data/perf.data" --no-children --sort dso --stdio -g none 2>/dev/null | grep '%' | head -6
  echo
  echo "## Top functions by self time"
  perf report -i "$data/perf.data" --no-children --sort symbol --stdio -g none 2>/dev/null | grep '%' | head -30
  echo
  echo "## Chorus functions including callees"
  perf report -i "$data/perf.data" --children --sort symbol --stdio -g none 2>/dev/null \
    | grep '%' | grep -E 'chorus_' | head -25
} | sed 's/[[:space:]]*$//' >"$report"
echo "wrote $report"
