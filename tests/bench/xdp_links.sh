#!/bin/bash
# The AF_XDP link against the UDP link on one veth pair between two network namespaces this script
# creates and removes (A: xa0 10.79.0.1, B: xb0 10.79.0.2), side by side (issue 23's benchmarks):
#   rdma-perf send-lat -s 8 and write-bw -s 65536: server in A on xdp:xa0, then on udp:10.79.0.1,
#     client in B on udp:10.79.0.2; the server's CPU time (user + system, /usr/bin/time) per GB;
#     on xdp the server's buffer is in the UMEM (its READ / ACK traffic is small: write-bw's
#     payload is the client's, so for the zero-copy transmit run write-bw with the client in A).
#   coll-perf all-reduce --transport roce, 2 ranks: rank 0 in A (COLL_ROCE_LINK=xdp:xa0, then
#     udp:10.79.0.1:4791), rank 1 in B on udp, 1 KiB .. 16 MiB; busbw per size.
# Prints `uptime` before and after: figures from a loaded machine (load >= 1) are not figures.
# Root only. Usage (after cargo build --release -p hca --bins -p collectives --bin coll-perf):
#   tests/bench/xdp_links.sh [ITERS]        (default 20000)
set -eu
N=${1:-20000}
R=${TARGET:-target/release}
PERF=$R/rdma-perf
COLL=$R/coll-perf
for b in "$PERF" "$COLL"; do
  [ -x "$b" ] || { echo "missing $b (cargo build --release)"; exit 1; }
done
[ "$(id -u)" = 0 ] || { echo "needs root (network namespaces, XDP)"; exit 1; }
A=bxa$$
B=bxb$$
tmp=$(mktemp -d)
cleanup() { ip netns del $A 2>/dev/null; ip netns del $B 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
ip netns add $A
ip netns add $B
ip link add xa0 netns $A type veth peer name xb0 netns $B
ip -n $A addr add 10.79.0.1/24 dev xa0
ip -n $B addr add 10.79.0.2/24 dev xb0
for ns in $A $B; do ip -n $ns link set lo up; done
ip -n $A link set xa0 up
ip -n $B link set xb0 up
echo "load before: $(uptime)"

# One rdma-perf cell: server in A on $1, client in B; prints its result line and the server's CPU.
perf_cell() {
  local link=$1 test=$2 size=$3
  ip netns exec $A /usr/bin/time -f "%U %S" -o "$tmp/time" \
    timeout 300 "$PERF" "$test" -s "$size" -n "$N" --link "$link" --timeout 60 >"$tmp/s" 2>&1 &
  local spid=$!
  ip netns exec $B timeout 300 "$PERF" "$test" -s "$size" -n "$N" --link udp:10.79.0.2 \
    --timeout 60 10.79.0.1 >"$tmp/c" 2>&1 || { cat "$tmp/c" "$tmp/s"; exit 1; }
  wait $spid || { cat "$tmp/s"; exit 1; }
  local line cpu gb
  line=$(awk -v s="$size" '$1 == s' "$tmp/c" | tail -1)
  cpu=$(awk '{ print $1 + $2 }' "$tmp/time")
  gb=$(echo "$size * $N / 1000000000" | bc -l)
  if [ "$test" = write-bw ]; then
    printf '%-16s %-9s %s | server CPU %.2f s, %.2f s/GB\n' "$link" "$test" "$line" "$cpu" \
      "$(echo "$cpu / $gb" | bc -l)"
  else
    printf '%-16s %-9s %s | server CPU %.2f s\n' "$link" "$test" "$line" "$cpu"
  fi
}

for link in xdp:xa0 udp:10.79.0.1; do
  perf_cell $link send-lat 8
  perf_cell $link write-bw 65536
done

# coll-perf: rank 0 in A on $1, rank 1 in B on UDP, bootstrapped torchrun-style from rank 0.
coll_cell() {
  local link=$1
  local common=(all-reduce -b 1K -e 16M -f 4 -n 20 -T 120 --transport roce)
  COLL_ROCE_LINK=$link RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 MASTER_ADDR=10.79.0.1 MASTER_PORT=29511 \
    ip netns exec $A timeout 600 "$COLL" "${common[@]}" >"$tmp/r0" 2>&1 &
  local p0=$!
  COLL_ROCE_LINK=udp:10.79.0.2:4791 RANK=1 WORLD_SIZE=2 LOCAL_RANK=0 MASTER_ADDR=10.79.0.1 \
    MASTER_PORT=29511 ip netns exec $B timeout 600 "$COLL" "${common[@]}" >"$tmp/r1" 2>&1 ||
    { cat "$tmp/r1" "$tmp/r0"; exit 1; }
  wait $p0 || { cat "$tmp/r0"; exit 1; }
  echo "coll-perf all-reduce, rank 0 on $link:"
  grep -v '^#' "$tmp/r0" | grep -v '^\s*$' || true
}
coll_cell xdp:xa0
coll_cell udp:10.79.0.1:4791
echo "load after: $(uptime)"
