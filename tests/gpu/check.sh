#!/usr/bin/env bash
# GPU check of issue 9, for a machine with an NVIDIA GPU and a CUDA 12 driver. It builds nothing:
# it runs release binaries built beforehand (x86-64) on a machine without a GPU:
#
#   cargo build --release -p gpu-p2p --bin gpu-probe -p collectives --bin coll-perf
#   mkdir -p gpu-bin && strip -o gpu-bin/gpu-probe target/release/gpu-probe \
#                    && strip -o gpu-bin/coll-perf target/release/coll-perf
#
# Carry gpu-bin/ (two stripped binaries: 2.7 MiB together as last built, far under the 64 MiB
# limit; both link only libc, libm, libgcc_s; libcuda and libnvidia-ml are opened at run time)
# and this script; run from the
# repository root:   BIN=gpu-bin bash tests/gpu/check.sh
#
# Steps (each bounded by `timeout`; the whole run is under 5 minutes on one GPU):
#   1. devices, attributes, topology (NVML or sysfs), peer access;
#   2. a device buffer registered as RDMA needs it (SYNC_MEMOPS, IPC handle, dma-buf export), staged
#      round trip and GPU atomics checked;
#   3. host<->device bandwidth: staged pipeline against a plain pinned cuMemcpy, and device-to-device;
#   4. coll-perf --device cuda all-reduce, 2 and 4 ranks (processes) on GPU 0 (or spread over the
#      GPUs there are): the GPU peer-to-peer path via CUDA IPC, every size checked (#wrong 0),
#      busbw beside the D2D copy bandwidth of the same run; also f16/bf16 and avg/max once.
# Every failing step prints FAILED with its name; the script then exits 1 after running the rest.
set -uo pipefail

BIN=${BIN:-target/release}
for b in gpu-probe coll-perf; do
    if [[ ! -x "$BIN/$b" ]]; then
        echo "FAILED: $BIN/$b missing (build it beforehand, see the header of $0)" >&2
        exit 2
    fi
done

failures=()
step() {
    local name=$1
    shift
    echo
    echo "=== $name: $*"
    local t0=$SECONDS
    if "$@"; then
        echo "=== $name: ok ($((SECONDS - t0)) s)"
    else
        echo "=== $name: FAILED (exit $?, $((SECONDS - t0)) s)" >&2
        failures+=("$name")
    fi
}

# coll-perf must also report zero wrong elements in its summary line.
coll() {
    local out
    out=$(timeout 120 "$BIN/coll-perf" "$@" --device cuda -T 30 2>&1)
    local rc=$?
    echo "$out"
    [[ $rc -eq 0 ]] && grep -q "Out of bounds values : 0 OK" <<<"$out" && grep -q "D2D copy bandwidth" <<<"$out"
}

step devices timeout 60 "$BIN/gpu-probe" devices
step register timeout 60 "$BIN/gpu-probe" register 64
step bandwidth timeout 90 "$BIN/gpu-probe" bandwidth 256
step all-reduce-2 coll all-reduce --ranks 2 -b 1M -e 256M -f 4 -n 20 -w 2
step all-reduce-4 coll all-reduce --ranks 4 -b 1M -e 256M -f 4 -n 20 -w 2
step all-reduce-4-bf16-avg coll all-reduce --ranks 4 -b 4M -e 4M -d bfloat16 -o avg -n 5
step all-reduce-2-f16-max coll all-reduce --ranks 2 -b 4M -e 4M -d half -o max -n 5
step broadcast-2-staged coll broadcast --ranks 2 -b 1M -e 1M -n 3

echo
if [[ ${#failures[@]} -gt 0 ]]; then
    echo "GPU CHECK FAILED: ${failures[*]}" >&2
    exit 1
fi
echo "GPU CHECK PASSED"
