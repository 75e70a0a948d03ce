#!/usr/bin/env bash
# Lease health under a saturating redis-benchmark, with and without the transport's
# priority lane (docs/benchmarks.md, "Membership under load"). Starts a 3-node Hermes
# cluster with `chorus up`, saturates every node for DURATION seconds, then prints each
# node's lease lapses and heartbeat round trips from INFO.
#
#   scripts/lease-under-load.sh [on|off] [DURATION] [CLIENTS] [PIPELINE]
set -euo pipefail
lane=${1:-on}
duration=${2:-15}
clients=${3:-200}
pipeline=${4:-16}
port=${PORT:-27379}
chorus=${CHORUS:-target/release/chorus}
dir=$(mktemp -d /tmp/chorus-lease-XXXX)
CHORUS_PRIORITY_LANE=$lane "$chorus" up --replicas 3 --port "$port" --data-dir "$dir" >"$dir/up.out" 2>&1 &
up=$!
trap 'kill $up 2>/dev/null; wait $up 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 100); do grep -q "replicas up" "$dir/up.out" && break; sleep 0.1; done
pids=()
for i in 0 1 2; do
  redis-benchmark -p $((port + i)) -c "$clients" -P "$pipeline" -n 100000000 -r 100000 -t set,get -q \
    >/dev/null 2>&1 &
  pids+=($!)
done
sleep "$duration"
ops=0
for i in 0 1 2; do
  n=$(redis-cli -p $((port + i)) INFO stats | tr -d '\r' | awk -F: '/^total_commands_processed/ {print $2}')
  ops=$((ops + n))
done
kill "${pids[@]}" 2>/dev/null || true
wait "${pids[@]}" 2>/dev/null || true
echo "priority_lane=$lane duration_s=$duration clients_per_node=$clients pipeline=$pipeline commands=$ops"
for i in 0 1 2; do
  redis-cli -p $((port + i)) INFO stats | tr -d '\r' \
    | grep -E 'membership_(lease_lapses|heartbeats_acknowledged|heartbeats_slow|heartbeat_round_trip_max_us|epoch)' \
    | tr '\n' ' ' | sed "s/^/node $i: /"
  echo
done
