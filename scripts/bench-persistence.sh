#!/usr/bin/env bash
# What persistence costs (issue 24 point 5), in one run on a real file system (a directory under
# /var/tmp, or BENCH_DIR; never /dev/shm): SET throughput and p50/p99/p99.9 at 1 and 64 closed-loop
# clients for
#   * Hermes, 3 replicas (`chorus up`), with appendfsync always, everysec and appendonly no;
#   * raftlog, 3 replicas, with its circular log msynced every turn (its only durable mode: it
#     has no everysec) and with raftlog_flush none;
#   * Redis 7.2, a primary with two replicas, appendonly yes + appendfsync always on all three,
#     every SET followed by WAITAOF 1 2 0 (on the primary's disk and both replicas' before the
#     client goes on), and the primary alone with appendfsync always and no WAITAOF;
#   * etcd, 3 members, driven through gRPC by etcd's own benchmark tool (`put`), which fsyncs
#     its WAL before every commit (it has no setting to do otherwise but --unsafe-no-fsync).
# It prints each system's configuration first. The RESP systems are driven by `chorus bench kv`
# (--write-ratio 1, 64-byte values, 10,000 keys), the same load generator for all of them;
# only its SET line is read (a WAITAOF's time counts in its SET's latency).
#
#   scripts/bench-persistence.sh [SECONDS] [OUT.json]   # 10 s per point; target/bench-persistence.json
#
# VALUE_BYTES=256 sets the value size for every system (default 64); SYSTEMS="raftlog etcd"
# runs only those of hermes, raftlog, redis and etcd (default all four). RAFTLOG_ARGS="--raftlog-logs 1"
# adds `chorus up` arguments to both raftlog runs. CLIENTS_AT=leader sends every client to one
# node, as Cyclone's clients send to the leader: raftlog's with every log led by one node
# (--raftlog-leaders together) and its clients there, etcd's at its leader (default: all,
# the clients spread over the three nodes, which forward writes to their leaders).
#
# Uses target/debug/chorus (the dev profile is optimized; CHORUS=... for another binary),
# redis-server 7.2 or later (REDIS_SERVER=path; Debian 12's 7.0 has no WAITAOF and is
# refused), etcd and the etcd benchmark tool (built once by `chorus bench compare`, or
# CHORUS_ETCD_BENCHMARK=path). PORT=... picks the first of the ports it uses (+0..+40, +50..+52,
# +60..+65), by default a free run below the ephemeral range.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-10}
out=${2:-target/bench-persistence.json}
value_bytes=${VALUE_BYTES:-64}
clients_at=${CLIENTS_AT:-all}
case "$clients_at" in
all | leader) ;;
*) echo "CLIENTS_AT must be all or leader, not $clients_at" >&2; exit 1 ;;
esac
read -r -a raftlog_args <<<"${RAFTLOG_ARGS:-}"
systems=" ${SYSTEMS:-hermes raftlog redis etcd} "
runs() { [[ "$systems" == *" $1 "* ]]; }
chorus=${CHORUS:-target/debug/chorus}
source scripts/bench-common.sh

# WAITAOF needs Redis 7.2 or later (Debian 12 ships 7.0): REDIS_SERVER=path picks a build.
redis_server=${REDIS_SERVER:-redis-server}
runs redis && case "$("$redis_server" --version | awk '{ print $3 }')" in
v=[0-6].* | v=7.[01].*)
    echo "bench-persistence: $("$redis_server" --version | awk '{ print $3 }') has no WAITAOF (7.2+);" \
        "build one and set REDIS_SERVER (docs/benchmarks.md, 'Persistence')" >&2
    exit 1
    ;;
esac

free_port_run() { # a base port with the next 70 free, below Linux's ephemeral range
    local base
    for _ in $(seq 50); do
        base=$((10000 + RANDOM % 22000))
        if ! ss -Htan | awk '{ print $4 }' | grep -qE ":($(seq -s '|' "$base" $((base + 70))))$"; then
            echo "$base"
            return
        fi
    done
    echo "no free port run found" >&2
    exit 1
}
port=${PORT:-$(free_port_run)}
scratch=$(mktemp -d "${BENCH_DIR:-/var/tmp}/chorus-bench-persistence.XXXXXX")
trap 'cleanup; rm -rf "$scratch"' EXIT
fs=$(df --output=fstype "$scratch" | tail -n 1)
if [ "$fs" = tmpfs ]; then
    echo "$scratch is on tmpfs: persistence must be measured on a real file system (set BENCH_DIR)" >&2
    exit 1
