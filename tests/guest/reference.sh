#!/usr/bin/env bash
# The reference run: Linux soft-RoCE (rdma_rxe) against Linux soft-RoCE, two QEMU TCG guests on one bridge
# in a network namespace that this script creates and deletes. Every cell runs rdma-core's or perftest's
# tool as server in guest g1 and as client in guest g2. A cell that fails here is a fault of the harness
# (or of rxe), never of this project's stack: when a cell against our stack fails, run this to tell which.
#
#   bash tests/guest/reference.sh [--cells REGEX] [--cell NAME 'TOOL ARGS'] [--list]
#
#   --cells REGEX          run only the cells whose name matches (bash regex)
#   --cell NAME 'ARGS'     add a cell (same args on both sides; the client gets -p PORT and the server address)
#   --list                 print the cells and exit
# Environment: ROCE_GUEST_CACHE (cache folder, default <repo>/.cache/guest), ROCE_REF_JOB_SECS (bound on a
# guest's whole cell list, 420), ROCE_REF_SERVER_SECS (one server side, 60), ROCE_REF_CLIENT_SECS (one
# client side with its connection retries, 90).
#
# As root on Debian 12. Runs tests/guest/setup.sh first (installs/fetches/builds only what is missing).
# One boot per guest runs the whole list of cells in order; each cell has its own TCP port, so a client
# never meets another cell's server, and a client retries connecting until its server listens (bounded).
# The host side (the bridge's address, where this project's tools will run) checks its link to each guest
# with 4200-byte unfragmentable pings, IPv4 and IPv6 link-local.
# A pcap of the bridge is kept at <cache>/runs/<run>/reference.pcap (a run of the whole matrix copies it to
# <cache>/reference-latest.pcap) and checked with tshark; `cargo test -p tests --test guest_reference -- --ignored`
# re-verifies every ICRC in it with the roce crate. The whole matrix's table: <cache>/reference-latest.tsv.
# Prints the time of each phase and a table (cell | result | one-line reason); exits 1 on any failure.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=lib.sh
. "$HERE/lib.sh"

SERVER_SECS="${ROCE_REF_SERVER_SECS:-60}"
CLIENT_SECS="${ROCE_REF_CLIENT_SECS:-90}"   # longer than a server: a late server is still met
JOB_SECS="${ROCE_REF_JOB_SECS:-420}"
SERVER_IP=198.18.0.1 CLIENT_IP=198.18.0.2 BRIDGE_IP=198.18.0.254 PFX=24 LINK_MTU=4200
SERVER_MAC=52:54:00:52:00:01 CLIENT_MAC=52:54:00:52:00:02

# ---------------------------------------------------------------- the matrix
# CELLS[i]="NAME|TOOL ARGS": the same args on both sides; the client appends -p PORT and the server address.
CELLS=()
cell() { CELLS+=("$1|$2"); }
for mtu in 1024 4096; do
    # -c: the tool checks the data it received.
    cell "ibv_rc_pingpong:mtu$mtu:ipv4" "ibv_rc_pingpong -d rxe0 -g 1 -m $mtu -s 4096 -n 10 -c"
    cell "ibv_uc_pingpong:mtu$mtu:ipv4" "ibv_uc_pingpong -d rxe0 -g 1 -m $mtu -s 4096 -n 10 -c"
    # UD has no path MTU option: a message fills one packet of the MTU (-s $mtu; the port runs 4096).
    cell "ibv_ud_pingpong:mtu$mtu:ipv4" "ibv_ud_pingpong -d rxe0 -g 1 -s $mtu -n 10 -c"
    for t in ib_send_bw ib_write_bw ib_read_bw; do
        cell "$t:mtu$mtu:ipv4" "$t -d rxe0 -x 1 -m $mtu -s 4096 -n 5 -F"
    done
    cell "ib_atomic_bw:mtu$mtu:ipv4" "ib_atomic_bw -d rxe0 -x 1 -m $mtu -n 5 -F"
    for t in ib_send_lat ib_write_lat ib_read_lat; do
        cell "$t:mtu$mtu:ipv4" "$t -d rxe0 -x 1 -m $mtu -s 4096 -n 5 -F"
    done
