#!/usr/bin/env bash
# The data path's cost per operation (issue 23 points 1-2): SET and GET at 64 clients and at
# 1 client against a 3-replica Hermes `chorus up --in-memory`, for one or more chorus
# binaries (A/B of a change), beside one unreplicated Redis, in alternating rounds. Per point:
# ops/s, p50/p99/p99.9, server CPU us/op (user + system of every server process over the
# point), and with PERF=1 system calls and context switches per operation (perf stat over
# every server process). Prints the medians over rounds and each system's ratio to Redis.
#
#   scripts/bench-hotpath.sh [ROUNDS] [OUT.json]          # default 3, target/bench-hotpath.json
#   BINS="before=/tmp/chorus-a,after=target/release/chorus" scripts/bench-hotpath.sh 3
#
# Uses `chorus bench kv` (of the last binary) as the load generator and redis-server.
set -euo pipefail
rounds=${1:-3}
out=${2:-target/bench-hotpath.json}
bins=${BINS:-chorus=target/release/chorus}
port=${PORT:-26379}
seconds=${SECONDS_PER_POINT:-5}
points=${POINTS:-set64,get64,set1,get1}
IFS=, read -r -a systems <<<"$bins"
load=${systems[-1]#*=}
# shellcheck source=scripts/bench-common.sh
source "$(dirname "$0")/bench-common.sh"

lines=()
point() { # label targets pids...
    local label=$1 targets=$2
    shift 2
    local pidlist
    pidlist=$(IFS=,; echo "$*")
    for p in ${points//,/ }; do
        local ratio=1.0 clients=${p#???}
        [ "${p:0:3}" = get ] && ratio=0.0
        local stat=/tmp/bench-hotpath-stat.$$
        if [ "${PERF:-0}" = 1 ]; then
            perf stat -x, -e context-switches,raw_syscalls:sys_enter -p "$pidlist" -o "$stat" \
                -- sleep "$((seconds - 1))" 2>/dev/null &
            perfpid=$!
        fi
        kv_point "$load" "$ratio" "$clients" "$targets" "$@"
        local cs=null sc=null
        if [ "${PERF:-0}" = 1 ]; then
            wait "$perfpid" || true
            # perf counted over seconds-1 of the point: scale by the point's rate.
            cs=$(awk -F, -v n="$rps" -v s="$((seconds - 1))" '/context-switches/ { printf "%.2f", $1 / (n * s) }' "$stat")
            sc=$(awk -F, -v n="$rps" -v s="$((seconds - 1))" '/sys_enter/ { printf "%.2f", $1 / (n * s) }' "$stat")
            rm -f "$stat"
        fi
        echo "$label ${p} ops/s $rps p50 $p50 p99 $p99 p99.9 $p999 cpu_us_op $us_op (user $user_us_op sys $sys_us_op) syscalls_op $sc cs_op $cs" >&2
        lines+=("{\"system\":\"$label\",\"point\":\"$p\",\"ops_per_s\":$rps,\"p50_us\":$p50,\"p99_us\":$p99,\"p999_us\":$p999,\"cpu_us_per_op\":$us_op,\"user_us_per_op\":$user_us_op,\"sys_us_per_op\":$sys_us_op,\"syscalls_per_op\":$sc,\"context_switches_per_op\":$cs}")
    done
}

targets="127.0.0.1:$port,127.0.0.1:$((port + 1)),127.0.0.1:$((port + 2))"
# A key space that exists, so GETs read values.
for round in $(seq "$rounds"); do
    for system in "${systems[@]}"; do
        label=${system%%=*} chorus=${system#*=}
        "$chorus" up --in-memory --protocol hermes --port "$port" --peer-port $((port + 100)) >/dev/null 2>&1 &
        up=$!
        pids+=("$up")
        wait_operational "$port"
        nodes=$(pgrep -P "$up" || true)
        if ! kill -0 "$up" 2>/dev/null || [ "$(echo "$nodes" | wc -w)" != 3 ]; then
            echo "scripts/bench-hotpath.sh: $label did not start 3 replicas (port $port in use?)" >&2
            exit 1
        fi
        "$load" bench kv --write-ratio 1.0 --keys 10000 --clients 16 --ops 20000 --targets "$targets" >/dev/null 2>&1
        # shellcheck disable=SC2086
        point "$label" "$targets" $nodes
        stop "$up"
    done
    start_redis $((port + 50))
    "$load" bench kv --write-ratio 1.0 --keys 10000 --clients 16 --ops 20000 --targets "127.0.0.1:$((port + 50))" >/dev/null 2>&1
    point redis "127.0.0.1:$((port + 50))" "$redis"
    stop "$redis"
    echo "round $round done (load average $(cut -d' ' -f1-3 /proc/loadavg))" >&2
done

mkdir -p "$(dirname "$out")"
rows=$(mktemp)
printf '%s\n' "${lines[@]}" >"$rows"
python3 - "$rows" "$out" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
keys = ["ops_per_s", "p50_us", "p99_us", "p999_us", "cpu_us_per_op", "user_us_per_op", "sys_us_per_op",
        "syscalls_per_op", "context_switches_per_op"]
groups = {}
for r in rows:
    groups.setdefault((r["system"], r["point"]), []).append(r)
summary = []
for (system, point), rs in groups.items():
    m = {"system": system, "point": point, "rounds": len(rs)}
    for k in keys:
        vals = [r[k] for r in rs if r.get(k) is not None]
        m[k] = statistics.median(vals) if vals else None
    summary.append(m)
load = open("/proc/loadavg").read().split()[:3]
json.dump({"rounds": rows, "medians": summary, "loadavg_at_end": load}, open(sys.argv[2], "w"), indent=1)
redis = {m["point"]: m for m in summary if m["system"] == "redis"}
def fmt(v, f="{:.1f}"):
    return "-" if v is None else f.format(v)
def ratio(m, k):
    r = redis.get(m["point"])
    return fmt(m[k] / r[k], "{:.2f}x") if r and r[k] and m[k] is not None else "-"
print("medians of %d rounds; load average at the end %s" % (max(m["rounds"] for m in summary), " ".join(load)))
print("| point | system | ops/s | p50 us | p99 us | p99.9 us | CPU us/op | user | kernel | syscalls/op | cs/op | ops/s vs redis | p50 vs redis | CPU vs redis |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for m in sorted(summary, key=lambda m: (m["point"], m["system"])):
    print("| %s | %s | %.0f | %.0f | %.0f | %.0f | %s | %s | %s | %s | %s | %s | %s | %s |" % (
        m["point"], m["system"], m["ops_per_s"], m["p50_us"], m["p99_us"], m["p999_us"],
        fmt(m["cpu_us_per_op"]), fmt(m["user_us_per_op"]), fmt(m["sys_us_per_op"]),
        fmt(m["syscalls_per_op"], "{:.2f}"), fmt(m["context_switches_per_op"], "{:.2f}"),
        ratio(m, "ops_per_s"), ratio(m, "p50_us"), ratio(m, "cpu_us_per_op")))
PY
rm -f "$rows"
