#!/usr/bin/env bash
# The IB verbs run: this project's libibverbs backend (hca::ibverbs, `--link verbs:rxe0`) driving Linux
# soft-RoCE in a QEMU TCG guest, against this project's software HCA on the host (`--link udp:`), over a
# bridge in a network namespace that this script creates and deletes.
#
#   bash tests/guest/verbs.sh [--cells REGEX] [--list]
#
# Cells, in one guest boot (g1, 198.18.0.1) and one host job (198.18.0.254):
#   conformance:verbs-rxe0      verbs-conformance --link verbs:rxe0 (both sides of every case on rxe0, its QPs
#                               talking through rxe's loopback) --compare the records the host wrote with
#                               --link fabric: every case passes its checks and agrees with the software
#                               engine field for field, except what tests/src/conformance KNOWN_DIFFERENCES
#                               lists for verbs:rxe0 (with the reason).
#   coll-perf:all-reduce:N-ranks   coll-perf all-reduce --link verbs:rxe0 with 2 and 4 ranks in the guest,
#                               sizes 8 B .. 256 KiB, -c 1 (every rank's result checked).
#   rdma-perf:T-bw:verbs-ROLE   rdma-perf T-bw (write, read, send) --link verbs:rxe0 in the guest against
#                               rdma-perf --link udp: on the host, the guest's side as client and as server
#                               (perftest's TCP exchange; both sides' completions must all succeed).
#   rdma-pingpong:rc:verbs-ROLE rdma-pingpong --rc -c (data checked on both sides) likewise.
# The guest's binaries (release, stripped) and the libraries its base archive lacks ride in the job folder
# (/job/bin, /job/lib; tests/guest/lib.sh rg_guest_start copies the whole folder).
#
# Environment: ROCE_GUEST_CACHE (as setup.sh), ROCE_VERBS_BIN_DIR (a folder holding rdma-perf, rdma-pingpong,
# coll-perf and verbs-conformance; default: build them with `cargo build --release` into $CARGO_TARGET_DIR or
# <repo>/target), ROCE_VERBS_JOB_SECS (bound on the guest's job, 600), ROCE_VERBS_CELL_SECS (one side of one
# cell, 90). As root on Debian 12; runs tests/guest/setup.sh first (cached).
# Output: the time of each phase and a table (cell | result | reason); exits 1 on any failure. The table of
# the last full run: <cache>/verbs-latest.tsv, the conformance output <cache>/verbs-conformance-latest.txt.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=lib.sh
. "$HERE/lib.sh"

JOB_SECS="${ROCE_VERBS_JOB_SECS:-600}"
CELL_SECS="${ROCE_VERBS_CELL_SECS:-90}"
GUEST_IP=198.18.0.1 HOST_IP=198.18.0.254 PFX=24 LINK_MTU=4200
GUEST_MAC=52:54:00:52:00:01 HOST_MAC=52:54:00:52:00:fe
TOOLS=(rdma-perf rdma-pingpong coll-perf verbs-conformance)

# ---------------------------------------------------------------- the cells
# SOLO[i]="NAME|GUEST CMD": guest-only cells, run first.
SOLO=()
SOLO+=("conformance:verbs-rxe0|verbs-conformance --link verbs:rxe0 --compare /job/fabric-records.txt")
for n in 2 4; do
    SOLO+=("coll-perf:all-reduce:$n-ranks|coll-perf all-reduce --link verbs:rxe0 --ranks $n -b 8 -e 256K -f 8 -n 2 -w 1 -c 1 -T 60")
done
# PAIRS[i]="NAME|GUEST ROLE|GUEST ARGS|HOST ARGS": the server side gets -p PORT, the client side -p PORT and
# the server's address. rdma-perf -u 20: a local ACK timeout of 4.3 s, so a TCG guest that falls seconds
# behind does not exhaust the retries (as tests/guest/matrix.sh).
PAIRS=()
both() {  # NAME GUEST-ARGS HOST-ARGS
    PAIRS+=("$1:verbs-client|client|$2|$3")
    PAIRS+=("$1:verbs-server|server|$2|$3")
}
for t in write read send; do
    both "rdma-perf:$t-bw" "rdma-perf $t-bw --link verbs:rxe0 -s 65536 -n 20 -u 20 --timeout $CELL_SECS" \
        "rdma-perf $t-bw --link udp:$HOST_IP -s 65536 -n 20 -u 20 --timeout $CELL_SECS"
done
both "rdma-pingpong:rc" "rdma-pingpong --rc --link verbs:rxe0 -s 4096 -n 20 -c --timeout $CELL_SECS" \
    "rdma-pingpong --rc --link udp:$HOST_IP -s 4096 -n 20 -c --timeout $CELL_SECS"

