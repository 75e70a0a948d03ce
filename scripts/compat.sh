#!/usr/bin/env bash
# How much of a real client's own test suite passes against Chorus.
#
# Fetches redis-py's source distribution from PyPI (it ships its tests), runs its
# tests/test_commands.py and tests/test_pubsub.py against a local Redis and then against a
# 3-replica `chorus up`, and prints how many of the tests that pass on Redis also pass on
# Chorus (in all, and per file), with the failures grouped by cause. Results go to --out
# (default bench-results/compat): junit XML of both runs and summary.json.
#
#   scripts/compat.sh [--protocol hermes] [--redis-py 5.2.1] [--out DIR] [--redis-port 6390]
#                     [--chorus-port 7690] [--chorus BINARY] [--reuse-redis]
#                     [--suites "tests/test_commands.py tests/test_pubsub.py"] [-- PYTEST ARGS]
#
# --chorus runs a binary already built (e.g. target/debug/chorus) instead of building the
# release one; --reuse-redis keeps the Redis run of an earlier call in --out (the reference
# does not change between runs). Chorus takes --chorus-port and the two ports after it for
# clients, and the three from --chorus-port + 10 for its peers.
#
# Needs python3 with venv, and redis-server (installed with apt-get when run as root).
set -euo pipefail
cd "$(dirname "$0")/.."

protocol=hermes
redis_py=5.2.1
out=bench-results/compat
redis_port=6390
chorus_port=7690
chorus=
reuse_redis=0
suites="tests/test_commands.py tests/test_pubsub.py"
pytest_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --protocol) protocol=$2; shift 2 ;;
    --redis-py) redis_py=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --redis-port) redis_port=$2; shift 2 ;;
    --chorus-port) chorus_port=$2; shift 2 ;;
    --chorus) chorus=$(realpath "$2"); shift 2 ;;
    --reuse-redis) reuse_redis=1; shift ;;
    --suites) suites=$2; shift 2 ;;
    --) shift; pytest_args=("$@"); break ;;
    *) echo "scripts/compat.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

say() { echo "compat: $*" >&2; }

if ! command -v redis-server >/dev/null; then
  if [ "$(id -u)" = 0 ]; then
    say "installing redis-server (the reference the suite is counted against)"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server) >/dev/null
  else
    say "redis-server is missing and this is not root: install it (apt-get install redis-server)"
    exit 1
  fi
fi

mkdir -p target/compat "$out"
cache=$(realpath target/compat)
src="$cache/redis-$redis_py"
if [ ! -d "$src/tests" ]; then
  say "fetching redis-py $redis_py's source distribution from PyPI"
  python3 -m pip download --quiet --no-deps --no-binary :all: --dest "$cache" "redis==$redis_py"
  tar -xzf "$cache/redis-$redis_py.tar.gz" -C "$cache"
fi
venv="$cache/venv"
# Checked by importing, not by the script's presence: a venv copied from elsewhere keeps
# scripts whose #! names the old path.
if ! "$venv/bin/python" -c "import pytest, packaging, pytest_timeout" 2>/dev/null; then
  say "creating a virtualenv with pytest in $venv"
  python3 -m venv "$venv"
  # test_pubsub.py marks tests with pytest-timeout's timeouts.
  "$venv/bin/pip" install --quiet pytest packaging pytest-timeout
fi
out=$(realpath "$out")

if [ -z "$chorus" ]; then
  say "building chorus (release)"
  cargo build --release --locked -p chorus >/dev/null 2>&1 || cargo build --release --locked -p chorus
  chorus=$(realpath target/release/chorus)
fi

pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT

wait_for_port() {
  for _ in $(seq 1 200); do
    if redis-cli -p "$1" ping >/dev/null 2>&1; then return 0; fi
    sleep 0.1
  done
  say "nothing answers PING on port $1"; return 1
}

# The suite imports `redis` from the source tree it ships with, so it runs from there.
run_suite() { # name port
  # shellcheck disable=SC2086 # $suites is a list of files
  (cd "$src" && "$venv/bin/python" -m pytest $suites -q -p no:cacheprovider \
      --redis-url="redis://127.0.0.1:$2/0" --junitxml="$out/$1.xml" "${pytest_args[@]}" \
      >"$out/$1.log" 2>&1) || true
  say "$1: $(tail -n 1 "$out/$1.log")"
}

