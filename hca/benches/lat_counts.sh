#!/usr/bin/env bash
# Counts per round trip of the small-message step (issue 21), which unlike times do not depend on
# the machine's other load: `rdma-perf send-lat -s 8` (each end's system calls by kind, receive
# calls that returned data, sched_yield(2), context switches and CPU time; runs of N1 and N2
# round trips differenced, so set-up and tear-down drop out) against busy-polling
# `sockperf ping-pong --nonblocked -m 14 --mps max` (the client's counts per message sent), as
# hca/benches/udp.sh compares their times. Counted with `perf stat` on the kernel's system-call
# tracepoints (syscalls:sys_enter_*, and sys_exit_* with `ret > 0` for calls that returned
# data), which cost far less than strace(1) and do not slow the loop into other behaviour.
#
# Usage: hca/benches/lat_counts.sh                 (root, or perf_event_paranoid <= 1, for the
#        tracepoints; installs nothing: needs perf and, for its row, sockperf)
#   N1=2000 N2=10000 SECS=3 (sockperf run)  PIN=0,1 (server on CPU 0, client on CPU 1; PIN=0,0
#   both on CPU 0; unset: unpinned)  BINS="path/a path/b" (rdma-perf builds to compare, each
#   its own rows; default target/release/rdma-perf, built if missing).
# The t_typical / median columns are times: read them only from a quiet machine (the load
# average is printed).
set -euo pipefail

N1=${N1:-2000}
N2=${N2:-10000}
SECS=${SECS:-3}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
WORK=$(mktemp -d)
SPID=
cleanup() {
    [ -n "$SPID" ] && kill "$SPID" 2>/dev/null || true
    kill $(jobs -p) 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

if ! command -v perf >/dev/null; then
    echo "perf is missing (apt-get install linux-perf)" >&2
    exit 1
fi
if ! perf stat -e raw_syscalls:sys_enter true >/dev/null 2>&1; then
    echo "perf cannot read the system-call tracepoints here (root, or perf_event_paranoid <= 1)" >&2
    exit 1
fi
if [ -z "${BINS:-}" ]; then
    (cd "$ROOT" && cargo build --release -q -p hca --bin rdma-perf)
    BINS=$TARGET/release/rdma-perf
fi
SRV=()
CLI=()
if [ -n "${PIN:-}" ]; then
    SRV=(taskset -c "${PIN%,*}")
    CLI=(taskset -c "${PIN#*,}")
fi

# In this order; "ok" rows count the calls that returned data.
NAMES=(all sched_yield sendmmsg sendmsg sendto recvmmsg recvmsg recvfrom recvmmsg_ok recvmsg_ok
    recvfrom_ok context_switches task_clock_ms)
EV=(-e raw_syscalls:sys_enter -e syscalls:sys_enter_sched_yield -e syscalls:sys_enter_sendmmsg
    -e syscalls:sys_enter_sendmsg -e syscalls:sys_enter_sendto -e syscalls:sys_enter_recvmmsg
    -e syscalls:sys_enter_recvmsg -e syscalls:sys_enter_recvfrom
    -e syscalls:sys_exit_recvmmsg --filter 'ret > 0' -e syscalls:sys_exit_recvmsg --filter 'ret > 0'
    -e syscalls:sys_exit_recvfrom --filter 'ret > 0' -e context-switches -e task-clock)

# perf stat -x, output -> one value per line, in EV's order.
values() { grep -v '^#' "$1" | grep -v '^$' | cut -d, -f1; }

send_lat() { # bin iters tag: counts of both ends in $WORK/tag.{srv,cli}
    local port=$((20000 + RANDOM % 30000))
    "${SRV[@]}" perf stat -x, "${EV[@]}" -o "$WORK/$3.srv" "$1" send-lat --link udp:127.0.47.1 \
        -p $port --timeout 60 -s 8 -n "$2" >"$WORK/$3.srv.out" 2>&1 &
    local spid=$!
    sleep 0.5
    "${CLI[@]}" perf stat -x, "${EV[@]}" -o "$WORK/$3.cli" "$1" send-lat --link udp:127.0.47.2 \
        -p $port --timeout 60 -s 8 -n "$2" 127.0.0.1 >"$WORK/$3.cli.out" 2>&1
    wait $spid
}

# Per round trip: (run N2 - run N1) / (N2 - N1), one column per counter.
diff_row() { # tagA tagB side
    paste -d' ' <(values "$WORK/$1.$3") <(values "$WORK/$2.$3") |
        awk -v d=$((N2 - N1)) '{ printf " %8.2f", ($2 - $1) / d }'
}

header() {
    printf "%-34s" "$1"
    for n in "${NAMES[@]}"; do printf " %8.8s" "$n"; done
    printf " %9s\n" "$2"
}

echo "# load average before: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) CPUs; pinning: ${PIN:-none}"
echo "# counts per round trip (task_clock_ms: CPU ms per round trip), each end; N1=$N1 N2=$N2"
header "" "t_typical"
i=0
for bin in $BINS; do
    i=$((i + 1))
    send_lat "$bin" "$N1" "a$i"
    send_lat "$bin" "$N2" "b$i"
    lat=$(awk '/#bytes/ {h=1; next} h && NF > 1 {print $5; exit}' "$WORK/b$i.cli.out")
    for side in cli srv; do
        printf "%-34s" "rdma-perf#$i $side"
        diff_row "a$i" "b$i" $side
        printf " %9s\n" "${lat}us"
    done
done
for i in $(seq "$(echo "$BINS" | wc -w)"); do echo "# rdma-perf#$i: $(echo "$BINS" | cut -d' ' -f"$i")"; done

if command -v sockperf >/dev/null; then
    port=$((20000 + RANDOM % 30000))
    "${SRV[@]}" sockperf server -i 127.0.47.1 -p $port --nonblocked >/dev/null 2>&1 &
    SPID=$!
    sleep 0.5
    "${CLI[@]}" perf stat -x, "${EV[@]}" -o "$WORK/sock.cli" sockperf ping-pong -i 127.0.47.1 \
        -p $port -m 14 --mps max -t "$SECS" --nonblocked >"$WORK/sock.out" 2>&1
    kill "$SPID" 2>/dev/null || true
    wait "$SPID" 2>/dev/null || true
    SPID=
    sent=$(sed -n 's/.*SentMessages=\([0-9]*\).*/\1/p' "$WORK/sock.out" | head -1)
    med=$(awk '/percentile 50.000/ {print $NF}' "$WORK/sock.out")
    if [ -n "$sent" ] && [ "$sent" -gt 0 ]; then
        printf "%-34s" "sockperf --nonblocked cli"
        values "$WORK/sock.cli" | awk -v m="$sent" '{ printf " %8.2f", $1 / m }'
        printf " %9s\n" "${med}us"
        echo "# sockperf: per message sent ($sent), whole client run"
    else
        echo "sockperf run failed:" >&2
        tail -5 "$WORK/sock.out" >&2
    fi
else
    echo "# sockperf not installed: its row is left out (hca/benches/udp.sh installs it)"
fi
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