FILTER="" LIST=0
while [ $# -gt 0 ]; do
    case "$1" in
        --cells) FILTER="${2:?--cells needs a regex}"; shift 2 ;;
        --list) LIST=1; shift ;;
        -h|--help) sed -n '2,28p' "$0"; exit 0 ;;
        *) rg_die "unknown argument $1 (see --help)" ;;
    esac
done
if [ -n "$FILTER" ]; then
    rg_cells_matching SOLO "$FILTER"
    rg_cells_matching PAIRS "$FILTER"
fi
if [ "$LIST" -eq 1 ]; then
    for c in "${SOLO[@]+"${SOLO[@]}"}"; do IFS='|' read -r n g <<<"$c"; echo "$n"; echo "    guest: $g"; done
    for c in "${PAIRS[@]+"${PAIRS[@]}"}"; do
        IFS='|' read -r n r g o <<<"$c"
        echo "$n"; echo "    guest ($r): $g"; echo "    host: $o"
    done
    exit 0
fi
[ $((${#SOLO[@]} + ${#PAIRS[@]})) -gt 0 ] || rg_die "no cell matches '$FILTER'"
[ "$(id -u)" -eq 0 ] || rg_die "verbs: must run as root (network namespaces, taps)"

# ---------------------------------------------------------------- setup and build
rg_run_start

rg_phase_begin "build"
if [ -n "${ROCE_VERBS_BIN_DIR:-}" ]; then
    BIN_DIR="$ROCE_VERBS_BIN_DIR"
else
    BIN_DIR="${CARGO_TARGET_DIR:-$RG_REPO/target}/release"
    (cd "$RG_REPO" && rg_step 1800 "cargo build --release -p hca -p collectives -p tests --bins" \
        cargo build --release -p hca -p collectives -p tests --bins) || rg_die "building the tools failed"
fi
JOB="$RG_RUN/job-g1"
rg_job_new "$JOB"
mkdir -p "$JOB/bin" "$JOB/lib"
for b in "${TOOLS[@]}"; do
    [ -x "$BIN_DIR/$b" ] || rg_die "no $b in $BIN_DIR"
    # Copies: a build running meanwhile must not change the binaries under a run. The host runs them from
    # $RG_RUN/bin, the guest stripped ones from /job/bin.
    cp "$BIN_DIR/$b" "$RG_RUN/bin/$b"
    strip -o "$JOB/bin/$b" "$BIN_DIR/$b" || rg_die "cannot strip $b"
done
# The libraries of the binaries that the base archive lacks (libgcc_s); libibverbs and the rxe provider
# are in it (tests/guest/setup.sh), loaded at run time.
BASE_LIBS="$(zcat "$CACHE/initramfs.cpio.gz" | cpio -t --quiet 2>/dev/null | sed 's|.*/||' | sort -u)"
for lib in $(ldd "${TOOLS[@]/#/$BIN_DIR/}" | awk '/=> \//{print $3}' | sort -u); do
    grep -qxF "$(basename "$lib")" <<<"$BASE_LIBS" || cp -L "$lib" "$JOB/lib/"
done
rg_phase_end "build" >>"$TIMES"

rg_phase_begin "conformance reference (fabric)"
REF="$JOB/fabric-records.txt"
rg_step 300 "verbs-conformance --link fabric --records-out" \
    "$RG_RUN/bin/verbs-conformance" --link fabric --records-out "$REF" || rg_die "the fabric reference run failed"
rg_phase_end "conformance reference (fabric)" >>"$TIMES"

NS="rg-vb-$$-$RANDOM"
rg_netns_create "$NS"
rg_bridge_add "$NS" br0 "$LINK_MTU"
ip -n "$NS" link set br0 address "$HOST_MAC"
ip -n "$NS" addr add "$HOST_IP/$PFX" dev br0
rg_tap_add "$NS" br0 tap1 "$LINK_MTU"

# ---------------------------------------------------------------- jobs
# shellcheck disable=SC2016 # expanded in the guest
rg_job_cmd "$JOB" 'export PATH="/job/bin:$PATH" LD_LIBRARY_PATH=/job/lib'
rg_job_cmd "$JOB" "echo \"@@VERBS \$(ibv_devices 2>&1 | tr '\\n' ' ')\""
rg_job_new "$RG_RUN/job-host"
prev=""
for c in "${SOLO[@]+"${SOLO[@]}"}"; do
    IFS='|' read -r name gcmd <<<"$c"
    read -r -a g <<<"$gcmd"
    rg_job_cell "$JOB" client "$name" "$((CELL_SECS * 3))" "${g[@]}"
    prev="$name"
done
# The first pair waits out the guest-only cells: bounded by the whole job.
rg_job_pairs "$JOB" 18800 "$prev" "$JOB_SECS" "${PAIRS[@]+"${PAIRS[@]}"}"

# ---------------------------------------------------------------- boot and run
rg_phase_begin "guest+host (boot+cells)"
rg_log "verbs: ${#SOLO[@]} guest cells + ${#PAIRS[@]} host<->guest cells; g1 ($GUEST_IP) booting; run folder $RG_RUN"
rg_guest_start g1 "$NS" tap1 "$GUEST_MAC" "$GUEST_IP/$PFX" "$LINK_MTU" "$JOB" "$JOB_SECS"
SIDES=(g1)
if [ ${#PAIRS[@]} -gt 0 ]; then
    rg_host_start host "$NS" "$RG_RUN/job-host" $((JOB_SECS + 120))
    SIDES+=(host)
fi
rg_sides_wait $((JOB_SECS + 150)) "${SIDES[@]}"
rg_phase_end "guest+host (boot+cells)" >>"$TIMES"

# ---------------------------------------------------------------- verdicts
R="$RG_RUN/sides/g1/result.log"
v="$(grep -m1 '^@@VERBS' "$R" || true)"
if grep -q 'rxe0' <<<"$v"; then rg_row "ibv_devices" PASS "${v#@@VERBS }"
else rg_row "ibv_devices" FAIL "no rxe0 in the guest: ${v:-no @@VERBS line}"; fi
for c in "${SOLO[@]+"${SOLO[@]}"}"; do
    name="${c%%|*}"
    k="$(rg_side_cell g1 "$name")"
    out="$(rg_side_output g1 "$name")"
    if [ -z "$k" ]; then
        rg_row "$name" FAIL "no result (guest stopped before this cell, or its setup failed)"
        continue
    fi
    case "$name" in
        conformance:*)
            printf '%s\n' "$out" >"$RG_RUN/conformance.txt"
            sum="$(grep -E '^# [0-9]+ passed' <<<"$out" | tail -n1 | sed 's/^# //')"
            allowed="$(grep -c '^# allowed difference' <<<"$out" || true)"
            why="${sum:-no summary line}; $allowed allowed differences"
            if [ "$(rg_field rc "$k")" != 0 ]; then
                why="$why: $(grep -E '^(FAIL|DIFF) ' <<<"$out" | head -n 3 | tr '\n' ';' | cut -c1-300)"
            fi
            ;;
        *)
            why="$(rg_field secs "$k")s: $(grep -E '^ +[0-9]+ +[0-9]+' <<<"$out" | tail -n 1 | sed 's/  */ /g' | cut -c1-90)"
            [ "$(rg_field rc "$k")" = 0 ] || why="rc=$(rg_field rc "$k"): $(rg_reason g1 "$name")"
            ;;
    esac
    if [ "$(rg_field rc "$k")" = 0 ]; then rg_row "$name" PASS "$why"; else rg_row "$name" FAIL "$why"; fi
done
for c in "${PAIRS[@]+"${PAIRS[@]}"}"; do
    IFS='|' read -r name grole _ <<<"$c"
    if [ "$grole" = server ]; then v="$(rg_verdict "$name" g1 host)"; else v="$(rg_verdict "$name" host g1)"; fi
    rg_row "$name" "${v%%|*}" "${v#*|}"
done
for f in "${RG_SIDES_FAILED[@]+"${RG_SIDES_FAILED[@]}"}"; do
    rg_row "side $f" FAIL "did not finish: see $RG_RUN/sides/$f/"
done

# ---------------------------------------------------------------- report
echo
echo "== timings =="
cat "$TIMES"
echo "guest: $(rg_side_times g1)"
awk -v a="$T_ALL0" -v b="$(rg_now)" 'BEGIN{printf "total %.1f s\n", b-a}'
echo
rg_table "verbs run: hca::ibverbs on rxe0 (guest g1, $GUEST_IP) <-> the software HCA (host, udp:$HOST_IP), link MTU $LINK_MTU"
if [ -z "$FILTER" ]; then
    rg_table_save "$CACHE/verbs-latest.tsv"
    [ ! -f "$RG_RUN/conformance.txt" ] || cp "$RG_RUN/conformance.txt" "$CACHE/verbs-conformance-latest.txt"
fi
echo "run folder: $RG_RUN (sides/g1/console.log, result.log; conformance.txt)"
if [ "$RG_FAILS" -gt 0 ]; then
    rg_console_tail g1 40
    echo "verbs: $RG_FAILS of ${#RG_ROWS[@]} rows failed"
    exit 1
fi
echo "verbs: all ${#RG_ROWS[@]} rows passed"
