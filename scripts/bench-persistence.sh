#!/usr/bin/env bash
# What persistence costs (issue 24 point 5, partly): SET throughput and p50/p99 at 1 and 64
# clients for a 3-replica Hermes `chorus up` with appendfsync always, everysec and off
# (appendonly no), on a real file system (a directory under /var/tmp, not /dev/shm), beside
# one Redis with appendonly yes + appendfsync always. Raftlog, etcd and Redis' WAITAOF are
# not in this run (docs/benchmarks.md, "Persistence").
#
#   scripts/bench-persistence.sh [REQUESTS] [OUT.json]     # default 20000, target/bench-persistence.json
#
# Uses target/debug/chorus (the dev profile is optimized) and redis-benchmark/redis-server.
set -euo pipefail
requests=${1:-20000}
out=${2:-target/bench-persistence.json}
chorus=${CHORUS:-target/debug/chorus}
port=${PORT:-21379}
scratch=$(mktemp -d /var/tmp/chorus-bench-persistence.XXXXXX)
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
    rm -rf "$scratch"
}
trap cleanup EXIT

# One redis-benchmark run: prints "rps p50_ms p99_ms".
measure() { # port clients
    redis-benchmark -p "$1" -t set -n "$requests" -c "$2" -r 100000 -d 64 --csv 2>/dev/null |
        awk -F, 'NR == 2 { gsub(/"/, ""); print $2, $5, $7 }'
}

wait_port() {
    for _ in $(seq 200); do
        redis-cli -p "$1" ping >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    echo "nothing answers on port $1" >&2
    exit 1
}

results=()
run_chorus() { # label appendonly appendfsync
    "$chorus" up --replicas 3 --port "$port" --peer-port $((port + 10)) --data-dir "$scratch/$1" \
        --appendonly "$2" --appendfsync "$3" >"$scratch/$1.out" 2>&1 &
    local pid=$!
    pids+=("$pid")
    until grep -q "replicas up" "$scratch/$1.out" 2>/dev/null; do sleep 0.2; done
    for clients in 1 64; do
        read -r rps p50 p99 < <(measure "$port" "$clients")
        echo "hermes $1, $clients clients: $rps SET/s, p50 $p50 ms, p99 $p99 ms"
        results+=("{\"system\":\"hermes\",\"persistence\":\"$1\",\"clients\":$clients,\"rps\":$rps,\"p50_ms\":$p50,\"p99_ms\":$p99}")
    done
    kill "$pid"; wait "$pid" 2>/dev/null || true
}

run_chorus always yes always
run_chorus everysec yes everysec
run_chorus off no always

mkdir -p "$scratch/redis"
redis-server --port $((port + 50)) --dir "$scratch/redis" --appendonly yes --appendfsync always \
    --save "" --daemonize no >"$scratch/redis.out" 2>&1 &
pids+=($!)
wait_port $((port + 50))
for clients in 1 64; do
    read -r rps p50 p99 < <(measure $((port + 50)) "$clients")
    echo "redis appendfsync always, $clients clients: $rps SET/s, p50 $p50 ms, p99 $p99 ms"
    results+=("{\"system\":\"redis\",\"persistence\":\"always\",\"clients\":$clients,\"rps\":$rps,\"p50_ms\":$p50,\"p99_ms\":$p99}")
done

mkdir -p "$(dirname "$out")"
(IFS=,; echo "[${results[*]}]") >"$out"
echo "saved $out"
python3 - "$out" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))
rps = {(r["system"], r["persistence"], r["clients"]): r["rps"] for r in rows}
for clients in (1, 64):
    off = rps[("hermes", "off", clients)]
    for mode in ("always", "everysec"):
        print(f"{clients} clients: hermes {mode} / off = {rps[('hermes', mode, clients)] / off:.2f}")
    print(f"{clients} clients: hermes always / redis always = {rps[('hermes', 'always', clients)] / rps[('redis', 'always', clients)]:.2f}")
PY
