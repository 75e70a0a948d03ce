# Helpers shared by the shell benchmarks (scripts/bench-event-loops.sh, scripts/bench-hotpath.sh);
# sourced, not run. Every process a benchmark starts goes into `pids` and is stopped on exit.
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT

cpu_ticks() { # pids... -> utime + stime, in clock ticks
    local total=0
    for pid in "$@"; do
        read -r -a stat <"/proc/$pid/stat"
        total=$((total + stat[13] + stat[14]))
    done
    echo "$total"
}

cpu_ticks_split() { # pids... -> "utime stime", in clock ticks
    local user=0 system=0
    for pid in "$@"; do
        read -r -a stat <"/proc/$pid/stat"
        user=$((user + stat[13]))
        system=$((system + stat[14]))
    done
    echo "$user $system"
}

info_field() { # PORT FIELD: the value of one INFO field of the node on PORT (0 when absent)
    redis-cli -p "$1" info 2>/dev/null | tr -d '\r' | awk -F: -v f="$2" '$1 == f { v = $2 } END { print v == "" ? 0 : v }'
}

operational() { # port
    redis-cli -p "$1" info 2>/dev/null | grep -q "chorus_operational:1"
}

wait_operational() { # port: until the replicas on port, port+1 and port+2 all serve (30 s at most)
    for _ in $(seq 300); do
        operational "$1" && operational $(($1 + 1)) && operational $(($1 + 2)) && return 0
        sleep 0.1
    done
}

# One point: `CHORUS bench kv` with write ratio RATIO and CLIENTS closed-loop clients for
# $seconds against TARGETS, measuring the CPU of the server PIDS over it. Sets op, count,
# rps, p50, p99, p999 (from the load generator's line), us_op (server CPU per operation) and
# its user and kernel parts, user_us_op and sys_us_op.
kv_point() { # CHORUS RATIO CLIENTS TARGETS PIDS...
    local chorus=$1 ratio=$2 clients=$3 targets=$4 before after line split_before split_after
    shift 4
    split_before=$(cpu_ticks_split "$@")
    before=$(cpu_ticks "$@")
    line=$("$chorus" bench kv --write-ratio "$ratio" --keys 10000 --distribution uniform --clients "$clients" \
        --ops 100000000 --duration-s "$seconds" --targets "$targets" 2>&1 | grep -E '^(SET|GET) ')
    after=$(cpu_ticks "$@")
    split_after=$(cpu_ticks_split "$@")
    # operation count errors ops/s p50 p95 p99 p99.9 max
    read -r op count _ rps p50 _ p99 p999 _ <<<"$line"
    us_op=$(awk -v t=$((after - before)) -v hz="$(getconf CLK_TCK)" -v n="$count" \
        'BEGIN { printf "%.1f", t * 1e6 / hz / n }')
    read -r user_us_op sys_us_op < <(awk -v b="$split_before" -v a="$split_after" -v hz="$(getconf CLK_TCK)" \
        -v n="$count" 'BEGIN { split(b, x, " "); split(a, y, " ");
            printf "%.1f %.1f\n", (y[1] - x[1]) * 1e6 / hz / n, (y[2] - x[2]) * 1e6 / hz / n }')
}

start_redis() { # PORT: an unreplicated Redis without persistence; sets `redis` to its pid
    redis-server --port "$1" --save "" --appendonly no >/dev/null 2>&1 &
    redis=$!
    pids+=("$redis")
    sleep 0.5
}

stop() { # PID SIGNAL: stop a process this script started and reap it
    kill "-${2:-TERM}" "$1" 2>/dev/null || true
    wait "$1" || true
}
