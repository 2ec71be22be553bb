#!/usr/bin/env bash
# Issue 18's benchmark, by hand (not a test): Debian's perftest over the drop-in libibverbs
# against `rdma-perf` on the same software HCA, alternating runs (library first), two loopback
# addresses:
#   lat: `ib_send_lat -s 8 -n N`  vs `rdma-perf send-lat -s 8 -n N`   (t_typical, us; goal <= 1.05x)
#   bw:  `ib_write_bw -s 65536 -n NB` vs `rdma-perf write-bw -s 65536 -n NB` (BW average; goal >= 0.95x)
# Each run also prints counts that do not depend on the machine's load: the client's and the
# server's voluntary / involuntary context switches (getrusage through /usr/bin/time, all threads)
# and, with `perf` present, their system calls by kind (perf stat tracepoints), per iteration.
#
# usage: tests/bench/abi_vs_rdma_perf.sh [lat|bw|both] [ROUNDS]
# env:   N (lat iterations, 10000), NB (bw iterations, 20000),
#        LIB_DIR (a directory holding libibverbs.so.1; default: target/release/abi-lib, linked to
#        the release build), PERF (rdma-perf; default target/release/rdma-perf),
#        LIBENV (extra environment of the library's processes, e.g. "SOFT_HCA_SHARE=0
#        SOFT_HCA_PROGRESS=caller"), PERFENV (likewise for rdma-perf), A1 / A2 (the addresses,
#        127.0.0.181 / 127.0.0.182), COUNT=0 (no perf stat: it costs a little time itself),
#        KEEP=DIR (keep every run's output there, e.g. SOFT_HCA_STATS=1's counters).
# Build first: cargo build --release -p ibverbs-abi && cargo build --release -p hca --bin rdma-perf
# Figures taken while other work runs mislead: print `uptime` beside them (the script does).
set -uo pipefail

what=${1:-both}
ROUNDS=${2:-3}
N=${N:-10000}
NB=${NB:-20000}
A1=${A1:-127.0.0.181}
A2=${A2:-127.0.0.182}
COUNT=${COUNT:-1}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
PERF=${PERF:-$TARGET/release/rdma-perf}
if [ -z "${LIB_DIR:-}" ]; then
    LIB_DIR=$TARGET/release/abi-lib
    mkdir -p "$LIB_DIR" && ln -sf ../libibverbs.so "$LIB_DIR/libibverbs.so.1"
fi
for f in "$PERF" "$LIB_DIR/libibverbs.so.1"; do
    [ -e "$f" ] || { echo "missing $f (build first: see the header)" >&2; exit 2; }
done
command -v ib_send_lat >/dev/null || { echo "perftest is not installed (apt-get install perftest)" >&2; exit 2; }
EVENTS=syscalls:sys_enter_recvmmsg,syscalls:sys_enter_recvmsg,syscalls:sys_enter_sendmmsg,syscalls:sys_enter_sched_yield,syscalls:sys_enter_poll,syscalls:sys_enter_ppoll,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_futex,raw_syscalls:sys_enter
if [ "$COUNT" = 1 ] && ! perf stat -e "$EVENTS" -- true >/dev/null 2>&1; then
    echo "(perf stat with syscall tracepoints unavailable: no system call counts)" >&2
    COUNT=0
fi
if [ -n "${KEEP:-}" ]; then
    WORK=$KEEP && mkdir -p "$WORK"
    trap 'kill $(jobs -p) 2>/dev/null' EXIT
else
    WORK=$(mktemp -d)
    trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$WORK"' EXIT
fi

# run NAME ITERS SERVER-CMD... -- CLIENT-CMD...: runs both, prints the figure and the counts.
wrap() { # wrap OUT-PREFIX CMD...: the command under /usr/bin/time (and perf stat)
    local out=$1; shift
    if [ "$COUNT" = 1 ]; then
        /usr/bin/time -f "%w %c" -o "$out.time" perf stat -x, -o "$out.perf" -e "$EVENTS" -- "$@"
    else
        /usr/bin/time -f "%w %c" -o "$out.time" "$@"
    fi
}

