#!/usr/bin/env bash
# Loopback benchmark of the software HCA on a kernel UDP socket against what a user would pick
# instead, in one run, printed side by side with ratios (issue 4):
#   1. `rdma-perf write-bw -s 65536` goodput vs raw kernel UDP (`iperf3 -u -b 0 -l <payload>`) at
#      the same datagram payload (the path MTU's), over IPv4 (127.x) and IPv6 (addresses on
#      `lo`), UDP GSO/GRO on in both (UdpDeviceConfig::gso_ipv4: a train's IPv4 identifications
#      are predicted for the ICRC);
#   2. `rdma-perf send-lat -s 8` t_typical vs `sockperf ping-pong` median half round trip
#      (sockperf's smallest message is 14 bytes: -m 14), unpinned and then (2 CPUs or more, PIN
#      unset) with each end pinned to its own CPU and with both on one; sockperf --nonblocked
#      (busy polling); and the kernel's share of send-lat (benches/udp_floor.rs: the link's
#      system calls with no engine against a plain socket's, medians of REPS runs);
#   3. `rdma-perf write-bw -q 64` vs `-q 1` aggregate bandwidth.
# Run by hand (not a test): `hca/benches/udp.sh [seconds-per-run]`. Needs root to install iperf3 /
# sockperf (apt) when missing and to add two IPv6 addresses to `lo`. PIN=1 pins every server to
# CPU 0 and every client to CPU 1 (all threads of a process then share one CPU; off by default).
# Other load on the machine skews every figure.
set -euo pipefail

SECS=${1:-5}
# Each figure is the median of this many runs (the machine's other load varies).
REPS=${REPS:-3}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
PERF=$TARGET/release/rdma-perf
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT

need() {
    if ! command -v "$1" >/dev/null; then
        echo "installing $2 ..." >&2
        if [ "$(id -u)" -ne 0 ]; then
            echo "$1 is missing and this is not root: install $2" >&2
            exit 1
        fi
        DEBIAN_FRONTEND=noninteractive apt-get install -y "$2" >/dev/null
    fi
}
need iperf3 iperf3
need sockperf sockperf
need python3 python3

(cd "$ROOT" && cargo build --release -q -p hca --bin rdma-perf)

CPUS=$(nproc)
if [ "${PIN:-0}" = 1 ] && [ "$CPUS" -ge 2 ] && command -v taskset >/dev/null; then
    SRV="taskset -c 0"
    CLI="taskset -c 1"
else
    SRV=""
    CLI=""
fi

V6A=fd00::4791:1
V6B=fd00::4791:2
if [ "$(id -u)" -eq 0 ]; then
    ip -6 addr add $V6A/128 dev lo 2>/dev/null || true
    ip -6 addr add $V6B/128 dev lo 2>/dev/null || true
fi
HAVE_V6=0
grep -q "fd000000000000000000000047910001" /proc/net/if_inet6 && HAVE_V6=1

# A fresh TCP port per run (runs happen in subshells, so no counter survives them).
next_port() { PORT=$((20000 + RANDOM % 30000)); }

# rdma-perf server + client; prints the client's output.
perf_pair() { # test server-addr client-addr args...
    local test=$1 a=$2 b=$3
    shift 3
    next_port
    $SRV "$PERF" "$test" --link "udp:$a" -p $PORT --timeout 60 "$@" >"$WORK/srv.txt" 2>&1 &
    local spid=$!
    sleep 0.3
    local rc=0
    $CLI "$PERF" "$test" --link "udp:$b" -p $PORT --timeout 60 "$@" 127.0.0.1 >"$WORK/cli.txt" 2>&1 || rc=$?
    wait $spid || rc=$?
    if [ $rc -ne 0 ]; then
        grep -h "rdma-perf:" "$WORK/srv.txt" "$WORK/cli.txt" | sed 's/^/  failed run: /' >&2
        return
    fi
    cat "$WORK/cli.txt"
}

# The value of column $1 of the first result row after the column header.
column() {
    awk -v c="$1" '/#bytes/ {h=1; next} h && NF > 1 {print $c; exit}'
}

# iperf3 UDP goodput at the receiver, Gbit/s: sender rate less lost datagrams.
iperf_goodput() { # addr payload
    next_port
    $SRV iperf3 -s -B "$1" -p $PORT -1 >/dev/null 2>&1 &
    sleep 0.3
    $CLI iperf3 -c "$1" -p $PORT -u -b 0 -l "$2" -t "$SECS" --json >"$WORK/iperf.json" 2>&1 || true
    wait || true
    python3 - "$WORK/iperf.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))["end"]["sum"]
print(f'{s["bits_per_second"] * (1 - s["lost_percent"] / 100) / 1e9:.3f}')
PY
}

gbits() { python3 -c "print(f'{float(\"$1\") * 1048576 * 8 / 1e9:.3f}')"; }
# The median of the numbers given (a failed run's non-number is left out and reported).
median() {
    python3 - "$@" <<'PY'
import statistics, sys
vals = []
for x in sys.argv[1:]:
    try:
        vals.append(float(x))
    except ValueError:
        print(f"(a run failed: {x!r})", file=sys.stderr)
print(statistics.median(vals) if vals else "nan")
PY
}
# Runs "$@" REPS times and prints the median of what it prints.
med() {
    local vals=()
    for _ in $(seq "$REPS"); do vals+=("$("$@")"); done
    median "${vals[@]}"
}
perf_col() { # column test a b args...
    local c=$1
    shift
    perf_pair "$@" | column "$c"
}
sockperf_median() { # [extra sockperf flags, e.g. --nonblocked]
    next_port
    $SRV sockperf server -i $IP4A -p $PORT "$@" >/dev/null 2>&1 &
    local spid=$!
    sleep 0.5
    $CLI sockperf ping-pong -i $IP4A -p $PORT -m 14 -t "$SECS" "$@" >"$WORK/sockperf.txt" 2>&1 || true
    kill $spid 2>/dev/null || true
    wait $spid 2>/dev/null || true
    awk '/percentile 50.000/ {print $NF}' "$WORK/sockperf.txt"
}
ratio() { python3 -c "print(f'{float(\"$1\") / float(\"$2\"):.2f}')"; }

echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $CPUS CPUs, Linux $(uname -r)"
echo "socket buffers: rmem_max $(cat /proc/sys/net/core/rmem_max), wmem_max $(cat /proc/sys/net/core/wmem_max)"
echo "each run: $SECS s; pinning: ${SRV:-none}${CLI:+ / $CLI}"
echo

echo "each figure: median of $REPS runs"
echo

# 1. bandwidth vs raw UDP.
IP4A=127.0.47.1
IP4B=127.0.47.2
perf_pair write-bw $IP4A $IP4B -s 65536 -n 100 >/dev/null
MTU4=$(grep -m1 "Mtu" "$WORK/cli.txt" | sed 's/[^0-9]//g')
BW4=$(med perf_col 4 write-bw $IP4A $IP4B -s 65536 -D "$SECS")
UDP4=$(med iperf_goodput $IP4A "$MTU4")
echo "1. write-bw -s 65536 (IPv4, path MTU $MTU4, GSO/GRO):  rdma-perf $(gbits "$BW4") Gbit/s   iperf3 -u -b 0 -l $MTU4 $UDP4 Gbit/s   rdma-perf/iperf3 $(ratio "$(gbits "$BW4")" "$UDP4")"
if [ "$HAVE_V6" -eq 1 ]; then
    perf_pair write-bw $V6A $V6B -s 65536 -n 100 >/dev/null
    MTU6=$(grep -m1 "Mtu" "$WORK/cli.txt" | sed 's/[^0-9]//g')
    BW6=$(med perf_col 4 write-bw $V6A $V6B -s 65536 -D "$SECS")
    UDP6=$(med iperf_goodput $V6A "$MTU6")
    echo "   write-bw -s 65536 (IPv6, path MTU $MTU6, GSO/GRO):  rdma-perf $(gbits "$BW6") Gbit/s   iperf3 -u -b 0 -l $MTU6 $UDP6 Gbit/s   rdma-perf/iperf3 $(ratio "$(gbits "$BW6")" "$UDP6")"
fi

# 2. latency vs sockperf.
LAT=$(med perf_col 5 send-lat $IP4A $IP4B -s 8 -n 20000)
SOCK=$(med sockperf_median)
echo "2. send-lat -s 8 t_typical: rdma-perf $LAT us   sockperf ping-pong -m 14 median $SOCK us   rdma-perf/sockperf $(ratio "$LAT" "$SOCK")"
if [ "$CPUS" -ge 2 ] && [ -z "$SRV" ] && command -v taskset >/dev/null; then
    # The same pair with the server on CPU 0 and the client on CPU 1, as latency benchmarks are
    # usually run: unpinned, the scheduler may put both ends of a blocking ping-pong (sockperf)
    # on one CPU, where a wake-up is a context switch; across CPUs it is an inter-processor
    # wake-up, which a spinning poller (rdma-perf, like perftest) does not wait for.
    SRV="taskset -c 0"
    CLI="taskset -c 1"
    LATP=$(med perf_col 5 send-lat $IP4A $IP4B -s 8 -n 20000)
    SOCKP=$(med sockperf_median)
    # Both ends on CPU 0: a blocking ping-pong's wake-up is then a context switch, its best
    # case; rdma-perf's poller, once a wait took 30 us or more, yields the CPU to the peer
    # after each post.
    CLI="taskset -c 0"
    LATS=$(med perf_col 5 send-lat $IP4A $IP4B -s 8 -n 20000)
    SOCKS=$(med sockperf_median)
    SRV=""
    CLI=""
    echo "   the same pinned (server CPU 0, client CPU 1): rdma-perf $LATP us   sockperf $SOCKP us   rdma-perf/sockperf $(ratio "$LATP" "$SOCKP")"
    echo "   the same with both ends on CPU 0:             rdma-perf $LATS us   sockperf $SOCKS us   rdma-perf/sockperf $(ratio "$LATS" "$SOCKS")"
fi
# sockperf on non-blocking sockets polls in a loop, as rdma-perf (like perftest) polls its CQ:
# the like-for-like comparison of the two stacks' per-message work.
SOCKNB=$(med sockperf_median --nonblocked)
echo "   sockperf --nonblocked (busy polling, unpinned): $SOCKNB us   rdma-perf/sockperf $(ratio "$LAT" "$SOCKNB")"
# The kernel's share: send-lat's datagrams (SEND + ACK, one GSO train) through the link with no
# engine, against one datagram on a plain socket, both polled as rdma-perf polls.
echo "   the link's system calls with no engine (cargo bench -p hca --bench udp_floor):"
(cd "$ROOT" && cargo bench -q -p hca --bench udp_floor -- 50000 "$REPS" 2>/dev/null) | sed 's/^/   /'

# 3. 64 QPs vs 1.
Q1=$(med perf_col 4 write-bw $IP4A $IP4B -s 65536 -q 1 -D "$SECS")
Q64=$(med perf_col 4 write-bw $IP4A $IP4B -s 65536 -q 64 -D "$SECS")
echo "3. write-bw -s 65536: -q 1 $(gbits "$Q1") Gbit/s   -q 64 $(gbits "$Q64") Gbit/s   ratio q64/q1 $(ratio "$Q64" "$Q1")"
