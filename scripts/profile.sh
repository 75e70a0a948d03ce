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
#
# Before sampling it measures the cost per operation over the same load: `perf stat` of
# task-clock, context switches and system calls of *all three* replicas for <seconds>,
# divided by the commands the replicas served meanwhile (INFO total_commands_processed), and
# after sampling it sorts replica 0's samples into kernel TCP, scheduling, tokio, the key
# table, allocation and so on: the table docs/benchmarks.md quotes ("Cost per operation").
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

if [ "$test" = get ]; then # GETs of keys that exist
  redis-benchmark -p "$port" -c 64 -n 200000 -t set -r 100000 -q >/dev/null 2>&1
fi
redis-benchmark -p "$port" -c "$clients" -n 100000000 -t "$test" -r 100000 -q >/dev/null 2>&1 &
load=$!
sleep 1
nodes=$(pgrep -f "$data/node-" | paste -sd,)
commands() {
  local total=0 p
  for p in $port $((port + 1)) $((port + 2)); do
    total=$((total + $(redis-cli -p "$p" info stats | tr -d '\r' | sed -n 's/^total_commands_processed://p')))
  done
  echo "$total"
}
before=$(commands)
perf stat -x, -e task-clock,context-switches,raw_syscalls:sys_enter -p "$nodes" -o "$data/stat.csv" -- sleep "$seconds"
after=$(commands)
perf record --call-graph dwarf,16384 -p "$node" -o "$data/perf.data" -- sleep "$seconds" 2>/dev/null
kill $load 2>/dev/null || true

mkdir -p "$out"
set +o pipefail # `head` closes the pipes early on purpose
report="$out/profile-$protocol-$test-c$clients.txt"
{
  echo "# scripts/profile.sh --protocol $protocol --test $test --clients $clients --seconds $seconds"
  echo "# $(date -u +%FT%TZ), $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg)"
  echo
  echo "## Cost per operation, all 3 replicas ($((after - before)) commands in $seconds s)"
  python3 - "$data/stat.csv" "$((after - before))" "$seconds" <<'PY'
import sys
ops = max(int(sys.argv[2]), 1)
stat = {}
for line in open(sys.argv[1]):
    fields = line.strip().split(",")
    if len(fields) > 3 and fields[0] and fields[0][0].isdigit():
        stat[fields[2]] = float(fields[0])
print(f"commands/s           {ops / float(sys.argv[3]):.0f}")
print(f"server CPU us/op     {stat.get('task-clock', 0) * 1000 / ops:.1f}")
print(f"system calls/op      {stat.get('raw_syscalls:sys_enter', 0) / ops:.2f}")
print(f"context switches/op  {stat.get('context-switches', 0) / ops:.2f}")
PY
  echo
  echo "## Replica 0's samples by category (self time)"
  perf report -i "$data/perf.data" --no-children --sort symbol --stdio -g none --percent-limit 0 2>/dev/null \
    | grep '%' | python3 -c '
import collections, sys
rules = [
    ("kernel: scheduling", lambda s: s.startswith("[k]") and any(w in s for w in ("finish_task_switch", "schedule", "__switch", "pick_next", "enqueue", "dequeue"))),
    ("kernel: epoll", lambda s: s.startswith("[k]") and ("epoll" in s or " ep_" in s)),
    ("kernel: TCP, syscalls, rest", lambda s: s.startswith("[k]")),
    ("tokio / mio (tasks, timers, I/O driver)", lambda s: "tokio" in s or "mio::" in s),
    ("key table (hash probe, key compare)", lambda s: "hashbrown" in s or "memcmp" in s),
    ("malloc / free", lambda s: any(w in s for w in ("malloc", "free", "realloc"))),
    ("memcpy", lambda s: "memmove" in s or "memcpy" in s),
    ("server: event loop", lambda s: "chorus_server::engine" in s),
    ("server: connections, RESP", lambda s: "chorus_server" in s),
    ("protocol core (+ membership)", lambda s: "chorus_hermes" in s or "chorus_membership" in s or "chorus_craq" in s or "chorus_zab" in s or "chorus_raftlog" in s),
    ("peer transport, codec", lambda s: "chorus_net" in s or "codec" in s),
    ("Bytes reference counts", lambda s: "bytes::" in s),
    ("other user space", lambda s: True),
]
shares = collections.Counter()
for line in sys.stdin:
    percent, _, symbol = line.strip().partition("%")
    try:
        value = float(percent)
    except ValueError:
        continue
    symbol = symbol.strip()
    shares[next(name for name, match in rules if match(symbol))] += value
for name, value in shares.most_common():
    print(f"{value:5.1f}%  {name}")
'
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