fi
etcd_tool=${CHORUS_ETCD_BENCHMARK:-$HOME/.cache/chorus-bench/etcd-benchmark-v3.5.11}

echo "# $(date -u +%FT%TZ), $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# data in $scratch ($fs on $(df --output=source "$scratch" | tail -n 1)), $seconds s per point," \
    "values of $value_bytes bytes, clients at $clients_at nodes"
results=()
record() { # system mode clients rps p50_us p99_us p999_us
    echo "$1 $2, $3 clients: $4 SET/s, p50 $5 us, p99 $6 us, p99.9 $7 us"
    results+=("{\"system\":\"$1\",\"mode\":\"$2\",\"clients\":$3,\"rps\":$4,\"p50_us\":$5,\"p99_us\":$6,\"p999_us\":$7}")
}

set_point() { # clients targets bench-kv-args...: SETs of $value_bytes for $seconds; sets rps, p50, p99, p999 (us)
    local clients=$1 targets=$2 line
    shift 2
    local output errors
    output=$("$chorus" bench kv --write-ratio 1 --keys 10000 --distribution uniform --value-bytes "$value_bytes" \
        --clients "$clients" --ops 100000000 --duration-s "$seconds" --skip-load --targets "$targets" "$@" \
        2>&1 || true)
    line=$(grep -E '^SET ' <<<"$output" || true)
    # operation count errors ops/s p50 p95 p99 p99.9 max
    read -r _ _ errors rps p50 _ p99 p999 _ <<<"${line:-SET 0 0 0 0 0 0 0 0}"
    if [ "${errors:-0}" != 0 ]; then
        # A point whose commands failed measured nothing: say so instead of recording it.
        echo "bench-persistence: $errors errors at $clients clients ($(grep -m1 'first error' <<<"$output"))" >&2
        exit 1
    fi
}

set_points() { # system mode targets [bench-kv-args...]: SET at 1 and 64 clients
    local system=$1 mode=$2 targets=$3
    shift 3
    for clients in 1 64; do
        set_point "$clients" "$targets" "$@"
        record "$system" "$mode" "$clients" "$rps" "$p50" "$p99" "$p999"
    done
}

run_chorus() { # protocol mode chorus-up-args...
    local protocol=$1 mode=$2 dir="$scratch/$1-$2" targets
    shift 2
    "$chorus" up --protocol "$protocol" --replicas 3 --port "$port" --peer-port $((port + 10)) \
        --meta-port $((port + 20)) --group-host-port $((port + 30)) --data-dir "$dir" "$@" \
        >"$dir.out" 2>&1 &
    local up=$!
    pids+=("$up")
    until grep -q "replicas up" "$dir.out" 2>/dev/null; do
        kill -0 "$up" 2>/dev/null || { cat "$dir.out" >&2; exit 1; }
        sleep 0.2
    done
    wait_operational "$port"
    echo "## $protocol $mode: chorus up $*"
    grep -hE '^(appendonly|appendfsync|raftlog_flush|protocol) ' "$dir"/node-0.toml | sed 's/^/##   /'
    targets="127.0.0.1:$port,127.0.0.1:$((port + 1)),127.0.0.1:$((port + 2))"
    if [ "$clients_at" = leader ] && [ "$protocol" = raftlog ]; then
        # Elections favour node 0, but another node may win the first ones (it started sooner)
        # and keeps them: the clients go to the node that leads while the others lead nothing.
        local leader="" led i
        for _ in $(seq 150); do
            led=("$(info_field "$port" raftlog_logs_led)" "$(info_field $((port + 1)) raftlog_logs_led)"
                "$(info_field $((port + 2)) raftlog_logs_led)")
            for i in 0 1 2; do
                [ "${led[i]}" -gt 0 ] && [ $((led[0] + led[1] + led[2])) = "${led[i]}" ] && leader=$i
            done
            [ -n "$leader" ] && break
            sleep 0.2
        done
        [ -n "$leader" ] || { echo "bench-persistence: no raftlog node leads every log" >&2; exit 1; }
        targets="127.0.0.1:$((port + leader))"
        echo "##   clients at node $leader, which leads ${led[leader]} logs (the others lead none)"
    fi
    set_points "$protocol" "$mode" "$targets"
    stop "$up"
}

