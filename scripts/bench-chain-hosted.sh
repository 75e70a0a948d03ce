#!/usr/bin/env bash
# The chain store's members in the nodes' event loops vs on group hosts (issue 17 point 5):
# SET throughput, p50/p99 and *user* CPU per SET of each role, for a 3-replica `chorus up
# --protocol chain` (clients at the head only, so the other nodes do replication work only),
# first with the members in the event loops, then with `--datapath user`, in alternating
# rounds. "replica" = the two non-head nodes plus, when hosted, all three group hosts (the
# head's host applies the head member's operations). Prints the hosted / event-loop ratios.
#
#   scripts/bench-chain-hosted.sh [ROUNDS] [OUT.json]   # default 2, target/bench-chain-hosted.json
#
# Uses target/release/chorus (CHORUS=...) and its `bench kv` load generator.
set -euo pipefail
rounds=${1:-2}
out=${2:-target/bench-chain-hosted.json}
chorus=${CHORUS:-target/release/chorus}
port=${PORT:-24500}
seconds=${SECONDS_PER_POINT:-6}
clients=${CLIENTS:-16}
hz=$(getconf CLK_TCK)
dir=$(mktemp -d /dev/shm/chorus-bench-chain-XXXXXX)
up_pid=""
cleanup() {
    if [ -n "$up_pid" ]; then kill "$up_pid" 2>/dev/null || true; wait "$up_pid" 2>/dev/null || true; fi
    rm -rf "$dir"
}
trap cleanup EXIT

user_ticks() { # pids... -> utime, in clock ticks
    local total=0
    for pid in "$@"; do
        read -r -a stat <"/proc/$pid/stat"
        total=$((total + stat[13]))
    done
    echo "$total"
}
node_pid() { redis-cli -p "$1" info server | tr -d '\r' | sed -n 's/^process_id://p'; }
host_pid() { pgrep -f "group-host --listen 127.0.0.1:$1 " | head -1; }

results=()
for round in $(seq "$rounds"); do
    for mode in event-loop hosted; do
        rm -rf "$dir/cluster"
        extra=()
        if [ "$mode" = hosted ]; then extra=(--datapath user --group-host-port $((port + 200))); fi
        "$chorus" up --protocol chain --data-dir "$dir/cluster" --port "$port" --peer-port $((port + 100)) \
            "${extra[@]}" >/dev/null 2>&1 &
        up_pid=$!
        for _ in $(seq 100); do
            redis-cli -p $((port + 2)) info 2>/dev/null | grep -q "chorus_operational:1" && break
            sleep 0.2
        done
        head=$(node_pid "$port")
        others=("$(node_pid $((port + 1)))" "$(node_pid $((port + 2)))")
        hosts=()
        if [ "$mode" = hosted ]; then
            for i in 0 1 2; do hosts+=("$(host_pid $((port + 200 + i)))"); done
        fi
        b_head=$(user_ticks "$head"); b_others=$(user_ticks "${others[@]}")
        b_hosts=$( [ ${#hosts[@]} -gt 0 ] && user_ticks "${hosts[@]}" || echo 0)
        line=$("$chorus" bench kv --write-ratio 1.0 --keys 1000 --distribution uniform --clients "$clients" \
            --ops 100000000 --duration-s "$seconds" --targets "127.0.0.1:$port" 2>&1 | grep -E '^SET ')
        a_head=$(user_ticks "$head"); a_others=$(user_ticks "${others[@]}")
        a_hosts=$( [ ${#hosts[@]} -gt 0 ] && user_ticks "${hosts[@]}" || echo 0)
        read -r _ count _ rps p50 _ p99 _ _ <<<"$line"
        echo "ticks: head $((a_head - b_head)) others $((a_others - b_others)) hosts $((a_hosts - b_hosts)) (${hosts[*]})" >&2
        us() { awk -v t="$1" -v hz="$hz" -v n="$count" 'BEGIN { printf "%.2f", t * 1e6 / hz / n }'; }
        head_us=$(us $((a_head - b_head)))
        others_us=$(us $((a_others - b_others)))
        hosts_us=$(us $((a_hosts - b_hosts)))
        replica_us=$(us $((a_others - b_others + a_hosts - b_hosts)))
        echo "round $round $mode: SET ops/s $rps p50 $p50 p99 $p99 user CPU us/op: head node $head_us," \
            "other nodes $others_us, hosts $hosts_us, replica $replica_us" >&2
        results+=("{\"round\":$round,\"mode\":\"$mode\",\"ops_per_s\":$rps,\"p50_us\":$p50,\"p99_us\":$p99,\"head_node_user_cpu_us_per_op\":$head_us,\"other_nodes_user_cpu_us_per_op\":$others_us,\"hosts_user_cpu_us_per_op\":$hosts_us,\"replica_user_cpu_us_per_op\":$replica_us}")
        kill "$up_pid"; wait "$up_pid" 2>/dev/null || true; up_pid=""
    done
done
mkdir -p "$(dirname "$out")"
printf '[%s]\n' "$(IFS=,; echo "${results[*]}")" >"$out"
jq -r '
  def med: sort | if length % 2 == 1 then .[length / 2 | floor] else (.[length / 2 - 1] + .[length / 2]) / 2 end;
  def m(mode; f): [.[] | select(.mode == mode) | f] | med;
  "median over rounds (busy machine): hosted / event-loop:",
  "  SET ops/s \(m("hosted"; .ops_per_s) / m("event-loop"; .ops_per_s) * 100 | round / 100)x",
  "  p99 \(m("hosted"; .p99_us) / m("event-loop"; .p99_us) * 100 | round / 100)x",
  "  head node user CPU/op \(m("hosted"; .head_node_user_cpu_us_per_op)) vs \(m("event-loop"; .head_node_user_cpu_us_per_op)) us",
  "  other nodes user CPU/op \(m("hosted"; .other_nodes_user_cpu_us_per_op)) vs \(m("event-loop"; .other_nodes_user_cpu_us_per_op)) us",
  "  replica user CPU/op (other nodes + hosts) \(m("hosted"; .replica_user_cpu_us_per_op)) vs \(m("event-loop"; .replica_user_cpu_us_per_op)) us"
' "$out"
echo "saved $out"