if [ "$reuse_redis" = 1 ] && [ -f "$out/redis.xml" ]; then
  say "redis: reusing $out/redis.xml"
else
  say "redis-server on port $redis_port"
  redis-server --port "$redis_port" --dir "$out" --save "" --appendonly no --daemonize no >"$out/redis-server.log" 2>&1 &
  pids+=($!)
  wait_for_port "$redis_port"
  run_suite redis "$redis_port"
fi

say "chorus up --protocol $protocol on ports $chorus_port-$((chorus_port + 2))"
"$chorus" up --in-memory --protocol "$protocol" --port "$chorus_port" --peer-port "$((chorus_port + 10))" >"$out/chorus-up.log" 2>&1 &
pids+=($!)
wait_for_port "$chorus_port"
run_suite chorus "$chorus_port"

"$venv/bin/python" - "$out" "$protocol" "$redis_py" "$suites" <<'PY'
import collections, json, re, sys
import xml.etree.ElementTree as ET

out, protocol, redis_py, suites = sys.argv[1:5]

def results(path):
    """test id -> (outcome, first line of the failure message)"""
    tests = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                outcome = tag
                message = (node.get("message") or node.text or "").strip().splitlines()
                message = message[0] if message else ""
                break
        tests[name] = (outcome, message)
    return tests

def cause(message):
    """Groups failures: the server's error with names and numbers kept, values dropped."""
    found = re.search(r"unknown command '([^']+)'", message, re.I)
    if found:
        return f"unknown command {found.group(1).upper()}"
    found = re.search(r"(ResponseError|ConnectionError|TimeoutError|DataError): (.*)", message)
    if found:
        return f"{found.group(1)}: {found.group(2)[:80]}"
    return re.sub(r"\d+", "N", message)[:100] or "(no message)"

def outcomes_of(name):
    """test id -> (outcome, message) for one run; a run whose conftest failed left no XML,
    and every test then fails with the suite's last line as its cause."""
    try:
        tests = results(f"{out}/{name}.xml")
    except FileNotFoundError:
        lines = open(f"{out}/{name}.log").read().strip().splitlines() or ["no output"]
        print(f"the suite did not start against {name}: {lines[-1]}")
        return {}, ("error", f"suite did not start: {lines[-1]}")
    return tests, ("missing", "not run")

redis, _ = outcomes_of("redis")
chorus, chorus_default = outcomes_of("chorus")
reference = sorted(t for t, (outcome, _) in redis.items() if outcome == "passed")
on_chorus = lambda test: chorus.get(test, chorus_default)
passed = [t for t in reference if on_chorus(t)[0] == "passed"]
causes = collections.Counter(
    cause(on_chorus(t)[1]) for t in reference if t not in passed)
def suite_of(test):
    """tests.test_pubsub.TestX::test_y -> test_pubsub"""
    return test.split("::")[0].split(".")[1] if "." in test else test

per_suite = {}
for test in reference:
    counts = per_suite.setdefault(suite_of(test), {"passed_on_redis": 0, "passed_on_chorus": 0})
    counts["passed_on_redis"] += 1
    counts["passed_on_chorus"] += test in passed
summary = {
    "suite": f"redis-py {redis_py} {suites}",
    "per_suite": per_suite,
    "protocol": protocol,
    "passed_on_redis": len(reference),
    "passed_on_chorus": len(passed),
    "ratio": round(len(passed) / max(1, len(reference)), 4),
    "failure_causes": dict(causes.most_common()),
}
with open(f"{out}/summary.json", "w") as f:
    json.dump(summary, f, indent=2)
print(f"{len(passed)} of the {len(reference)} tests that pass on Redis pass on Chorus "
      f"({100 * summary['ratio']:.1f}%), protocol {protocol}")
for suite, counts in sorted(per_suite.items()):
    print(f"  {suite}: {counts['passed_on_chorus']} of {counts['passed_on_redis']}")
print("failures by cause:")
for text, count in causes.most_common(40):
    print(f"  {count:4}  {text}")
print(json.dumps({k: summary[k] for k in ("protocol", "passed_on_redis", "passed_on_chorus", "ratio")}))
PY
