#!/usr/bin/env bash
# Load-independent counts for issue 21 (run by hand, not a test): what one RoCE all-reduce and
# one send-lat round trip cost in system calls and context switches, rather than in time, so
# that the figures mean something on a loaded machine.
#
#   1. coll-perf all-reduce --transport roce, NRANKS ranks, f32 sum, at each of SIZES: system
#      calls per all-reduce per rank (strace -f -c; calls, failed calls such as EAGAIN polls,
#      and the busiest calls), context switches per all-reduce per rank (perf stat -e
#      context-switches, voluntary and involuntary together) and CPU time per all-reduce per
#      rank (task-clock). Each figure is the difference of two runs that differ only in the
#      number of iterations (ITERS_A, ITERS_B), divided by the all-reduces between them (each
#      coll-perf iteration runs two: out of place and in place): setup, connection and
#      teardown cancel out.
#   2. rdma-perf send-lat -s 8 (server + client on 127.0.47.x): system calls and context switches
#      per round trip, both ends together, the same way (-n LAT_A vs -n LAT_B); against the
#      plain nonblocking UDP ping-pong of sockperf --nonblocked, whose per-round-trip work is
#      one sendto(2) and one successful recvfrom(2) at each end (4 calls) plus empty polls.
#
# Busy-polling counts (failed recvmmsg / sched_yield) depend on timing: under strace every call
# is slower, so the *successful* calls are the load-independent figure; the failed ones show how
# often a waiter polled in vain. Usage: collectives/benches/counts.sh   (env: SIZES="4K 1M 16M"
# NRANKS=4 ITERS_A=10 ITERS_B=40 LAT_A=2000 LAT_B=8000 COUNTS_SKIP_LAT=1 COUNTS_SKIP_COLL=1)
set -euo pipefail

SIZES=${SIZES:-4K 1M 16M}
NRANKS=${NRANKS:-4}
ITERS_A=${ITERS_A:-10}
ITERS_B=${ITERS_B:-40}
LAT_A=${LAT_A:-2000}
LAT_B=${LAT_B:-8000}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT

for tool in strace perf python3; do
    command -v $tool >/dev/null || { echo "counts.sh needs $tool" >&2; exit 1; }
done
(cd "$ROOT" && cargo build --release -q -p collectives --bin coll-perf -p hca --bin rdma-perf)
CP=${COLL_PERF:-$TARGET/release/coll-perf}
RP=${RDMA_PERF:-$TARGET/release/rdma-perf}

echo "# $(date -u +%FT%TZ); load before: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) CPUs; $(uname -r)"

# strace -c summary -> "total_calls total_errors name:calls/errors ..." (the 6 busiest).
strace_sum() {
    python3 - "$1" <<'PY'
import sys
rows = {}
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) >= 5 and f[0][0].isdigit() and not line.startswith("100.00"):
        name = f[-1]
        calls = int(f[3])
        errs = int(f[4]) if len(f) == 6 else 0
        rows[name] = (calls, errs)
tc = sum(c for c, _ in rows.values())
te = sum(e for _, e in rows.values())
top = sorted(rows.items(), key=lambda kv: -kv[1][0])[:8]
print(tc, te, " ".join(f"{k}:{c}/{e}" for k, (c, e) in top))
PY
}

# perf stat -> "context_switches task_clock_ms"
perf_sum() {
    awk -F, '$3 == "context-switches" { cs = $1 } $3 == "task-clock" { tc = $1 }
             END { print cs + 0, tc + 0 }' "$1"
}

