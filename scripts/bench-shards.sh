#!/usr/bin/env bash
# Throughput of 1, 2 and 3 replica groups (issue 20 point 6; docs/benchmarks.md, "Scale-out").
#
# For each shard count S: `chorus up --shards S --replicas R --in-memory`, then
# - key balance: KEYS writes of random keys through `redis-cli -c` (which follows MOVED), and
#   each group's DBSIZE afterwards;
# - throughput: redis-benchmark SET and GET with the same total connections; with S > 1 it runs
#   with --cluster (connections spread over the groups' first nodes, each sent keys of its own
#   slots), with S = 1 plainly against node 0;
# - load balance: the commands each group processed (INFO stats, summed over its nodes).
# Saves bench-results/shards.json and prints each S's throughput as a ratio to S = 1.
#
#   scripts/bench-shards.sh [--chorus target/release/chorus] [--replicas 3] [--requests 100000]
#                           [--clients 48] [--keys 3000] [--port 23300] [--shards "1 2 3"]
set -euo pipefail
cd "$(dirname "$0")/.."

chorus=target/release/chorus
replicas=3
requests=100000
clients=48
keys=3000
port=23300
shard_counts="1 2 3"
json=bench-results/shards.json
while [ $# -gt 0 ]; do
  case "$1" in
    --chorus) chorus=$2; shift 2 ;;
    --replicas) replicas=$2; shift 2 ;;
    --requests) requests=$2; shift 2 ;;
    --clients) clients=$2; shift 2 ;;
    --keys) keys=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    --shards) shard_counts=$2; shift 2 ;;
    --json) json=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
for tool in redis-cli redis-benchmark "$chorus"; do
  command -v "$tool" >/dev/null || { echo "bench-shards: $tool is missing (apt-get install redis-tools; cargo build --release)" >&2; exit 2; }
done

up_pid=
stop_up() {
  if [ -n "$up_pid" ]; then
    kill -TERM "$up_pid" 2>/dev/null || true
    wait "$up_pid" 2>/dev/null || true
    up_pid=
  fi
}
trap stop_up EXIT

# The requests per second redis-benchmark reports for one test in --csv mode.
rps() { awk -F'","' -v test="$1" '$1 == "\"" test { print $2 }'; }

results=()
for shards in $shard_counts; do
  nodes=$((shards * replicas))
  out=$(mktemp)
  "$chorus" up --shards "$shards" --replicas "$replicas" --port "$port" --peer-port $((port + nodes)) \
    --in-memory --log-level warn >"$out" 2>&1 &
  up_pid=$!
  for _ in $(seq 1 300); do grep -q "Ctrl-C stops" "$out" && break; sleep 0.1; done
  grep -q "Ctrl-C stops" "$out" || { cat "$out" >&2; exit 1; }
  rm -f "$out"

  cluster_flag=()
  [ "$shards" -gt 1 ] && cluster_flag=(--cluster) && cli_flag=-c || cli_flag=
  # Key balance: random keys through a redirect-following client.
  for _ in $(seq 1 "$keys"); do echo "SET k:$RANDOM$RANDOM 1"; done | redis-cli $cli_flag -p "$port" >/dev/null
  group_keys=()
  for group in $(seq 0 $((shards - 1))); do
    group_keys+=("$(redis-cli -p $((port + group * replicas)) dbsize)")
  done
  csv=$(redis-benchmark "${cluster_flag[@]}" -p "$port" -t set,get -n "$requests" -c "$clients" -r 100000 --csv 2>/dev/null)
  set_rps=$(echo "$csv" | rps SET)
  get_rps=$(echo "$csv" | rps GET)
  group_commands=()
  for group in $(seq 0 $((shards - 1))); do
    first=$((port + group * replicas))
    total=0
    for node in $(seq 0 $((replicas - 1))); do
      count=$(redis-cli -p $((first + node)) info stats | tr -d '\r' | awk -F: '$1 == "total_commands_processed" { print $2 }')
      total=$((total + count))
    done
    group_commands+=("$total")
  done
  stop_up
  join() { local IFS=,; echo "$*"; }
  results+=("{\"shards\": $shards, \"replicas\": $replicas, \"set_rps\": $set_rps, \"get_rps\": $get_rps, \"keys_per_group\": [$(join "${group_keys[@]}")], \"commands_per_group\": [$(join "${group_commands[@]}")]}")
  echo "shards=$shards: SET $set_rps/s GET $get_rps/s keys per group ${group_keys[*]} commands per group ${group_commands[*]}"
done

mkdir -p "$(dirname "$json")"
{
  echo "{\"machine\": \"$(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg) at the end\", \"requests\": $requests, \"clients\": $clients, \"keys\": $keys, \"runs\": ["
  (IFS=$'\n'; echo "${results[*]}" | sed '$!s/$/,/')
  echo "]}"
} >"$json"
echo "saved $json"
python3 - "$json" <<'EOF'
import json, sys
runs = json.load(open(sys.argv[1]))["runs"]
base = runs[0]
for run in runs:
    print(f"shards={run['shards']}: SET x{run['set_rps'] / base['set_rps']:.2f} GET x{run['get_rps'] / base['get_rps']:.2f} "
          f"vs shards={base['shards']}; key share per group "
          + " ".join(f"{k / sum(run['keys_per_group']):.3f}" for k in run['keys_per_group']))
EOF