if runs hermes; then
    run_chorus hermes always --appendonly yes --appendfsync always
    run_chorus hermes everysec --appendonly yes --appendfsync everysec
    run_chorus hermes off --appendonly no
fi
if runs raftlog; then
    leaders=()
    [ "$clients_at" = leader ] && leaders=(--raftlog-leaders together)
    run_chorus raftlog always --raftlog-flush msync "${leaders[@]}" "${raftlog_args[@]}"
    run_chorus raftlog off --raftlog-flush none "${leaders[@]}" "${raftlog_args[@]}"
fi

run_redis() {
# Redis: a primary and two replicas, every one with appendonly yes + appendfsync always.
redis_port=$((port + 50))
redis_pids=()
for i in 0 1 2; do
    mkdir -p "$scratch/redis-$i"
    replica_of=()
    [ "$i" -gt 0 ] && replica_of=(--replicaof 127.0.0.1 "$redis_port")
    "$redis_server" --port $((redis_port + i)) --dir "$scratch/redis-$i" --appendonly yes \
        --appendfsync always --save "" "${replica_of[@]}" --daemonize no >"$scratch/redis-$i.out" 2>&1 &
    redis_pids+=($!)
    pids+=($!)
done
for _ in $(seq 100); do
    [ "$(redis-cli -p "$redis_port" info replication | grep -c '^slave[0-9]*:.*state=online')" = 2 ] && break
    sleep 0.1
done
echo "## redis $("$redis_server" --version | awk '{ print $3 }'): a primary and 2 replicas"
for i in 0 1 2; do
    echo "##   :$((redis_port + i)) $(redis-cli -p $((redis_port + i)) info replication | grep '^role:' | tr -d '\r')," \
        "$(redis-cli -p $((redis_port + i)) config get appendonly | tr '\n' ' ')" \
        "$(redis-cli -p $((redis_port + i)) config get appendfsync | tr '\n' ' ')"
done
echo "##   waitaof: every SET followed by WAITAOF 1 2 0 (this disk and both replicas' disks)"
set_points redis waitaof "127.0.0.1:$redis_port" --wait-replicas 2 --waitaof-local 1 --wait-timeout-ms 0
set_points redis always "127.0.0.1:$redis_port"
for pid in "${redis_pids[@]}"; do stop "$pid"; done
}
if runs redis; then run_redis; fi

