#!/usr/bin/env bash
# The per-command cost of raftlog at 1 log and at 8 logs (docs/benchmarks.md, "Where 8 logs
# lose"): what a command costs the three nodes in CPU and in peer messages, which a busy
# machine disturbs far less than raw throughput.
#
#   scripts/bench-raftlog-cost.sh [--rounds 3] [--seconds 4] [--logs "1 8"] [--clients 32]
#                                 [--chorus target/release/chorus] [--node-arg ARG]...
#
# Each round runs every log count back to back: three fresh `chorus node --protocol raftlog`
# processes on 127.0.0.1 (data under /dev/shm, metrics on), driven by
# `chorus bench kv --clients 32 --write-ratio 1 --keys 10000 --value-bytes 64 --distribution uniform`;
# after 1 s of warm-up, for --seconds: `perf stat -e task-clock,context-switches,raw_syscalls:sys_enter`
# of the three nodes, INFO total_commands_processed and raftlog_entries_proposed, and the
# peer counters chorus_peer_messages_sent_total / chorus_peer_frames_sent_total, all divided
# by the commands served. Prints one line per run and the medians per log count. Each
# --node-arg is passed to every node (e.g. --node-arg --raftlog-leaders=together).
#
# The CPU per command is the three processes' utime + stime from /proc over the window (every
# thread's, exited ones too). perf's task-clock is kept as perf_cpu_us/command: perf sometimes
# attaches to fewer than all three nodes, and then counts a third to two thirds of the CPU
# (the void 1.8 or 7.0 us per command of earlier sessions). Such a run is marked perf=short
# and its switches and syscalls per command are left out of the medians.
set -euo pipefail
cd "$(dirname "$0")/.."

rounds=3 seconds=4 logs_list="1 8" clients=32 chorus=target/release/chorus node_args=()
while [ $# -gt 0 ]; do
    case "$1" in
        --rounds) rounds=$2; shift 2 ;;
        --seconds) seconds=$2; shift 2 ;;
        --logs) logs_list=$2; shift 2 ;;
        --clients) clients=$2; shift 2 ;;
        --chorus) chorus=$2; shift 2 ;;
        --node-arg) node_args+=("$2"); shift 2 ;;
        *) echo "scripts/bench-raftlog-cost.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
command -v perf >/dev/null || { echo "scripts/bench-raftlog-cost.sh: needs perf (package linux-perf)" >&2; exit 1; }
[ -x "$chorus" ] || { echo "scripts/bench-raftlog-cost.sh: build $chorus first (cargo build --release -p chorus)" >&2; exit 1; }

source scripts/bench-common.sh
scratch=$(mktemp -d /dev/shm/chorus-raftlog-cost-XXXXXX)
trap 'cleanup; rm -rf "$scratch"' EXIT

free_port_base() { # a base with base..base+8 free
    python3 - <<'PY'
import random, socket
while True:
    base = random.randrange(10000, 32000)
    try:
        socks = []
        for port in range(base, base + 9):
            s = socket.socket(); s.bind(("127.0.0.1", port)); socks.append(s)
        print(base); break
    except OSError:
        pass
    finally:
        for s in socks: s.close()
PY
}

info_sum() { # FIELD PORTS...
    local field=$1 total=0 p
    shift
    for p in "$@"; do
        total=$((total + $(info_field "$p" "$field")))
    done
    echo "$total"
}

metric_sum() { # NAME METRIC_PORTS...
    local name=$1
    shift
    for p in "$@"; do curl -s "127.0.0.1:$p/metrics"; done |
        awk -v name="$name" '$1 ~ "^"name"($|\\{)" { total += $NF } END { printf "%.0f\n", total }'
}