# diff A B divisor: per-unit figures from two strace summaries / perf lines.
diff_strace() { # fileA fileB units
    python3 - "$1" "$2" "$3" <<'PY'
import sys
def parse(p):
    f = open(p).read().split()
    tot, err = int(f[0]), int(f[1])
    calls = {}
    for kv in f[2:]:
        k, v = kv.split(":")
        c, e = v.split("/")
        calls[k] = (int(c), int(e))
    return tot, err, calls
ta, ea, ca = parse(sys.argv[1]); tb, eb, cb = parse(sys.argv[2]); u = float(sys.argv[3])
names = sorted(set(ca) | set(cb), key=lambda k: -cb.get(k, (0, 0))[0])
det = " ".join(
    f"{k} {(cb.get(k,(0,0))[0]-ca.get(k,(0,0))[0])/u:.1f}"
    f"({(cb.get(k,(0,0))[0]-cb.get(k,(0,0))[1]-ca.get(k,(0,0))[0]+ca.get(k,(0,0))[1])/u:.1f} ok)"
    for k in names[:8])
print(f"syscalls {(tb-ta)/u:.1f} (ok {(tb-eb-ta+ea)/u:.1f}, failed {(eb-ea)/u:.1f}): {det}")
PY
}

coll_run() { # size iters tag
    strace -f -c -o "$WORK/st-$3.txt" "$CP" all-reduce --ranks "$NRANKS" --transport roce \
        -d float -o sum -b "$1" -e "$1" -n "$2" -w 1 -c 0 >/dev/null 2>"$WORK/err-$3.txt"
    strace_sum "$WORK/st-$3.txt" >"$WORK/s-$3"
    perf stat -x, -e context-switches,task-clock -o "$WORK/p-$3.txt" "$CP" all-reduce \
        --ranks "$NRANKS" --transport roce -d float -o sum -b "$1" -e "$1" -n "$2" -w 1 -c 0 \
        >/dev/null 2>>"$WORK/err-$3.txt"
    perf_sum "$WORK/p-$3.txt" >"$WORK/p-$3"
}

if [ "${COUNTS_SKIP_COLL:-0}" != 1 ]; then
    echo "# 1. coll-perf all-reduce --transport roce, $NRANKS ranks, per all-reduce per rank"
    echo "#    (runs of -n $ITERS_A and -n $ITERS_B differenced; COLL_ROCE_PROGRESS=${COLL_ROCE_PROGRESS:-caller})"
    for s in $SIZES; do
        coll_run "$s" "$ITERS_A" a
        coll_run "$s" "$ITERS_B" b
        # Each coll-perf iteration runs two all-reduces: out of place and in place.
        units=$(((ITERS_B - ITERS_A) * NRANKS * 2))
        read -r csa tca <"$WORK/p-a"
        read -r csb tcb <"$WORK/p-b"
        printf '%5s  %s\n' "$s" "$(diff_strace "$WORK/s-a" "$WORK/s-b" "$units")"
        python3 -c "print(f'       context switches {($csb - $csa) / $units:.1f}   CPU time {($tcb - $tca) / $units:.3f} ms')"
    done
fi

# The device's own counters (COLL_ROCE_STATS=1, no strace): sendmmsg(2) calls (tx_calls), receive
# calls that got data (rx_calls), GSO trains and progress rounds, and the transport's waits for
# data (how many found it at the first poll, slept, and the sleeps) and what blocked a sender
# (credit: the slot window; ack: the HCA's window; sq: the send queue), summed over ranks.
stats_run() { # size iters
    COLL_ROCE_STATS=1 "$CP" all-reduce --ranks "$NRANKS" --transport roce -d float -o sum \
        -b "$1" -e "$1" -n "$2" -w 1 -c 0 2>&1 >/dev/null | python3 -c '
import re, sys
t = {"tx_calls": 0, "rx_calls": 0, "tx_gso_trains": 0, "rounds": 0, "inline_rounds": 0, "sent_pkts": 0}
# The wait counters of the transport: waits for data (all, at the first poll, slept, sleeps) and the
# waits for a slot that did not succeed at once, by what blocked them.
w = {"data_waits": 0, "data_at_once": 0, "data_slept": 0, "data_sleeps": 0,
     "blocked_credit": 0, "blocked_ack": 0, "blocked_sq": 0}
for line in sys.stdin:
    for k in t:
        for m in re.finditer(r"\b" + k + r": (\d+)", line):
            t[k] += int(m.group(1))
    m = re.match(r"\s*waits for data \{ (.*) \}", line)
    if m:
        f = dict((k, int(v)) for k, v in re.findall(r"(\w+): (\d+)", m.group(1)))
        for k in ("waits", "at_once", "slept", "sleeps"):
            w["data_" + k] += f.get(k, 0)
    for k in ("blocked_credit", "blocked_ack", "blocked_sq"):
        for m in re.finditer(r"\b" + k + r": (\d+)", line):
            w[k] += int(m.group(1))
t.update(w)
print(" ".join(f"{k}={v}" for k, v in t.items()))'
}

