#!/usr/bin/env bash
# Show unchanged Redis tools against a local Chorus cluster: redis-cli, redis-benchmark and
# redis-py. Installs redis-tools with apt-get when missing and redis-py into a throwaway venv.
#
#   scripts/tools-demo.sh            # builds chorus (release), starts `chorus up`, runs the tools
#   PORT=7379 scripts/tools-demo.sh  # base RESP port (replica i serves on PORT+i)
set -euo pipefail

PORT="${PORT:-7379}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"

if ! command -v redis-cli >/dev/null || ! command -v redis-benchmark >/dev/null; then
    echo "== installing redis-tools"
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq && $SUDO apt-get install -y -qq redis-tools
fi

echo "== building chorus"
cargo build --release -q -p chorus
CHORUS="${CARGO_TARGET_DIR:-$ROOT/target}/release/chorus"

"$CHORUS" up --in-memory --replicas 3 --port "$PORT" &
UP_PID=$!
trap 'kill -TERM $UP_PID 2>/dev/null; wait $UP_PID 2>/dev/null || true' EXIT
for i in 0 1 2; do
    # Serving needs peer links and a membership lease, which INFO reports.
    until redis-cli -p $((PORT + i)) info replication 2>/dev/null | grep -q chorus_operational:1; do sleep 0.1; done
done

echo "== redis-cli"
set -x
redis-cli -p "$PORT" set k v
redis-cli -p $((PORT + 2)) get k
redis-cli -p $((PORT + 1)) incr counter
redis-cli -p "$PORT" cas k v w
redis-cli -p $((PORT + 2)) hset h field value
redis-cli -p "$PORT" hgetall h
redis-cli -p "$PORT" info replication
set +x

echo "== redis-benchmark"
redis-benchmark -p "$PORT" -t set,get,incr -P 16 -c 50 -n 100000 -r 100000 -q

echo "== redis-py"
VENV="$(mktemp -d)/venv"
python3 -m venv "$VENV"
"$VENV/bin/pip" install -q redis
PORT="$PORT" "$VENV/bin/python" - <<'PY'
import os
import redis

port = int(os.environ["PORT"])
for protocol in (2, 3):
    a = redis.Redis(port=port, protocol=protocol, decode_responses=True)
    c = redis.Redis(port=port + 2, protocol=protocol, decode_responses=True)
    assert a.set("py", "hello") and c.get("py") == "hello"
    assert c.incrby("py-counter", 5) >= 5
    a.hset("py-hash", mapping={"a": "1", "b": "2"})
    assert c.hgetall("py-hash") == {"a": "1", "b": "2"}
    swapped, previous = a.execute_command("CAS", "py", "hello", "world")
    pipe = a.pipeline(transaction=False)
    for _ in range(5):
        pipe.incr("py-pipelined")
    print(f"RESP{protocol}: CAS -> {swapped} (was {previous!r}), pipeline -> {pipe.execute()}")
    a.delete("py", "py-counter", "py-hash", "py-pipelined")
print("redis-py OK")
PY
