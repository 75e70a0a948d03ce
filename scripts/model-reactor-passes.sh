#!/usr/bin/env bash
# What the real reactor does per pass, next to the model's turns (docs/benchmarks.md, "The
# performance model against real runs", Session 20). Runs one `chorus model compare` row and,
# in the middle of its real run, records the three nodes' reactor threads for a second:
# every `epoll_wait` (one per pass), `sendto` (one per reply or peer frame) and `recvfrom`.
# Prints per pass: client requests read, peer links read, peer frames sent, replies written,
# and the compare row (whose model columns give the model's turns and frames per operation).
#
#   scripts/model-reactor-passes.sh [PROTOCOL] [CLIENTS] [WRITE_PERCENT] [COSTS.json]
#   CHORUS=target/release/chorus OUT=/tmp/passes scripts/model-reactor-passes.sh hermes 64 100
#
# Needs root and perf (linux-perf) with the syscalls tracepoints; replies are told from peer
# frames by size (a reply to SET is 5 bytes: `+OK\r\n`), so use write percent 100 for Hermes.
set -euo pipefail
protocol=${1:-hermes}
clients=${2:-64}
write_percent=${3:-100}
costs=${4:-docs/benchmarks/model/costs-session19-quiet.json}
chorus=${CHORUS:-target/release/chorus}
out=${OUT:-$(mktemp -d)}
if ! command -v perf >/dev/null; then
    echo "skipped: perf is not installed (apt-get install linux-perf)" >&2
    exit 0
fi
mkdir -p "$out"
"$chorus" model compare --costs "$costs" --protocols "$protocol" --clients "$clients" \
    --write-percent "$write_percent" --rounds 1 --seconds 10 --json "$out/compare.json" \
    >"$out/compare.out" 2>&1 &
compare=$!
nodes=""
for _ in $(seq 1 100); do
    nodes=$(pgrep -P "$compare" -d' ' || true)
    [ "$(echo "$nodes" | wc -w)" -ge 3 ] && break
    sleep 0.2
done
sleep 5 # the cluster is up, loaded and the measured run has started
reactors=$(for pid in $nodes; do
    for task in /proc/"$pid"/task/*; do
        [ "$(cat "$task/comm")" = chorus-reactor ] && basename "$task"
    done
done | paste -sd, -)
perf record -q -o "$out/perf.data" -t "$reactors" -e syscalls:sys_enter_epoll_wait \
    -e syscalls:sys_enter_sendto -e syscalls:sys_enter_recvfrom -- sleep 1 2>"$out/perf.err"
wait "$compare"
perf script -i "$out/perf.data" -F tid,event,trace >"$out/script.txt" 2>/dev/null
python3 - "$out/script.txt" <<'PY'
import collections, re, statistics, sys
events = []
client_fds = collections.defaultdict(set)
for line in open(sys.argv[1]):
    m = re.match(r"\s*(\d+)\s+(\S+):\s*(.*)$", line)
    if not m:
        continue
    tid, event, rest = int(m.group(1)), m.group(2), m.group(3)
    fd = re.search(r"fd: (0x[0-9a-f]+)", rest)
    size = re.search(r"len: (0x[0-9a-f]+)", rest)
    fd = int(fd.group(1), 16) if fd else None
    size = int(size.group(1), 16) if size else None
    if event.endswith("sendto") and size == 5:
        client_fds[tid].add(fd)
    events.append((tid, event, fd, size))
current, passes = {}, []
for tid, event, fd, size in events:
    p = current.setdefault(tid, [0, set(), 0, 0])
    if event.endswith("epoll_wait"):
        passes.append((p[0], len(p[1]), p[2], p[3]))
        current[tid] = [0, set(), 0, 0]
    elif event.endswith("recvfrom"):
        if fd in client_fds[tid]:
            p[0] += 1
        else:
            p[1].add(fd)
    elif event.endswith("sendto"):
        if size == 5:
            p[3] += 1
        else:
            p[2] += 1
print(f"passes recorded: {len(passes)} (one second, three reactors)")
for name, i in (("client requests read", 0), ("peer links read", 1), ("peer frames sent", 2), ("replies written", 3)):
    values = [p[i] for p in passes]
    histogram = sorted(collections.Counter(min(v, 25) for v in values).items())
    print(f"{name:>20}: mean {statistics.mean(values):.2f} per pass; histogram {histogram}")
PY
sed -n '/real op/,/JSON/p' "$out/compare.out"
echo "recordings in $out"