if [ "${COUNTS_SKIP_COLL:-0}" != 1 ]; then
    echo "# 1b. the device counters per all-reduce per rank (COLL_ROCE_STATS=1, no strace)"
    for s in $SIZES; do
        a=$(stats_run "$s" "$ITERS_A")
        b=$(stats_run "$s" "$ITERS_B")
        python3 - "$a" "$b" "$(((ITERS_B - ITERS_A) * NRANKS * 2))" "$s" <<'PY'
import sys
pa = dict(kv.split("=") for kv in sys.argv[1].split())
pb = dict(kv.split("=") for kv in sys.argv[2].split())
u = float(sys.argv[3])
print(f"{sys.argv[4]:>5}  " + "   ".join(f"{k} {(int(pb[k]) - int(pa[k])) / u:.1f}" for k in pa))
PY
    done
fi

lat_pair() { # iters tag wrapper...
    local n=$1 tag=$2
    shift 2
    local port=$((20000 + RANDOM % 30000))
    "$@" -o "$WORK/lat-srv-$tag.txt" "$RP" send-lat --link udp:127.0.47.1 -p $port --timeout 60 \
        -s 8 -n "$n" >/dev/null 2>&1 &
    local spid=$!
    sleep 0.5
    "$@" -o "$WORK/lat-cli-$tag.txt" "$RP" send-lat --link udp:127.0.47.2 -p $port --timeout 60 \
        -s 8 -n "$n" 127.0.0.1 >/dev/null 2>&1
    wait $spid
}

if [ "${COUNTS_SKIP_LAT:-0}" != 1 ]; then
    echo "# 2. rdma-perf send-lat -s 8, per round trip, server and client together"
    for t in a b; do
        n=$LAT_A
        [ $t = b ] && n=$LAT_B
        lat_pair "$n" $t strace -f -c
        python3 - "$WORK/lat-srv-$t.txt" "$WORK/lat-cli-$t.txt" >"$WORK/ls-$t" <<'PY'
import sys
rows = {}
for p in sys.argv[1:]:
    for line in open(p):
        f = line.split()
        if len(f) >= 5 and f[0][0].isdigit() and not line.startswith("100.00"):
            c, e = rows.get(f[-1], (0, 0))
            rows[f[-1]] = (c + int(f[3]), e + (int(f[4]) if len(f) == 6 else 0))
print(sum(c for c, _ in rows.values()), sum(e for _, e in rows.values()),
      " ".join(f"{k}:{c}/{e}" for k, (c, e) in sorted(rows.items(), key=lambda kv: -kv[1][0])[:8]))
PY
        lat_pair "$n" "p$t" perf stat -x, -e context-switches,task-clock
        cat "$WORK/lat-srv-p$t.txt" "$WORK/lat-cli-p$t.txt" |
            awk -F, '$3 == "context-switches" { cs += $1 } $3 == "task-clock" { tc += $1 }
                     END { print cs + 0, tc + 0 }' >"$WORK/lp-$t"
    done
    units=$((LAT_B - LAT_A))
    read -r csa tca <"$WORK/lp-a"
    read -r csb tcb <"$WORK/lp-b"
    echo "  rdma-perf: $(diff_strace "$WORK/ls-a" "$WORK/ls-b" "$units")"
    python3 -c "print(f'  rdma-perf: context switches {($csb - $csa) / $units:.2f}   CPU time {($tcb - $tca) / $units * 1000:.2f} us per round trip')"
    echo "  plain UDP ping-pong (sockperf --nonblocked): 4 successful calls per round trip (sendto + recvfrom at each end) plus empty polls"
fi
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"