counts() { # counts OUT-PREFIX ITERS: "vol/it invol/it syscalls/it (kinds)"
    local out=$1 it=$2
    read -r vol invol < <(tail -1 "$out.time")
    awk -v vol="$vol" -v invol="$invol" -v it="$it" -F, '
        BEGIN { printf "csw %.3f/%.3f", vol / it, invol / it }
        $3 ~ /sys_enter/ { n = $3; sub(/.*sys_enter_?/, "", n); if (n == "") n = "all";
                           c[n] = $1 }
        END { if ("all" in c) { printf " sys %.2f:", c["all"] / it;
                  for (k in c) if (k != "all" && c[k] > 0) printf " %s %.2f", k, c[k] / it } }' \
        "$out.perf" 2>/dev/null || printf "csw %s/%s" "$vol" "$invol"
}

one() { # one lib|perf lat|bw ROUND
    local who=$1 kind=$2 round=$3 port=$((19000 + RANDOM % 2000))
    local out=$WORK/$who-$kind-$round it srv cli
    local libenv=(env LD_LIBRARY_PATH="$LIB_DIR" ${LIBENV:-})
    local perfenv=(env ${PERFENV:-})
    if [ "$kind" = lat ]; then it=$N; else it=$NB; fi
    case $who-$kind in
    lib-lat)
        srv=("${libenv[@]}" ROCE_DEVICES=rxe0=udp:$A1 ib_send_lat -d rxe0 -x 0 -s 8 -n "$it" -p "$port")
        cli=("${libenv[@]}" ROCE_DEVICES=rxe0=udp:$A2 ib_send_lat -d rxe0 -x 0 -s 8 -n "$it" -p "$port" "$A1") ;;
    perf-lat)
        srv=("${perfenv[@]}" "$PERF" send-lat --link udp:$A1 -s 8 -n "$it" -p "$port")
        cli=("${perfenv[@]}" "$PERF" send-lat --link udp:$A2 -s 8 -n "$it" -p "$port" "$A1") ;;
    lib-bw)
        srv=("${libenv[@]}" ROCE_DEVICES=rxe0=udp:$A1 ib_write_bw -d rxe0 -x 0 -s 65536 -n "$it" -p "$port")
        cli=("${libenv[@]}" ROCE_DEVICES=rxe0=udp:$A2 ib_write_bw -d rxe0 -x 0 -s 65536 -n "$it" -p "$port" "$A1") ;;
    perf-bw)
        srv=("${perfenv[@]}" "$PERF" write-bw --link udp:$A1 -s 65536 -n "$it" -p "$port")
        cli=("${perfenv[@]}" "$PERF" write-bw --link udp:$A2 -s 65536 -n "$it" -p "$port" "$A1") ;;
    esac
    wrap "$out.srv" timeout 120 "${srv[@]}" >"$out.srv.log" 2>&1 &
    local spid=$!
    sleep 0.5
    wrap "$out.cli" timeout 120 "${cli[@]}" >"$out.cli.log" 2>&1
    local rc=$?
    wait $spid
    local src=$?
    local fig
    if [ "$kind" = lat ]; then
        # perftest's and rdma-perf's columns: bytes iterations t_min t_max t_typical ...
        fig=$(awk '$1 ~ /^[0-9]+$/ && NF >= 5 && $2 ~ /^[0-9]+$/ { print "t_typical " $5 " us, t_max " $4 " us" }' "$out.cli.log" | head -1)
    else
        fig=$(awk '$1 ~ /^[0-9]+$/ && NF >= 5 && $2 ~ /^[0-9]+$/ { print "BW average " $4 " MB/s (peak " $3 ")" }' "$out.cli.log" | head -1)
    fi
    printf '%-5s %-3s run %s rc %s/%s: %s\n' "$who" "$kind" "$round" "$rc" "$src" "${fig:-no result}"
    printf '        client %s\n        server %s\n' "$(counts "$out.cli" "$it")" "$(counts "$out.srv" "$it")"
    if [ "$rc" != 0 ] || [ "$src" != 0 ]; then
        tail -5 "$out.cli.log" "$out.srv.log" | sed 's/^/        | /'
    fi
}

echo "load before: $(uptime)"
echo "library: $LIB_DIR/libibverbs.so.1 ${LIBENV:-}; rdma-perf: $PERF ${PERFENV:-}"
echo "counts per iteration: csw = voluntary/involuntary context switches, sys = system calls"
for r in $(seq 1 "$ROUNDS"); do
    if [ "$what" = lat ] || [ "$what" = both ]; then one lib lat "$r"; one perf lat "$r"; fi
done
for r in $(seq 1 "$ROUNDS"); do
    if [ "$what" = bw ] || [ "$what" = both ]; then one lib bw "$r"; one perf bw "$r"; fi
done
echo "load after: $(uptime)"
