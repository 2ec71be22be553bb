#!/usr/bin/env bash
# User-space instructions per round trip of `rdma-perf send-lat -s 8` (issue 21), counted by
# valgrind's callgrind (this VM has no hardware counters for perf): the client runs under
# callgrind, the server natively, for N1 and N2 round trips; the difference over N2 - N1 drops
# set-up and tear-down. A client slowed by callgrind finds the server's answer waiting almost
# every time, so its count is close to the data path alone (one receiving round, one post);
# the caller rounds per round trip are printed beside it (each extra one is an empty poll).
# Counts, not times: they do not depend on the machine's load (empty polls do, a little).
#
# Usage: hca/benches/lat_instructions.sh [BIN ...]   (default target/release/rdma-perf, built if
#        missing; several builds print one block each). N1=2000 N2=10000.
# Needs valgrind (apt-get install valgrind) and callgrind_annotate.
set -euo pipefail

N1=${N1:-2000}
N2=${N2:-10000}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; [ -n "${KEEP:-}" ] || rm -rf "$WORK"' EXIT

for tool in valgrind callgrind_annotate; do
    if ! command -v "$tool" >/dev/null; then
        echo "$tool is missing (apt-get install valgrind)" >&2
        exit 1
    fi
done
BINS=("$@")
if [ ${#BINS[@]} -eq 0 ]; then
    (cd "$ROOT" && cargo build --release -q -p hca --bin rdma-perf)
    BINS=("$TARGET/release/rdma-perf")
fi

# Server on CPU 0, client on CPU 1 (as lat_counts.sh PIN=0,1), when there are two.
SRV=()
CLI=()
if [ "$(nproc)" -ge 2 ] && command -v taskset >/dev/null; then
    SRV=(taskset -c 0)
    CLI=(taskset -c 1)
fi

run() { # bin iters tag: callgrind output of the client in $WORK/tag.cg
    local port=$((20000 + RANDOM % 30000))
    "${SRV[@]}" "$1" send-lat --link udp:127.0.47.1 -p $port --timeout 120 -s 8 -n "$2" >"$WORK/$3.srv" 2>&1 &
    local spid=$!
    sleep 0.5
    "${CLI[@]}" valgrind --tool=callgrind --callgrind-out-file="$WORK/$3.cg" "$1" send-lat \
        --link udp:127.0.47.2 -p $port --timeout 120 -s 8 -n "$2" 127.0.0.1 >"$WORK/$3.cli" 2>&1
    wait $spid
}

# Inclusive instructions of the first function matching $2 in callgrind output $1 (0 if none).
incl() {
    # From outside the source tree: run inside it, callgrind_annotate shortens the paths and
    # splits a function's inclusive cost over them.
    (cd / && callgrind_annotate --auto=no --inclusive=yes --threshold=100 "$1" 2>/dev/null) |
        grep -F -m1 -- "$2" | awk '{gsub(",", "", $1); print $1}' || true
}

# Calls of the caller rounds (poll_cq's rounds) in callgrind output $1.
rounds() {
    (cd / && callgrind_annotate --auto=no --tree=calling "$1" 2>/dev/null) |
        grep -A3 'Shared<L>>::caller_round \[' | grep -o '([0-9,]*x)' | tr -d '(),x' | head -1
}

ROWS=(
    "PROGRAM TOTALS|all user-space instructions"
    "SoftDevice<L>::post_send [|post_send (engine + the round that sends)"
    "UdpLink as hca::link::Link>::build [|  build: engine transmit of SEND + ACK"
    "UdpLink as hca::link::Link>::flush [|  flush: GSO plan, reseal, sendmmsg"
    "Shared<L>>::caller_round [|poll_cq's rounds (receive + empty polls)"
    "UdpLink as hca::link::Link>::deliver [|  deliver: engine receive of SEND + ACK"
    "RoceSocket::recv [|  receive calls (user side)"
    "icrc_of_udp_payload [|ICRC passes (2 sent, 2 received)"
    "reseal_ipv4 [|ICRC reseal of the ACK (GSO segment 1)"
    "SoftHca::poll_timeout [|timer heap checks"
)

echo "# user-space instructions per round trip, client under callgrind; N1=$N1 N2=$N2 (files: $WORK)"
for bin in "${BINS[@]}"; do
    run "$bin" "$N1" a
    run "$bin" "$N2" b
    d=$((N2 - N1))
    echo "## $bin"
    for row in "${ROWS[@]}"; do
        pat=${row%%|*}
        a=$(incl "$WORK/a.cg" "$pat")
        b=$(incl "$WORK/b.cg" "$pat")
        printf "  %-48s %8d\n" "${row#*|}" $(((${b:-0} - ${a:-0}) / d))
    done
    ra=$(rounds "$WORK/a.cg")
    rb=$(rounds "$WORK/b.cg")
    echo "  caller rounds per round trip: $(awk -v a="${ra:-0}" -v b="${rb:-0}" -v d=$d 'BEGIN { printf "%.2f", (b - a) / d }')"
done
