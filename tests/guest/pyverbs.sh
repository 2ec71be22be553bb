#!/usr/bin/env bash
# rdma-core's pyverbs test suite on Linux soft-RoCE (rxe0 in a QEMU TCG guest) as the reference column, beside
# the same suite on this project's drop-in libibverbs.so.1 / librdmacm.so.1 on the host (issue 18).
#
#   bash tests/guest/pyverbs.sh [--files REGEX] [--list] [--no-ours] [--gid N]
#
# The guest boots the cached base initramfs (tests/guest/setup.sh, unchanged: CI's guest stays small) with a
# second archive appended, the Python layer, built here on demand and cached as <cache>/pyverbs-layer.cpio.gz
# (rebuilt only when an input changes): Debian 12's python3.11 and its standard library (less test/,
# idlelib, tkinter, lib2to3, distutils, ensurepip, pydoc_data and the static-library config folder),
# python3-pyverbs (/usr/lib/python3/dist-packages/pyverbs: its Cython modules and, through ldd, the libraries
# they link: libpython3.11, libmlx5, libefa, libnl ...), iproute2's `ip` (the suite runs `ip -j addr show`,
# which busybox's lacks) and the suite of /usr/share/doc/rdma-core/tests with its .gz files unpacked, as
# /pyverbs/tests. In the guest (init.sh): rxe0 on eth0 with an IPv4 address, so GID 1 is the IPv4-mapped
# RoCEv2 GID; then `python3 run_tests.py --dev rxe0 --gid 1 -v FILE` once per test file, each bounded
# (cellrun), all in one boot.
#
# Our column: the same files, the same runner, on the host over the drop-in libraries (`cargo build -p
# ibverbs-abi -p rdmacm-abi`, or ROCE_PYVERBS_LIB_DIR), one device on 127.0.0.61 with --gid 0 (its IPv4
# GID), as hca/abi/tests/pyverbs.rs runs them; test_rdmacm under tests/sysfs-ib.sh --netns on 127.0.0.1 (it
# needs the device's net interface in sysfs), as pyverbs.rs's second test. --no-ours: the rxe column only.
#
# Output: per file, tests / passed / skipped / failed / errors of each column and the tests whose outcome
# differs, with both reasons (tests/guest/pyverbs_table.py parses unittest's -v output); saved as
# <cache>/pyverbs-latest.md and the raw logs <cache>/pyverbs-rxe-latest.log, <cache>/pyverbs-ours-latest.log.
# Exits 1 when the guest did not finish, a file timed out or ran no test, or a test failed that is not one of
# the known failures (--allow below, with their reasons).
#
# Environment: ROCE_GUEST_CACHE (as setup.sh), ROCE_PYVERBS_FILE_SECS (one file in the guest, 420),
# ROCE_PYVERBS_JOB_SECS (the guest's whole job, 2400), ROCE_PYVERBS_MEM (guest MiB, 1536),
# ROCE_PYVERBS_LIB_DIR (the drop-in libraries for our column). As root on Debian 12 (network namespace, tap).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=lib.sh
. "$HERE/lib.sh"

FILE_SECS="${ROCE_PYVERBS_FILE_SECS:-420}"
JOB_SECS="${ROCE_PYVERBS_JOB_SECS:-2400}"
GUEST_IP=198.18.0.1 PFX=24 LINK_MTU=4200 GUEST_MAC=52:54:00:52:00:01
SUITE=/usr/share/doc/rdma-core/tests
GID=1 OURS=1 FILTER="" LIST=0
# The suite's files that apply to a RoCE device without vendor extensions (the mlx5, EFA and CUDA ones
# need that hardware), as hca/abi/tests/pyverbs.rs, and test_rdmacm.
FILES=(test_device test_pd test_mr test_cq test_cq_events test_cqex test_qp test_qpex test_atomic test_addr
       test_parent_domain test_fork test_relaxed_ordering test_odp test_shared_pd test_flow test_rss_traffic
       test_tag_matching test_rdmacm test_rdmacm_netdir)

while [ $# -gt 0 ]; do
    case "$1" in
        --files) FILTER="${2:?--files needs a regex}"; shift 2 ;;
        --list) LIST=1; shift ;;
        --no-ours) OURS=0; shift ;;
        --gid) GID="${2:?--gid needs an index}"; shift 2 ;;
        -h|--help) sed -n '2,33p' "$0"; exit 0 ;;
        *) rg_die "unknown argument $1 (see --help)" ;;
    esac