done
# IPv6 link-local GIDs (GID index 0): RoCEv2 over IPv6.
cell "ibv_rc_pingpong:mtu4096:ipv6ll" "ibv_rc_pingpong -d rxe0 -g 0 -m 4096 -s 4096 -n 10 -c"
cell "ib_write_bw:mtu1024:ipv6ll" "ib_write_bw -d rxe0 -x 0 -m 1024 -s 4096 -n 5 -F"

FILTER="" LIST=0 EXTRA=()
while [ $# -gt 0 ]; do
    case "$1" in
        --cells) FILTER="${2:?--cells needs a regex}"; shift 2 ;;
        --cell) EXTRA+=("${2:?--cell needs NAME}|${3:?--cell needs ARGS}"); shift 3 ;;
        --list) LIST=1; shift ;;
        -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
        *) rg_die "unknown argument $1 (see --help)" ;;
    esac
done
if [ -n "$FILTER" ]; then
    rg_cells_matching CELLS "$FILTER"
fi
CELLS+=("${EXTRA[@]+"${EXTRA[@]}"}")
[ ${#CELLS[@]} -gt 0 ] || rg_die "no cell matches '$FILTER'"
for c in "${CELLS[@]}"; do
    [[ "${c%%|*}" =~ ^[A-Za-z0-9_.:@+=-]+$ ]] || rg_die "cell name '${c%%|*}': letters, digits and _.:@+=- only"
done
if [ "$LIST" -eq 1 ]; then
    for c in "${CELLS[@]}"; do echo "${c%%|*}  |  ${c#*|}"; done
    exit 0
fi
[ "$(id -u)" -eq 0 ] || rg_die "reference: must run as root (network namespaces, taps)"

# ---------------------------------------------------------------- setup
rg_run_start

NS="rg-ref-$$-$RANDOM"
rg_netns_create "$NS"
rg_bridge_add "$NS" br0 "$LINK_MTU" "$BRIDGE_IP/$PFX"
rg_tap_add "$NS" br0 tap1 "$LINK_MTU"
rg_tap_add "$NS" br0 tap2 "$LINK_MTU"

# ---------------------------------------------------------------- jobs
rg_job_new "$RG_RUN/job-g1"
rg_job_new "$RG_RUN/job-g2"
port=18515
for c in "${CELLS[@]}"; do
    name="${c%%|*}"
    read -r -a cmd <<<"${c#*|}"
    rg_job_cell "$RG_RUN/job-g1" server "$name" "$SERVER_SECS" "${cmd[@]}" -p "$port"
    rg_job_cell "$RG_RUN/job-g2" client "$name" "$CLIENT_SECS" "${cmd[@]}" -p "$port" "$SERVER_IP"
    port=$((port + 1))
done
# The host side: its link to each guest, full-size frames that must not fragment (4200 = 4172 + 28).
ll6() {  # MAC -> the EUI-64 link-local address the guest's kernel (and rxe's GID 0) uses
    IFS=: read -r a b c d e f <<<"$1"
    printf 'fe80::%x:%x:%x:%x' $(((0x$a ^ 2) << 8 | 0x$b)) $((0x$c << 8 | 0xff)) $((0xfe << 8 | 0x$d)) $((0x$e << 8 | 0x$f))
}
HOST_CELLS=()
rg_job_new "$RG_RUN/job-host"
for g in "g1 $SERVER_IP $SERVER_MAC" "g2 $CLIENT_IP $CLIENT_MAC"; do
    read -r gn gip gmac <<<"$g"
    HOST_CELLS+=("host-link:$gn:ipv4-4200B-DF" "host-link:$gn:ipv6ll-4200B-DF")
    rg_job_cell "$RG_RUN/job-host" client "host-link:$gn:ipv4-4200B-DF" 60 sh -c \
        "until ping -q -c 1 -W 1 $gip >/dev/null 2>&1; do sleep 1; done; ping -c 2 -W 5 -M do -s $((LINK_MTU - 28)) $gip"
    rg_job_cell "$RG_RUN/job-host" client "host-link:$gn:ipv6ll-4200B-DF" 30 \
        ping -6 -c 2 -W 5 -M "do" -s $((LINK_MTU - 48)) "$(ll6 "$gmac")%br0"
done
# Each guest, its cells done, holds until the host side is through with it (so a short cell list cannot
# power a guest off under the host's checks); the host job then lets it go.
HOLD_PORT=18999
for g in "g1 $SERVER_IP" "g2 $CLIENT_IP"; do
    read -r gn gip <<<"$g"
    rg_job_hold "$RG_RUN/job-$gn" "$HOLD_PORT" 120
    rg_job_release "$RG_RUN/job-host" "release:$gn" "$gip" "$HOLD_PORT" "$((JOB_SECS + 60))"
done

# ---------------------------------------------------------------- boot and run
PCAP="$RG_RUN/reference.pcap"
rg_capture_start "$NS" br0 "$PCAP" $((JOB_SECS + 180))
rg_phase_begin "guests (boot+cells)"
rg_log "reference: ${#CELLS[@]} cells; g1 (server, $SERVER_IP) and g2 (client, $CLIENT_IP) booting; run folder $RG_RUN"
rg_guest_start g1 "$NS" tap1 "$SERVER_MAC" "$SERVER_IP/$PFX" "$LINK_MTU" "$RG_RUN/job-g1" "$JOB_SECS"
rg_guest_start g2 "$NS" tap2 "$CLIENT_MAC" "$CLIENT_IP/$PFX" "$LINK_MTU" "$RG_RUN/job-g2" "$JOB_SECS"
rg_host_start host "$NS" "$RG_RUN/job-host" $((JOB_SECS + 150))
rg_sides_wait $((JOB_SECS + 150)) g1 g2 host
rg_phase_end "guests (boot+cells)" >>"$TIMES"
rg_capture_stop


# ---------------------------------------------------------------- verdicts
for c in "${CELLS[@]}"; do
    name="${c%%|*}"
    v="$(rg_verdict "$name" g1 g2)"
    rg_row "$name" "${v%%|*}" "${v#*|}"
    s="$(rg_side_cell g1 "$name")" k="$(rg_side_cell g2 "$name")"
    [ -z "$s" ] || [ -z "$k" ] || echo "cell $name: server $(rg_field secs "$s")s, client $(rg_field secs "$k")s (tries $(rg_field tries "$k"): connection attempts until the server listened)" >>"$TIMES"
done
for name in "${HOST_CELLS[@]}" release:g1 release:g2; do
    k="$(rg_side_cell host "$name")"
    if [ -n "$k" ] && [ "$(rg_field rc "$k")" = 0 ]; then
        rg_row "$name" PASS "$(rg_summary host "$name")"
    else
        rg_row "$name" FAIL "${k:+rc=$(rg_field rc "$k"): }$(rg_reason host "$name")"
    fi
done
rg_rows_failed_sides

rg_phase_begin "pcap check"
want6=0 want4k=0 want1k=0
printf '%s\n' "${CELLS[@]}" | grep -q ':ipv6ll|' && want6=1
printf '%s\n' "${CELLS[@]}" | grep -q ':mtu4096:' && want4k=1
printf '%s\n' "${CELLS[@]}" | grep -q ':mtu1024:' && want1k=1
rg_pcap_checks "$PCAP" "$want6" "$want4k" "$want1k"
rg_phase_end "pcap check" >>"$TIMES"

# ---------------------------------------------------------------- report
echo
echo "== timings =="
cat "$TIMES"
for g in g1 g2; do echo "guest $g: $(rg_side_times $g)"; done
awk -v a="$T_ALL0" -v b="$(rg_now)" 'BEGIN{printf "total %.1f s\n", b-a}'
echo
rg_table "reference run: rxe (g1, server) <-> rxe (g2, client), link MTU $LINK_MTU; host side on br0"
rg_table_save "$RG_RUN/table.tsv"
# The whole matrix (no --cells/--cell) is the reference that later runs compare with. Copies, not links:
# run folders are pruned (the newest few are kept), these stay.
if [ -z "$FILTER" ] && [ ${#EXTRA[@]} -eq 0 ]; then
    cp -f "$PCAP" "$CACHE/reference-latest.pcap" 2>/dev/null || true
    cp -f "$RG_RUN/table.tsv" "$CACHE/reference-latest.tsv"
fi
echo
echo "pcap: $PCAP"
echo "run folder: $RG_RUN (sides/*/console.log, result.log)"
if [ "$RG_FAILS" -gt 0 ]; then
    for g in g1 g2; do rg_console_tail "$g" 25; done
    echo "reference: $RG_FAILS of ${#RG_ROWS[@]} rows failed"
    exit 1
fi
echo "reference: all ${#RG_ROWS[@]} rows passed"
