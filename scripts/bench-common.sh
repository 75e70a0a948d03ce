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

operational() { # port
    redis-cli -p "$1" info 2>/dev/null | grep -q "chorus_operational:1"
}