done
if [ -n "$FILTER" ]; then
    kept=()
    for f in "${FILES[@]}"; do [[ "$f" =~ $FILTER ]] && kept+=("$f"); done
    FILES=("${kept[@]+"${kept[@]}"}")
fi
if [ "$LIST" -eq 1 ]; then
    printf '%s\n' "${FILES[@]+"${FILES[@]}"}"
    exit 0
fi
[ ${#FILES[@]} -gt 0 ] || rg_die "no test file matches '$FILTER'"
[ "$(id -u)" -eq 0 ] || rg_die "pyverbs: must run as root (network namespace, tap; tests/sysfs-ib.sh)"
[ -f "$SUITE/run_tests.py" ] || rg_die "no $SUITE/run_tests.py: python3-pyverbs missing (bash tests/setup.sh)"
PY="$(readlink -f /usr/bin/python3)"
[ -x "$PY" ] || rg_die "no /usr/bin/python3"

rg_run_start

# ---------------------------------------------------------------- the Python layer (cached)
# unpack_suite DIR: the suite into DIR, its .gz files unpacked.
unpack_suite() {
    mkdir -p "$1"
    cp -a "$SUITE/." "$1/"
    find "$1" -name '*.gz' -exec gzip -df {} +
}
rg_phase_begin "python layer"
LAYER="$CACHE/pyverbs-layer.cpio.gz"
PYVER="$(basename "$PY")"                      # python3.11
STDLIB="/usr/lib/$PYVER"
layer_stamp() {
    dpkg-query -W -f='${Package} ${Version}\n' "$PYVER-minimal" "lib$PYVER-stdlib" "lib$PYVER-minimal" \
        "lib$PYVER" python3-pyverbs libibverbs1 librdmacm1 ibverbs-providers iproute2 libc6 2>/dev/null || true
    cat "$CACHE/initramfs.stamp"
    sha256sum "$0" | awk '{print $1}'
}
STAMP="$(layer_stamp | sha256sum | awk '{print $1}')"
if [ -f "$LAYER" ] && [ "$(cat "$CACHE/pyverbs-layer.stamp" 2>/dev/null)" = "$STAMP" ]; then
    rg_log "pyverbs: Python layer up to date: $LAYER"
else
    rg_log "pyverbs: building the Python layer ($PY, $STDLIB, pyverbs, the suite)"
    ROOT="$CACHE/pyverbs-layer.root"
    rm -rf "$ROOT"
    mkdir -p "$ROOT/usr/bin" "$ROOT/usr/lib/python3/dist-packages" "$ROOT/pyverbs"
    cp -L "$PY" "$ROOT/usr/bin/$PYVER"
    ln -s "$PYVER" "$ROOT/usr/bin/python3"
    # The standard library with its compiled __pycache__ (imports under TCG are slow), less what unittest
    # and the suite never import.
    cp -a "$STDLIB" "$ROOT/usr/lib/"
    for x in test idlelib tkinter lib2to3 distutils ensurepip pydoc_data turtledemo site-packages \
        dist-packages "config-${PYVER#python}-x86_64-linux-gnu"; do
        rm -rf "${ROOT:?}/usr/lib/$PYVER/$x"
    done
    cp -a /usr/lib/python3/dist-packages/pyverbs "$ROOT/usr/lib/python3/dist-packages/"
    # iproute2's ip (the suite parses `ip -j addr show IF`); first in the guest's PATH, before busybox's.
    cp -L "$(command -v ip)" "$ROOT/usr/bin/ip"
    unpack_suite "$ROOT/pyverbs/tests"
    # The libraries of all of these that the base archive lacks, at their /usr path (the base archive's
    # /lib is a link to usr/lib).
    BASE_FILES="$(zcat "$CACHE/initramfs.cpio.gz" | cpio -t --quiet 2>/dev/null | sed 's|^\./||')"
    objs=("$PY" "$ROOT/usr/bin/ip")
    while IFS= read -r -d '' so; do objs+=("$so"); done \
        < <(find "$ROOT/usr/lib/$PYVER/lib-dynload" "$ROOT/usr/lib/python3/dist-packages/pyverbs" -name '*.so' -print0)
    for lib in $(ldd "${objs[@]}" 2>/dev/null | awk '/=> \//{print $3}' | sort -u); do
        real="$(readlink -f "$lib")"
        dst="/usr${lib#/usr}"
        case "$lib" in /lib/*|/lib64/*) dst="/usr$lib" ;; esac
        grep -qxF "${dst#/}" <<<"$BASE_FILES" && continue
        mkdir -p "$ROOT$(dirname "$dst")"
        [ -e "$ROOT$dst" ] || cp -L "$real" "$ROOT$dst"
    done
    tmp="$LAYER.tmp"
    (cd "$ROOT" && find . -mindepth 1 | LC_ALL=C sort | timeout 300 cpio -o -H newc --quiet -R 0:0 | gzip -1 >"$tmp") \
        || rg_die "pyverbs: cpio/gzip of the Python layer failed"
    mv "$tmp" "$LAYER"
    echo "$STAMP" >"$CACHE/pyverbs-layer.stamp"
    rg_log "pyverbs: Python layer $(du -h "$LAYER" | cut -f1) ($(du -sh "$ROOT" | cut -f1) unpacked)"
fi
rg_phase_end "python layer" >>"$TIMES"

# ---------------------------------------------------------------- the guest: rxe0
NS="rg-py-$$-$RANDOM"
rg_netns_create "$NS"
rg_bridge_add "$NS" br0 "$LINK_MTU"
rg_tap_add "$NS" br0 tap1 "$LINK_MTU"
JOB="$RG_RUN/job-g1"
rg_job_new "$JOB"
rg_job_cmd "$JOB" 'cd /pyverbs/tests || exit 1'
# POSIX shared memory: the rdmacm tests' multiprocessing locks live in /dev/shm (a Debian host mounts it).
rg_job_cmd "$JOB" 'mkdir -p /dev/shm && mount -t tmpfs -o mode=1777 shm /dev/shm'
# shellcheck disable=SC2016 # expanded in the guest
rg_job_cmd "$JOB" 'echo "@@PYVERBS $(python3 --version 2>&1); net: $(ls /sys/class/infiniband/rxe0/device/net 2>&1 | tr "\n" " "); gid'"$GID"': $(cat /sys/class/infiniband/rxe0/ports/1/gids/'"$GID"') $(cat /sys/class/infiniband/rxe0/ports/1/gid_attrs/types/'"$GID"' 2>&1)"'
cp "$HERE/pyverbs-netdir.sh" "$JOB/netdir.sh"
for f in "${FILES[@]}"; do
    case "$f" in
        test_rdmacm_netdir)
            # Last: the same file once rxe0 has the sysfs `device` link the suite looks for (netdir.sh).
            rg_job_cmd "$JOB" 'sh /job/netdir.sh 2>&1 | sed "s/^/@@NETDIR /"'
            rg_job_cell "$JOB" server "pyverbs:$f" "$FILE_SECS" python3 run_tests.py --dev rxe0 --gid "$GID" -v test_rdmacm ;;
        *) rg_job_cell "$JOB" server "pyverbs:$f" "$FILE_SECS" python3 run_tests.py --dev rxe0 --gid "$GID" -v "$f" ;;
    esac
done
rg_phase_begin "guest (boot+suite)"
rg_log "pyverbs: ${#FILES[@]} files in guest g1 ($GUEST_IP, --gid $GID); run folder $RG_RUN"
RG_GUEST_LAYERS="$LAYER" RG_GUEST_MEM="${ROCE_PYVERBS_MEM:-1536}" \
    rg_guest_start g1 "$NS" tap1 "$GUEST_MAC" "$GUEST_IP/$PFX" "$LINK_MTU" "$JOB" "$JOB_SECS"

# ---------------------------------------------------------------- ours, on the host, meanwhile
OURS_LOG="$RG_RUN/ours.log"
if [ "$OURS" -eq 1 ]; then
    rg_phase_begin "ours (host)"
    if [ -n "${ROCE_PYVERBS_LIB_DIR:-}" ]; then
        LIBS="$ROCE_PYVERBS_LIB_DIR"
    else
        LIBS="${CARGO_TARGET_DIR:-$RG_REPO/target}/debug"
        (cd "$RG_REPO" && rg_step 1800 "cargo build -p ibverbs-abi -p rdmacm-abi" \
            cargo build -p ibverbs-abi -p rdmacm-abi) || rg_die "building the drop-in libraries failed"
    fi
    mkdir -p "$RG_RUN/lib"
    for so in libibverbs.so.1 librdmacm.so.1; do
        [ -f "$LIBS/$so" ] || rg_die "no $so in $LIBS"
        cp -L "$LIBS/$so" "$RG_RUN/lib/$so"
    done
    unpack_suite "$RG_RUN/suite/tests"
    : >"$OURS_LOG"
    for f in "${FILES[@]}"; do
        if [ "$f" = test_rdmacm_netdir ]; then
            cmd=(env "LD_LIBRARY_PATH=$RG_RUN/lib" ROCE_DEVICES=rxe0=udp:127.0.0.1
                 "$RG_REPO/tests/sysfs-ib.sh" --netns -- /usr/bin/python3 run_tests.py --dev rxe0 --gid 0 -v test_rdmacm)
        else
            cmd=(env "LD_LIBRARY_PATH=$RG_RUN/lib" ROCE_DEVICES=rxe0=udp:127.0.0.61
                 /usr/bin/python3 run_tests.py --dev rxe0 --gid 0 -v "$f")
        fi
        (cd "$RG_RUN/suite/tests" && sh "$HERE/cellrun.sh" server "pyverbs:$f" 300 -- "${cmd[@]}") >>"$OURS_LOG" 2>&1
        rg_log "pyverbs: ours: $(grep "^@@CELL pyverbs:$f " "$OURS_LOG" || echo "$f: no result")"
    done
    rg_phase_end "ours (host)" >>"$TIMES"
fi

rg_sides_wait $((JOB_SECS + 150)) g1
rg_phase_end "guest (boot+suite)" >>"$TIMES"

# ---------------------------------------------------------------- the table
RXE_LOG="$RG_RUN/sides/g1/result.log"
echo
echo "== timings =="
cat "$TIMES"
echo "guest: $(rg_side_times g1)"
awk -v a="$T_ALL0" -v b="$(rg_now)" 'BEGIN{printf "total %.1f s\n", b-a}'
grep -m1 '^@@PYVERBS' "$RXE_LOG" || true
echo
# Known failures, each with its reason (any other failure in either column fails the run):
# - rxe: test_qp_ex_rc_atomic_write: rdma-core 44's rxe provider accepts IBV_QP_EX_WITH_ATOMIC_WRITE, but
#   Linux 6.1's rxe does not implement the ATOMIC WRITE opcode (added in 6.2): the work request completes
#   with IBV_WC_LOC_QP_OP_ERR. The drop-in library refuses the send op at ibv_create_qp_ex (EOPNOTSUPP: skip).
# - ours: test_rdmacm_async_traffic_external_qp: the test moves its own QP with rdma_init_qp_attr and calls
#   rdma_establish; this project's CM moves the QP itself (README, "A drop-in librdmacm.so.1").
args=(--rxe "$RXE_LOG" --allow rxe:test_qp_ex_rc_atomic_write --allow ours:test_rdmacm_async_traffic_external_qp)
[ "$OURS" -eq 0 ] || args+=(--ours "$OURS_LOG")
rc=0
python3 "$HERE/pyverbs_table.py" "${args[@]}" --files "${FILES[@]}" >"$RG_RUN/table.md" || rc=$?
cat "$RG_RUN/table.md"
if [ -z "$FILTER" ] && [ "$GID" = 1 ]; then
    cp "$RG_RUN/table.md" "$CACHE/pyverbs-latest.md"
    cp "$RXE_LOG" "$CACHE/pyverbs-rxe-latest.log"
    [ "$OURS" -eq 0 ] || cp "$OURS_LOG" "$CACHE/pyverbs-ours-latest.log"
fi
echo "run folder: $RG_RUN (sides/g1/console.log, result.log; ours.log; table.md)"
if [ "${#RG_SIDES_FAILED[@]}" -gt 0 ]; then
    echo "pyverbs: the guest did not finish"
    exit 1
fi
[ "$rc" -eq 0 ] || { echo "pyverbs: not as expected: $(grep '^Not as expected' "$RG_RUN/table.md")"; exit 1; }
echo "pyverbs: done"
