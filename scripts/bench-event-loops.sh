#!/usr/bin/env bash
# Event loops per node (issue 23 point 4): SET and GET throughput, p50/p99/p99.9 and server
# CPU per operation (user + system of every server process, over the run) at 64 clients for
# a 3-replica Hermes `chorus up --in-memory` with 1, then N event loops per node, beside one
# unreplicated Redis, in alternating rounds. Prints the ratios of N loops to 1 loop.
#
#   scripts/bench-event-loops.sh [ROUNDS] [LOOPS] [OUT.json]   # default 2, 2, target/bench-event-loops.json
#
# Uses target/release/chorus (CHORUS=...) and its `bench kv` load generator, redis-server.
set -euo pipefail
rounds=${1:-2}
loops=${2:-2}
out=${3:-target/bench-event-loops.json}
chorus=${CHORUS:-target/release/chorus}
port=${PORT:-26379}
seconds=${SECONDS_PER_POINT:-6}
# shellcheck source=scripts/bench-common.sh
source "$(dirname "$0")/bench-common.sh"

results=()
point() { # label targets pids...
    local label=$1 targets=$2
    shift 2
    for ratio in 1.0 0.0; do
        kv_point "$chorus" "$ratio" 64 "$targets" "$@"
        echo "$label $op ops/s $rps p50 $p50 p99 $p99 p99.9 $p999 cpu_us_op $us_op" >&2
        results+=("{\"system\":\"$label\",\"op\":\"$op\",\"ops_per_s\":$rps,\"p50_us\":$p50,\"p99_us\":$p99,\"p999_us\":$p999,\"cpu_us_per_op\":$us_op}")
    done
}

targets="127.0.0.1:$port,127.0.0.1:$((port + 1)),127.0.0.1:$((port + 2))"
for round in $(seq "$rounds"); do
    for n in 1 "$loops"; do
        "$chorus" up --in-memory --protocol hermes --event-loops "$n" --port "$port" --peer-port $((port + 100)) \
            >/dev/null 2>&1 &
        up=$!
        pids+=("$up")
        wait_operational "$port"
        sleep 1
        # shellcheck disable=SC2046
        point "hermes-loops$n" "$targets" $(pgrep -P "$up")
        stop "$up"
    done
    start_redis $((port + 50))
    point redis "127.0.0.1:$((port + 50))" "$redis"
    stop "$redis"
    echo "round $round done" >&2
done

mkdir -p "$(dirname "$out")"
(IFS=,; echo "[${results[*]}]") >"$out"
echo "wrote $out" >&2
# Medians over rounds, and N loops against 1 loop and against Redis.
python3 - "$out" "$loops" <<'EOF'
import json, statistics, sys
rows = json.load(open(sys.argv[1]))
loops = sys.argv[2]
def med(system, op, field):
    return statistics.median(r[field] for r in rows if r["system"] == system and r["op"] == op)
for op in ("SET", "GET"):
    for field in ("ops_per_s", "p99_us", "p999_us", "cpu_us_per_op"):
        one, many, redis = (med(s, op, field) for s in ("hermes-loops1", f"hermes-loops{loops}", "redis"))
        print(f"{op} {field}: 1 loop {one:.1f}, {loops} loops {many:.1f} ({many / one:.2f}x), redis {redis:.1f}")
EOF
