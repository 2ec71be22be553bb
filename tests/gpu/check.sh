#!/usr/bin/env bash
# GPU check of issue 9, for a machine with an NVIDIA GPU and a CUDA 12 driver. It builds nothing:
# it runs release binaries built beforehand (x86-64) on a machine without a GPU.
#
# Build (repository root, any x86-64 Linux machine, no CUDA needed):
#
#   cargo build --release -p gpu-p2p --bin gpu-probe -p collectives --bin coll-perf
#   mkdir -p gpu-bin && strip -o gpu-bin/gpu-probe "${CARGO_TARGET_DIR:-target}/release/gpu-probe" \
#                    && strip -o gpu-bin/coll-perf "${CARGO_TARGET_DIR:-target}/release/coll-perf"
#
# and the Python package (issue 20; its own cargo workspace, the target directory tests/python.sh
# uses), carried as a package directory: the Python sources and the extension module (abi3,
# CPython >= 3.11, links no libpython; no torch, no numpy, no pip needed on the GPU machine):
#
#   CARGO_TARGET_DIR=target/py cargo build --release --manifest-path collectives/python/Cargo.toml
#   mkdir -p gpu-bin/py/rocecoll && cp collectives/python/python/rocecoll/*.py gpu-bin/py/rocecoll/ \
#       && strip -o gpu-bin/py/rocecoll/_native.abi3.so target/py/release/lib_native.so
#
# Carry list (device `run` tool): ["gpu-bin"]   (gpu-bin/ is ignored by git; this script is tracked
# and travels with the tree). The two stripped binaries are about 3 MiB together, the package
# 2.9 MiB, far under the 64 MiB limit; all link only libc, libm, libgcc_s; libcuda and
# libnvidia-ml are opened at run time.
# Run from the repository root:
#
#   BIN=gpu-bin bash tests/gpu/check.sh        (whole run: about 1-2 minutes on one H200)
#
# Steps, each bounded by `timeout` (worst case, every step hitting its bound: 5.9 minutes), each
# printing what it measured; a failing step prints FAILED and the script goes on to the next:
#   devices       driver version, devices, attributes, topology (NVML or sysfs), peer access;
#   kernels       every PTX reduction kernel JIT-compiled, run and checked bitwise (JIT time);
#   register      a device buffer as RDMA registration needs it (SYNC_MEMOPS, IPC handle, dma-buf
#                 export), staged round trip and GPU atomics checked;
#   ipc           CUDA IPC between two processes (map, read, write back, checked);
#   bandwidth     host<->device: staged pipeline against a plain pinned cuMemcpyAsync, pageable
#                 cuMemcpy, and device-to-device;
#   all-reduce-*  coll-perf --device cuda, 2 and 4 rank processes on the GPU(s): the GPU
#                 peer-to-peer path via CUDA IPC (required: "All-reduce path : gpu-p2p N calls,
#                 staged 0 calls"), every size checked (#wrong 0), busbw beside the D2D copy
#                 bandwidth of the same run; also bf16 avg and f16 max once;
#   broadcast-2   a staged collective on device buffers (host path through cuMemcpy);
#   python-cuda   the rocecoll package on device memory without torch (tests/gpu/rocecoll_cuda.py,
#                 python3 >= 3.11 and ctypes + libcuda): 2 rank processes, all_reduce (GPU
#                 peer-to-peer path required), all_gather, broadcast, reduce_scatter, send/recv
#                 checked bitwise against plain-Python references, and stream order (an input
#                 written by an unsynchronized cuMemsetD32Async on a non-blocking stream); the
#                 script's `--host` mode checks the script itself without a GPU (pytest runs it).
# At the end: a summary table (step, result, seconds) and the key figures; exit 0 only if all
# steps passed (1 if any failed, 2 if the binaries are missing). Without a GPU every step fails
# at once with the driver's one-line error (dry run: BIN=... bash tests/gpu/check.sh).
set -uo pipefail

BIN=${BIN:-target/release}
LOG=${LOG:-$(mktemp -d /tmp/gpu-check.XXXXXX)}
for b in gpu-probe coll-perf py/rocecoll/_native.abi3.so; do
    if [[ ! -x "$BIN/$b" ]]; then
        echo "FAILED: $BIN/$b missing (build it beforehand, see the header of $0)" >&2
        exit 2
    fi
done
echo "# GPU check: binaries from $BIN, step logs in $LOG, started $(date -u +%FT%TZ)"
command -v nvidia-smi >/dev/null &&
    timeout 10 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 |
    sed 's/^/# nvidia-smi: /'