results="$scratch/results"
one_run() { # LOGS ROUND
    local logs=$1 round=$2 base node peers=() client_ports=() metric_ports=() node_pids=()
    base=$(free_port_base)
    for node in 0 1 2; do peers+=(--peer "$node=127.0.0.1:$((base + 3 + node))"); done
    for node in 0 1 2; do
        client_ports+=($((base + node)))
        metric_ports+=($((base + 6 + node)))
        "$chorus" node --node-id "$node" --protocol raftlog --client-addr "127.0.0.1:$((base + node))" \
            --metrics-addr "127.0.0.1:$((base + 6 + node))" --cluster-token bench-raftlog-cost-token-01 \
            --data-dir "$scratch/r$round-l$logs/node-$node" --raftlog-logs "$logs" --log-level warn \
            "${peers[@]}" ${node_args[@]+"${node_args[@]}"} >"$scratch/node-$node.log" 2>&1 &
        node_pids+=($!)
        pids+=($!)
    done
    for port in "${client_ports[@]}"; do
        for _ in $(seq 300); do
            redis-cli -p "$port" set "ready-$port" 1 2>/dev/null | grep -q OK && break
            sleep 0.1
        done
    done
    local targets
    targets=$(printf '127.0.0.1:%s,' "${client_ports[@]}")
    "$chorus" bench kv --clients "$clients" --write-ratio 1 --keys 10000 --value-bytes 64 \
        --distribution uniform --skip-load --ops 1000000000 --duration-s "$(echo "$seconds + 2" | bc)" \
        --targets "${targets%,}" >"$scratch/bench.log" 2>&1 &
    local bench=$!
    pids+=($bench)
    sleep 1
    local c0 e0 m0 f0 c1 e1 m1 f1
    c0=$(info_sum total_commands_processed "${client_ports[@]}")
    e0=$(info_sum raftlog_entries_proposed "${client_ports[@]}")
    m0=$(metric_sum chorus_peer_messages_sent_total "${metric_ports[@]}")
    f0=$(metric_sum chorus_peer_frames_sent_total "${metric_ports[@]}")
    local ticks0 ticks1
    ticks0=$(cpu_ticks "${node_pids[@]}")
    perf stat -x, -e task-clock,context-switches,raw_syscalls:sys_enter \
        -p "$(IFS=,; echo "${node_pids[*]}")" -o "$scratch/stat.csv" -- sleep "$seconds" 2>/dev/null
    c1=$(info_sum total_commands_processed "${client_ports[@]}")
    e1=$(info_sum raftlog_entries_proposed "${client_ports[@]}")
    m1=$(metric_sum chorus_peer_messages_sent_total "${metric_ports[@]}")
    f1=$(metric_sum chorus_peer_frames_sent_total "${metric_ports[@]}")
    ticks1=$(cpu_ticks "${node_pids[@]}")
    wait "$bench" || true
    for pid in "${node_pids[@]}"; do stop "$pid"; done
    rm -rf "$scratch/r$round-l$logs"
    python3 - "$scratch/stat.csv" "$logs" "$round" "$seconds" $((c1 - c0)) $((e1 - e0)) $((m1 - m0)) $((f1 - f0)) \
        "$(cut -d' ' -f1 /proc/loadavg)" $((ticks1 - ticks0)) "$(getconf CLK_TCK)" <<'PY' | tee -a "$results"
import sys
stat_file, logs, rnd, seconds, commands, entries, messages, frames, load, ticks, hz = sys.argv[1:]
stat = {}
for line in open(stat_file):
    fields = line.strip().split(",")
    if len(fields) > 3 and fields[0] and fields[0][0].isdigit():
        stat[fields[2]] = float(fields[0])
n = max(int(commands), 1)
cpu_us = int(ticks) * 1e6 / int(hz) / n
perf_cpu_us = stat.get('task-clock', 0) * 1000 / n  # task-clock is in ms
# perf counted well under the CPU the processes used: it missed a node (its counts are void)
short = perf_cpu_us < 0.8 * cpu_us
counts = "" if short else (f"switches/command={stat.get('context-switches', 0) / n:.2f} "
                           f"syscalls/command={stat.get('raw_syscalls:sys_enter', 0) / n:.2f} ")
print(f"logs={logs} round={rnd} load1={load} commands/s={n / float(seconds):.0f} "
      f"commands/entry={n / max(int(entries), 1):.2f} cpu_us/command={cpu_us:.1f} "
      f"messages/command={int(messages) / n:.2f} frames/command={int(frames) / n:.2f} "
      f"{counts}perf_cpu_us/command={perf_cpu_us:.1f}" + (" perf=short" if short else ""))
PY
}

echo "# scripts/bench-raftlog-cost.sh --rounds $rounds --seconds $seconds --logs \"$logs_list\" --clients $clients ${node_args[*]+--node-arg ${node_args[*]}}"
echo "# $(date -u +%FT%TZ), $(nproc) CPUs, $("$chorus" --version 2>/dev/null || echo chorus)"
for round in $(seq "$rounds"); do
    for logs in $logs_list; do one_run "$logs" "$round"; done
done
echo "# medians over $rounds rounds"
python3 - "$results" <<'PY'
import collections, statistics, sys
runs = collections.defaultdict(lambda: collections.defaultdict(list))
for line in open(sys.argv[1]):
    fields = dict(item.split("=") for item in line.split())
    for key, value in fields.items():
        if key not in ("logs", "round", "perf"):
            runs[int(fields["logs"])][key].append(float(value))
for logs, columns in sorted(runs.items()):
    print(f"logs={logs} " + " ".join(f"{key}={statistics.median(values):g}" for key, values in columns.items()))
PY