run_etcd() {
# etcd: 3 members; its WAL is fsynced before every commit.
etcd_client=$((port + 60))
cluster=""
for i in 0 1 2; do cluster+="${cluster:+,}m$i=http://127.0.0.1:$((etcd_client + 3 + i))"; done
etcd_pids=()
for i in 0 1 2; do
    etcd --name "m$i" --data-dir "$scratch/etcd-$i" \
        --listen-client-urls "http://127.0.0.1:$((etcd_client + i))" \
        --advertise-client-urls "http://127.0.0.1:$((etcd_client + i))" \
        --listen-peer-urls "http://127.0.0.1:$((etcd_client + 3 + i))" \
        --initial-advertise-peer-urls "http://127.0.0.1:$((etcd_client + 3 + i))" \
        --initial-cluster "$cluster" --initial-cluster-state new --initial-cluster-token "bench-$$" \
        --logger zap --log-level warn >"$scratch/etcd-$i.out" 2>&1 &
    etcd_pids+=($!)
    pids+=($!)
done
endpoints="127.0.0.1:$etcd_client,127.0.0.1:$((etcd_client + 1)),127.0.0.1:$((etcd_client + 2))"
for _ in $(seq 100); do
    ETCDCTL_API=3 etcdctl --endpoints="$endpoints" endpoint health >/dev/null 2>&1 && break
    sleep 0.2
done
if [ "$clients_at" = leader ]; then
    # The member whose status says it is the leader (etcdctl's table: IS LEADER is column 5).
    endpoints=$(ETCDCTL_API=3 etcdctl --endpoints="$endpoints" endpoint status 2>/dev/null |
        awk -F', ' '$5 == "true" { print $1 }')
    [ -n "$endpoints" ] || { echo "bench-persistence: etcd has no leader" >&2; exit 1; }
    echo "## etcd clients at its leader, $endpoints"
fi
echo "## etcd $(etcd --version | awk '/etcd Version/ { print $3 }'): 3 members, default settings" \
    "(WAL fsync per commit, --snapshot-count 100000); etcd's benchmark tool over gRPC, one connection per client"
for clients in 1 64; do
    # Requests for about $seconds: a short run sizes it.
    probe=$("$etcd_tool" --endpoints="$endpoints" --clients="$clients" --conns="$clients" put --key-size=16 \
        --val-size="$value_bytes" --key-space-size=10000 --total=$((clients * 20)) 2>/dev/null | awk '/Requests\/sec/ { print $2 }')
    total=$(awk -v r="${probe:-100}" -v s="$seconds" -v c="$clients" 'BEGIN { t = int(r * s); if (t < 20 * c) t = 20 * c; print t }')
    summary=$("$etcd_tool" --endpoints="$endpoints" --clients="$clients" --conns="$clients" --precise put \
        --key-size=16 --val-size="$value_bytes" --key-space-size=10000 --total="$total" 2>/dev/null)
    rps=$(awk '/Requests\/sec/ { printf "%.0f", $2 }' <<<"$summary")
    p50=$(awk '$1 == "50%" { printf "%.0f", $3 * 1e6 }' <<<"$summary")
    p99=$(awk '$1 == "99%" { printf "%.0f", $3 * 1e6 }' <<<"$summary")
    p999=$(awk '$1 == "99.9%" { printf "%.0f", $3 * 1e6 }' <<<"$summary")
    record etcd always "$clients" "$rps" "$p50" "$p99" "${p999:-0}"
done
for pid in "${etcd_pids[@]}"; do stop "$pid"; done
}
if runs etcd; then run_etcd; fi

mkdir -p "$(dirname "$out")"
(IFS=,; echo "[${results[*]}]") >"$out"
echo "saved $out"
python3 - "$out" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))
rps = {(r["system"], r["mode"], r["clients"]): r["rps"] for r in rows}
p99 = {(r["system"], r["mode"], r["clients"]): r["p99_us"] for r in rows}
p999 = {(r["system"], r["mode"], r["clients"]): r.get("p999_us", 0) for r in rows}
def ratio(a, b):
    return f"{rps[a] / rps[b]:.2f}" if rps.get(a) and rps.get(b) else "n/a"
for clients in (1, 64):
    print(f"{clients} clients: hermes always/off {ratio(('hermes', 'always', clients), ('hermes', 'off', clients))}, "
          f"everysec/off {ratio(('hermes', 'everysec', clients), ('hermes', 'off', clients))}, "
          f"raftlog always/off {ratio(('raftlog', 'always', clients), ('raftlog', 'off', clients))}, "
          f"hermes always / redis waitaof {ratio(('hermes', 'always', clients), ('redis', 'waitaof', clients))}, "
          f"hermes always / etcd {ratio(('hermes', 'always', clients), ('etcd', 'always', clients))}, "
          f"raftlog always / etcd {ratio(('raftlog', 'always', clients), ('etcd', 'always', clients))}"
          + (f" (p99 {p99[('raftlog', 'always', clients)] / p99[('etcd', 'always', clients)]:.2f}x"
             + (f", p99.9 {p999[('raftlog', 'always', clients)] / p999[('etcd', 'always', clients)]:.2f}x"
                if p999.get(('raftlog', 'always', clients)) and p999.get(('etcd', 'always', clients)) else "")
             + ")"
             if p99.get(('raftlog', 'always', clients)) and p99.get(('etcd', 'always', clients)) else ""))
PY