names=()
results=()
times=()
# step NAME BOUND_SECONDS CHECK COMMAND...: runs COMMAND (a program, not a shell function) under
# `timeout` (SIGTERM to its whole process group, rank processes included, then SIGKILL 3 s later),
# its output shown and kept in $LOG/NAME.log; CHECK is a function run on that log that must also
# succeed ("-" for none).
step() {
    local name=$1 bound=$2 check=$3
    shift 3
    echo
    echo "=== $name (bound ${bound} s): $*"
    local t0=$SECONDS rc
    timeout -k 3 "$bound" "$@" 2>&1 | tee "$LOG/$name.log"
    rc=${PIPESTATUS[0]}
    local verdict=ok
    if [[ $rc -eq 124 || $rc -eq 137 ]]; then
        verdict="FAILED (timed out after ${bound} s)"
    elif [[ $rc -ne 0 ]]; then
        verdict="FAILED (exit $rc)"
    elif [[ $check != - ]] && ! "$check" "$LOG/$name.log"; then
        verdict="FAILED (output check)"
    fi
    names+=("$name")
    results+=("$verdict")
    times+=($((SECONDS - t0)))
    echo "=== $name: $verdict ($((SECONDS - t0)) s)"
}

# coll-perf's all-reduce must report zero wrong elements, the peer-to-peer path for every call,
# and the D2D copy bandwidth.
allreduce_ok() {
    grep -q "Out of bounds values : 0 OK" "$1" &&
        grep -Eq "All-reduce path +: gpu-p2p [1-9][0-9]* calls, staged 0 calls" "$1" &&
        grep -q "D2D copy bandwidth" "$1"
}
staged_ok() {
    grep -q "Out of bounds values : 0 OK" "$1"
}
python_ok() {
    grep -q "python-cuda: all checks passed" "$1" &&
        grep -Eq "all-reduce path: gpu-p2p [1-9][0-9]* calls, staged 0 calls" "$1"
}

# -T: coll-perf's own bound on one collective (seconds), well below the step's bound.
CUDA=(--device cuda -T 20)

step devices 15 - "$BIN/gpu-probe" devices
step kernels 30 - "$BIN/gpu-probe" kernels
step register 15 - "$BIN/gpu-probe" register 64
step ipc 20 - "$BIN/gpu-probe" ipc 16
step bandwidth 25 - "$BIN/gpu-probe" bandwidth 256
step all-reduce-2 45 allreduce_ok "$BIN/coll-perf" all-reduce --ranks 2 -b 1M -e 256M -f 4 -n 20 -w 2 "${CUDA[@]}"
step all-reduce-4 55 allreduce_ok "$BIN/coll-perf" all-reduce --ranks 4 -b 1M -e 256M -f 4 -n 20 -w 2 "${CUDA[@]}"
step all-reduce-4-bf16-avg 20 allreduce_ok "$BIN/coll-perf" all-reduce --ranks 4 -b 4M -e 4M -d bfloat16 -o avg -n 5 "${CUDA[@]}"
step all-reduce-2-f16-max 20 allreduce_ok "$BIN/coll-perf" all-reduce --ranks 2 -b 4M -e 4M -d half -o max -n 5 "${CUDA[@]}"
step broadcast-2-staged 15 staged_ok "$BIN/coll-perf" broadcast --ranks 2 -b 1M -e 1M -n 3 "${CUDA[@]}"
step python-cuda 60 python_ok python3 "$(dirname "$0")/rocecoll_cuda.py" "$BIN/py" 2

echo
echo "# ---- summary ----"
printf '# %-24s %-34s %5s\n' step result s
failed=0
for i in "${!names[@]}"; do
    printf '# %-24s %-34s %5s\n' "${names[$i]}" "${results[$i]}" "${times[$i]}"
    [[ ${results[$i]} == ok ]] || failed=1
done
echo "# key figures:"
grep -H -E "^GPU [0-9]+:|driver CUDA version|JIT-compiled|kernels on|GB/s|IPC of|Avg bus bandwidth|All-reduce path|D2D copy bandwidth|^# device:|^# python|python-cuda:" \
    "$LOG"/*.log 2>/dev/null | sed "s|^$LOG/||; s|\.log:|: |; s/^/#   /"
for n in all-reduce-2 all-reduce-4; do
    row=$(grep -E "^ +[0-9]+ +[0-9]+ " "$LOG/$n.log" 2>/dev/null | tail -1)
    [[ -n $row ]] || continue
    echo "#   $n, largest size (size count type redop root | out: time algbw busbw #wrong | in: ...):"
    echo "#     $row"
done
echo
if [[ $failed -ne 0 ]]; then
    echo "GPU CHECK FAILED (total $SECONDS s)" >&2
    exit 1
fi
echo "GPU CHECK PASSED (total $SECONDS s)"
