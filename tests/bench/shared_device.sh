#!/bin/bash
# Aggregate write-bw of N rdma-perf pairs sharing one device (one address, UDP port 4791,
# SOFT_HCA_SHARE=1: 2N processes) against one pair with -q N (one process per side, each with
# its own address), and against N pairs each on addresses of their own (no sharing: the cost of
# sharing alone, same process count), for N = 2 4 8 (or the arguments). Prints one line per N:
#   N shared_MBps single_MBps shared/single separate_MBps shared/separate
# Usage: tests/bench/shared_device.sh [N...]   (after cargo build --release -p hca --bin rdma-perf)
#        TOOL=perftest tests/bench/shared_device.sh [N...]
#   TOOL=perftest runs Debian's unmodified `ib_write_bw` over the drop-in libibverbs.so.1 instead
#   (after cargo build --release -p ibverbs-abi; LIBDIR, default target/release), each process with
#   ROCE_DEVICES=rxe0=udp:ADDRESS: the library shares a device address between processes by default.
set -u
B=${PERF:-target/release/rdma-perf}
TOOL=${TOOL:-rdma-perf}
LIBDIR=${LIBDIR:-target/release}
SECS=${SECS:-5}
SIZE=65536
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# wb ADDRESS PORT [ARGS...] [SERVER]: one side of a write-bw pair on the device at ADDRESS.
wb() {
  local addr=$1 p=$2
  shift 2
  if [ "$TOOL" = perftest ]; then
    LD_LIBRARY_PATH=$LIBDIR ROCE_DEVICES=rxe0=udp:$addr timeout 120 ib_write_bw -d rxe0 -x 0 -p "$p" -s $SIZE -D "$SECS" "$@"
  else
    SOFT_HCA_SHARE=1 timeout 120 "$B" write-bw --link udp:"$addr" -p "$p" -s $SIZE -D "$SECS" --timeout 60 "$@"
  fi
}
avg() { awk -v s=$SIZE '$1 == s && NF >= 4 { print $4 }' "$1" | tail -1; }
port=$((20000 + $$ % 20000))
for n in "${@:-2 4 8}"; do
  for n in $n; do
    pids=()
    for i in $(seq 1 "$n"); do
      port=$((port + 1))
      wb 127.0.0.1 $port >"$tmp/s$i" 2>&1 &
      pids+=($!)
    done
    # All servers first, then all clients at once: the pairs overlap for (nearly) their whole run.
    sleep 0.5
    for i in $(seq 1 "$n"); do
      wb 127.0.0.1 $((port - n + i)) 127.0.0.1 >"$tmp/c$i" 2>&1 &
      pids+=($!)
    done
    wait "${pids[@]}"
    shared=0
    for i in $(seq 1 "$n"); do
      v=$(avg "$tmp/c$i")
      [ -n "$v" ] || { echo "pair $i failed:"; cat "$tmp/c$i" "$tmp/s$i"; exit 1; }
      shared=$(echo "$shared + $v" | bc -l)
    done
    pids=()
    for i in $(seq 1 "$n"); do
      port=$((port + 1))
      wb 127.0.1.$i $port >"$tmp/S$i" 2>&1 &
      pids+=($!)
    done
    sleep 0.5
    for i in $(seq 1 "$n"); do
      wb 127.0.2.$i $((port - n + i)) 127.0.1.$i >"$tmp/C$i" 2>&1 &
      pids+=($!)
    done
    wait "${pids[@]}"
    separate=0
    for i in $(seq 1 "$n"); do
      v=$(avg "$tmp/C$i")
      [ -n "$v" ] || { echo "separate pair $i failed:"; cat "$tmp/C$i" "$tmp/S$i"; exit 1; }
      separate=$(echo "$separate + $v" | bc -l)
    done
    port=$((port + 1))
    wb 127.0.0.3 $port -q "$n" >"$tmp/s0" 2>&1 &
    sp=$!
    sleep 0.2
    wb 127.0.0.4 $port -q "$n" 127.0.0.3 >"$tmp/c0" 2>&1
    wait $sp
    single=$(avg "$tmp/c0")
    [ -n "$single" ] || { echo "single failed:"; cat "$tmp/c0" "$tmp/s0"; exit 1; }
    printf '%d %.1f %.1f %.2f %.1f %.2f\n' "$n" "$shared" "$single" "$(echo "$shared / $single" | bc -l)" \
      "$separate" "$(echo "$shared / $separate" | bc -l)"
  done
done
