#!/usr/bin/env bash
# The conformance matrix: this project's tools (`rdma-pingpong`, `rdma-perf`: the software HCA over the
# kernel UDP link) on the HOST, against rdma-core's and perftest's tools on Linux soft-RoCE (rxe0) in a
# QEMU TCG guest, over a bridge in a network namespace that this script creates and deletes.
#
#   bash tests/guest/matrix.sh [--cells REGEX | --all] [--list]
#
# Every peer tool (ibv_rc/uc/ud_pingpong, ib_send/write/read/atomic_bw, ib_send/write/read_lat) runs
# against ours with our tool as client AND as server, at path MTU 1024 and 4096 with IPv4 GIDs, and at
# MTU 1024 with IPv6 link-local GIDs; bulk cells (many 64 KiB messages); a fault case (our link drops a
# fixed share of the packets it sends, seeded: ROCE_LINK_DROP_PPM / ROCE_LINK_DROP_SEED) where
# ibv_rc_pingpong must still complete with its data checked. Cell names: TOOL:mtuMTU:ipv4|ipv6ll:ours-client|ours-server (the first three parts are the name
# of the same cell rxe-to-rxe in tests/guest/reference.sh; a failing cell says how that one fared in the
# newest reference run, so that a fault of the harness is told from one of ours).
#
# The whole list runs in one guest boot (g1, 198.18.0.1) and one host job (our tools on the bridge's
# address 198.18.0.254 and its link-local fe80::5054:ff:fe52:fe), cell after cell, each on its own TCP
# port. Pingpong cells check the data (-c on both sides). A pcap of the bridge is checked with tshark (no
# frame malformed); `cargo test -p tests --test guest_matrix -- --ignored` also re-verifies every ICRC
# in it (rxe's frames and ours) with the roce crate.
#
# --all: every cell (without it and without --cells: every cell of our own tools and a representative part
# of the drop-in cells, CI_DROPIN below). --cells REGEX selects from all cells (`--cells :drop-in:`: Debian's
# tools on the host over the drop-in libraries; `--cells unreachable`: the dead-peer cells).
# Environment: ROCE_GUEST_CACHE (as setup.sh), ROCE_MATRIX_BIN_DIR (a folder holding rdma-pingpong and
# rdma-perf; default: build them, `cargo build --release -p hca --bins`, into $CARGO_TARGET_DIR or
# <repo>/target), ROCE_MATRIX_JOB_SECS (bound on the cell list, 840), ROCE_MATRIX_CELL_SECS (one side of
# one cell, 60), ROCE_MATRIX_DROP_PPM (the fault case's drop rate, 50000 = 5%).
# Output: the time of each phase and a table (cell | result | one-line reason); exits 1 on any failure.
# The table of the last full run: <cache>/matrix-latest.tsv (and as a markdown grid, one line per peer
# tool: matrix-latest.md), its capture <cache>/matrix-latest.pcap.
# As root on Debian 12; runs tests/guest/setup.sh first (installs/fetches/builds only what is missing).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=lib.sh
. "$HERE/lib.sh"

JOB_SECS="${ROCE_MATRIX_JOB_SECS:-840}"
CELL_SECS="${ROCE_MATRIX_CELL_SECS:-60}"
DROP_PPM="${ROCE_MATRIX_DROP_PPM:-50000}"
GUEST_IP=198.18.0.1 HOST_IP=198.18.0.254 PFX=24 LINK_MTU=4200
GUEST_MAC=52:54:00:52:00:01 HOST_MAC=52:54:00:52:00:fe

ll6() {  # MAC -> the EUI-64 link-local address Linux gives an interface with that MAC
    IFS=: read -r a b c d e f <<<"$1"
    printf 'fe80::%x:%x:%x:%x' $(((0x$a ^ 2) << 8 | 0x$b)) $((0x$c << 8 | 0xff)) $((0xfe << 8 | 0x$d)) $((0x$e << 8 | 0x$f))
}
HOST_LL="$(ll6 "$HOST_MAC")"

# ---------------------------------------------------------------- the matrix
# CELLS[i]="NAME|GUEST ROLE|GUEST TOOL ARGS|OUR TOOL ARGS". The server side gets -p PORT, the client side
# -p PORT and the server's address (ours: 198.18.0.1; the guest's: 198.18.0.254).
CELLS=()
# both NAME GUEST-ARGS OUR-ARGS: the cell with our tool as client (guest serves) and as server.
both() {
    CELLS+=("$1:ours-client|server|$2|$3")
    CELLS+=("$1:ours-server|client|$2|$3")
}
# Our device's address for a GID kind: IPv4 (the IPv4-mapped GID) or the bridge's link-local address.
# ROCE_MATRIX_OUR_LINK=xdp runs our tools on the AF_XDP link on the bridge (`--link xdp:br0`; its GID table is
# rxe's: 1 = the bridge's link-local address, 2 = IPv4, the default) instead of the UDP socket. Its path MTU
# stops at 2048 (4096-byte UMEM frames): run it on the mtu1024 cells.
OUR_LINK="${ROCE_MATRIX_OUR_LINK:-udp}"
link_of() {
    if [ "$OUR_LINK" = xdp ]; then echo "xdp:br0"
    elif [ "$1" = ipv4 ]; then echo "udp:$HOST_IP"; else echo "udp:$HOST_LL"; fi
}
# Our tools' GID option for a GID kind: none on the UDP link (one GID), the link-local one on xdp: for IPv6.
ours_gid() {  # pp|perf GIDKIND
    if [ "$OUR_LINK" = xdp ] && [ "$2" = ipv6ll ]; then
        if [ "$1" = pp ]; then echo "-g 1"; else echo "-x 1"; fi
    fi
}
gidx_of() { if [ "$1" = ipv4 ]; then echo 1; else echo 0; fi; }  # rxe: GID 1 = IPv4, 0 = link-local
ours_tmo="--timeout $CELL_SECS"
# rdma-perf's local ACK timeout (perftest -u): 4.096 us x 2^20 = 4.3 s, so a TCG guest that falls seconds behind
# (bulk cells on a loaded host) does not exhaust retry_cnt 7; rxe itself treats retry_cnt 7 as infinite.
perf_tmo="$ours_tmo -u 20"
pingpong_cells() {  # MTU GIDKIND
    local mtu="$1" g="$2" link gi t
    link="$(link_of "$g")" gi="$(gidx_of "$g")"
    for t in rc uc; do
        both "ibv_${t}_pingpong:mtu$mtu:$g" "ibv_${t}_pingpong -d rxe0 -g $gi -m $mtu -s 4096 -n 10 -c" \
            "rdma-pingpong --$t --link $link $(ours_gid pp "$g") -m $mtu -s 4096 -n 10 -c $ours_tmo"
    done
    # UD has no path MTU option: a message fills one packet of the MTU (-s MTU; both ports run 4096).
    both "ibv_ud_pingpong:mtu$mtu:$g" "ibv_ud_pingpong -d rxe0 -g $gi -s $mtu -n 10 -c" \
        "rdma-pingpong --ud --link $link $(ours_gid pp "$g") -s $mtu -n 10 -c $ours_tmo"
}
perftest_cells() {  # MTU GIDKIND TOOL...
    local mtu="$1" g="$2" link gi t sub size
    shift 2
    link="$(link_of "$g")" gi="$(gidx_of "$g")"
    for t in "$@"; do
        sub="${t#ib_}" sub="${sub//_/-}"
        size="-s 4096"
        [ "$t" != ib_atomic_bw ] || size=""
        both "$t:mtu$mtu:$g" "$t -d rxe0 -x $gi -m $mtu $size -n 5 -F" \
            "rdma-perf $sub --link $link $(ours_gid perf "$g") -m $mtu $size -n 5 $perf_tmo"
    done
}
for mtu in 1024 4096; do
    pingpong_cells "$mtu" ipv4
    perftest_cells "$mtu" ipv4 ib_send_bw ib_write_bw ib_read_bw ib_atomic_bw ib_send_lat ib_write_lat ib_read_lat
done
# Bulk: many multi-packet messages (first/middle/last segmentation at both MTUs, full send windows,
# coalesced ACKs, READ responses of many packets); "TOOL:mtuMTU:ipv4" is still the reference cell.
for mtu in 1024 4096; do
    both "ibv_rc_pingpong:mtu$mtu:ipv4:bulk" "ibv_rc_pingpong -d rxe0 -g 1 -m $mtu -s 65536 -n 50 -c" \
        "rdma-pingpong --rc --link $(link_of ipv4) -m $mtu -s 65536 -n 50 -c $ours_tmo"
    for t in ib_send_bw ib_write_bw ib_read_bw; do
        sub="${t#ib_}" sub="${sub//_/-}"
        both "$t:mtu$mtu:ipv4:bulk" "$t -d rxe0 -x 1 -m $mtu -s 65536 -n 100 -F" \
            "rdma-perf $sub --link $(link_of ipv4) -m $mtu -s 65536 -n 100 $perf_tmo"
    done
done
# Variants of perftest's options that change the out-of-band exchange or the traffic: several QPs (-q),
# few outstanding READs (-o), UC (-c UC), compare-and-swap. (Not -a: its messages of up to 8 MiB take the
# TCG guest longer than the local ACK timeout's 7 retries allow, see tests/guest/README.md.)
variant() {  # NAME GUEST-TOOL-AND-ARGS OUR-SUBCOMMAND-AND-ARGS (both at MTU 4096, IPv4)
    both "$1" "$2 -d rxe0 -x 1 -m 4096 -F" "rdma-perf $3 --link $(link_of ipv4) -m 4096 $perf_tmo"
}
variant ib_write_bw:mtu4096:ipv4:4-qps "ib_write_bw -q 4 -s 16384 -n 20" "write-bw -q 4 -s 16384 -n 20"
variant ib_send_bw:mtu4096:ipv4:4-qps "ib_send_bw -q 4 -s 16384 -n 20" "send-bw -q 4 -s 16384 -n 20"
variant ib_read_bw:mtu4096:ipv4:2-qps-2-outstanding "ib_read_bw -q 2 -o 2 -s 16384 -n 20" "read-bw -q 2 -o 2 -s 16384 -n 20"
# A window of 32 packets: our READs of 64 packets go out as READ requests of 16 (hca engine
# module `requester`), which rxe answers as any READ; as server, rxe's READs of us are unchanged.
variant ib_read_bw:mtu4096:ipv4:read-segments "ib_read_bw -s 262144 -n 10" "read-bw -s 262144 -n 10 --window-budget 32"
variant ib_write_bw:mtu4096:ipv4:uc "ib_write_bw -c UC -s 16384 -n 20" "write-bw -c UC -s 16384 -n 20"
variant ib_send_bw:mtu4096:ipv4:uc "ib_send_bw -c UC -s 16384 -n 20" "send-bw -c UC -s 16384 -n 20"
variant ib_send_lat:mtu4096:ipv4:uc "ib_send_lat -c UC -s 16384 -n 20" "send-lat -c UC -s 16384 -n 20"
variant ib_atomic_bw:mtu4096:ipv4:cmp-and-swap "ib_atomic_bw -A CMP_AND_SWAP -n 20" "atomic-bw -A CMP_AND_SWAP -n 20"
# RDMA CM (perftest -R / --rdma_cm): the messages on an RC QP that rxe's kernel CM (ib_cm, rdma_cm) and
# ours (hca::rdma_cm::CmService) connect, and the test's QP connected by RDMA CM too: REQ / REP / RTU /
# DREQ / DREP on QP1 between the two CMs. No -m (the CM sets the path MTU).
both "ib_write_bw:rdma-cm:ipv4" "ib_write_bw -R -d rxe0 -x 1 -s 4096 -n 5 -F" \
    "rdma-perf write-bw -R --link $(link_of ipv4) -s 4096 -n 5 $perf_tmo"
both "ib_write_bw:rdma-cm:ipv4:2-qps" "ib_write_bw -R -d rxe0 -x 1 -q 2 -s 4096 -n 5 -F" \
    "rdma-perf write-bw -R --link $(link_of ipv4) -q 2 -s 4096 -n 5 $perf_tmo"
both "ib_read_bw:rdma-cm:ipv4" "ib_read_bw -R -d rxe0 -x 1 -s 4096 -n 5 -F" \
    "rdma-perf read-bw -R --link $(link_of ipv4) -s 4096 -n 5 $perf_tmo"
# A closed port: the guest's perftest first connects to a port our side does not listen on and must see
# REJECTED (our CM's REJ, reason 8), then runs the cell (tests/guest/rejcheck.sh, in the guest's /job).
CELLS+=("ib_write_bw:rdma-cm:ipv4:rej-closed-port:ours-server|client|sh /job/rejcheck.sh 18999 ib_write_bw -R -d rxe0 -x 1 -s 4096 -n 5 -F|rdma-perf write-bw -R --link $(link_of ipv4) -s 4096 -n 5 $perf_tmo")
for t in ib_send_bw ib_send_lat ib_write_lat ib_read_lat; do
    sub="${t#ib_}" sub="${sub//_/-}"
    both "$t:rdma-cm:ipv4" "$t -R -d rxe0 -x 1 -s 4096 -n 5 -F" \
        "rdma-perf $sub -R --link $(link_of ipv4) -s 4096 -n 5 $perf_tmo"
done
# IPv6 link-local GIDs (RoCEv2 over IPv6): every tool at MTU 1024, and ibv_rc_pingpong at 4096 (the
# reference run has ibv_rc_pingpong:mtu4096:ipv6ll and ib_write_bw:mtu1024:ipv6ll).
pingpong_cells 1024 ipv6ll
perftest_cells 1024 ipv6ll ib_send_bw ib_write_bw ib_read_bw ib_atomic_bw ib_send_lat ib_write_lat ib_read_lat
both "ibv_rc_pingpong:mtu4096:ipv6ll" "ibv_rc_pingpong -d rxe0 -g 0 -m 4096 -s 4096 -n 10 -c" \
    "rdma-pingpong --rc --link $(link_of ipv6ll) -m 4096 -s 4096 -n 10 -c $ours_tmo"
# The fault case: our link drops DROP_PPM per million of the datagrams it sends, seeded. Only sent
# ones: a dropped receive can be ibv_rc_pingpong's last ACK, which it never sends again once it has
# exited (our last send then exhausts retry_cnt); a dropped send is retransmitted by us, or answered
# again by a peer still waiting for it, and our tools linger 200 ms after their last completion to
# answer the peer's retransmissions (hca::link::udp::DropDirections).
FAULT_ENV="env ROCE_LINK_DROP_PPM=$DROP_PPM ROCE_LINK_DROP_SEED=5 ROCE_LINK_DROP_DIRECTIONS=send"
# (The drop hook is the UDP link's: no fault cells on the AF_XDP link.)
[ "$OUR_LINK" = xdp ] || for role in client server; do
    CELLS+=("fault-drop${DROP_PPM}ppm:ibv_rc_pingpong:mtu1024:ipv4:ours-$role|$([ $role = client ] && echo server || echo client)|ibv_rc_pingpong -d rxe0 -g 1 -m 1024 -s 8192 -n 100 -c|$FAULT_ENV rdma-pingpong --rc --link $(link_of ipv4) -m 1024 -s 8192 -n 100 -c --stats $ours_tmo")
done

# ---------------------------------------------------------------- Debian's tools over the drop-in libraries
# The same unmodified Debian binary on both ends: rxe0 in the guest, and on the host over this project's
# libibverbs.so.1 / librdmacm.so.1 (hca/abi, hca/rdmacm: `dropin ADDR TOOL...` runs TOOL with
# LD_LIBRARY_PATH=<run>/lib and ROCE_DEVICES=rxe0=udp:ADDR, the device's one GID, index 0, being ADDR).
# Cell names: TOOL:mtuMTU:ipv4|ipv6ll:drop-in:ours-client|ours-server (issue 18, verbs with perftest's /
# rdma-core's own TCP exchange) and TOOL:rdma-cm:ipv4|ipv6ll:drop-in:ours-... (issue 19, RDMA CM: rxe's
# kernel CM against ours). `--cells :drop-in:` selects them all.
GUEST_LL="$(ll6 "$GUEST_MAC")"
dropin_of() { if [ "$1" = ipv4 ]; then echo "dropin $HOST_IP"; else echo "dropin $HOST_LL%br0"; fi; }  # a zone: hca::open
dropin_verbs_cells() {  # MTU GIDKIND
    local mtu="$1" g="$2" d gi t size
    d="$(dropin_of "$g")" gi="$(gidx_of "$g")"
    for t in rc uc; do
        both "ibv_${t}_pingpong:mtu$mtu:$g:drop-in" "ibv_${t}_pingpong -d rxe0 -g $gi -m $mtu -s 4096 -n 10 -c" \
            "$d ibv_${t}_pingpong -d rxe0 -g 0 -m $mtu -s 4096 -n 10 -c"
    done
    both "ibv_ud_pingpong:mtu$mtu:$g:drop-in" "ibv_ud_pingpong -d rxe0 -g $gi -s $mtu -n 10 -c" \
        "$d ibv_ud_pingpong -d rxe0 -g 0 -s $mtu -n 10 -c"
    for t in ib_write_bw ib_send_lat ib_read_bw ib_atomic_bw; do
        size="-s 4096"
        [ "$t" != ib_atomic_bw ] || size=""
        both "$t:mtu$mtu:$g:drop-in" "$t -d rxe0 -x $gi -m $mtu $size -n 5 -F" "$d $t -d rxe0 -x 0 -m $mtu $size -n 5 -F"
    done
}
dropin_verbs_cells 1024 ipv4
dropin_verbs_cells 4096 ipv4
dropin_verbs_cells 1024 ipv6ll
# RDMA CM: the tool names both addresses itself (@PORT@: see rg_job_pairs); a link-local address carries
# its scope (the guest's eth0, the host's br0). rping -V checks every ping's data on both sides.
cm_both() {  # NAME GUEST-SERVER GUEST-CLIENT OURS-SERVER OURS-CLIENT [SECS]
    CELLS+=("$1:ours-client|server|$2|$5|${6:-}")
    CELLS+=("$1:ours-server|client|$3|$4|${6:-}")
}
dropin_cm_cells() {  # GIDKIND
    local g="$1" d
    d="$(dropin_of "$g")"
    # ga / ha: the guest's / host's address as it names itself; gh / hg: as the other side names it.
    local ga gh ha hg
    if [ "$g" = ipv4 ]; then ga="$GUEST_IP" gh="$GUEST_IP" ha="$HOST_IP" hg="$HOST_IP"
    else ga="$GUEST_LL%eth0" gh="$GUEST_LL%br0" ha="$HOST_LL%br0" hg="$HOST_LL%eth0"; fi
    cm_both "rping:rdma-cm:$g:drop-in" \
        "rping -s -a $ga -p @PORT@ -C 10 -V -v" "rping -c -a $hg -p @PORT@ -C 10 -V -v" \
        "$d rping -s -a $ha -p @PORT@ -C 10 -V -v" "$d rping -c -a $gh -p @PORT@ -C 10 -V -v"
    cm_both "ucmatose:rdma-cm:$g:drop-in" \
        "ucmatose -b $ga -p @PORT@ -c 2 -C 10" "ucmatose -s $hg -p @PORT@ -c 2 -C 10" \
        "$d ucmatose -b $ha -p @PORT@ -c 2 -C 10" "$d ucmatose -s $gh -p @PORT@ -c 2 -C 10"
    # Port space RDMA_PS_IB (service IDs 0x013F_pppp, RC, as rdma_create_id gives it).
    cm_both "ucmatose-ib:rdma-cm:$g:drop-in" \
        "ucmatose -P ib -b $ga -p @PORT@ -c 2 -C 10" "ucmatose -P ib -s $hg -p @PORT@ -c 2 -C 10" \
        "$d ucmatose -P ib -b $ha -p @PORT@ -c 2 -C 10" "$d ucmatose -P ib -s $gh -p @PORT@ -c 2 -C 10"
}
dropin_cm_cells ipv4
dropin_cm_cells ipv6ll
# UD over SIDR (RDMA_PS_UDP): udaddy's SIDR_REQ / SIDR_REP against rxe's kernel CM, then UD SENDs to the
# resolved QPN / Q_Key. udaddy's port is fixed (7174): cmcell.sh as-is runs it with the cell's port unused.
dropin_udaddy_cells() {  # GIDKIND
    local g="$1" d ga gh ha hg
    d="$(dropin_of "$g")"
    if [ "$g" = ipv4 ]; then ga="$GUEST_IP" gh="$GUEST_IP" ha="$HOST_IP" hg="$HOST_IP"
    else ga="$GUEST_LL%eth0" gh="$GUEST_LL%br0" ha="$HOST_LL%br0" hg="$HOST_LL%eth0"; fi
    cm_both "udaddy:rdma-cm:$g:drop-in" \
        "sh /job/cmcell.sh as-is @PORT@ udaddy -b $ga -C 10" "sh /job/cmcell.sh as-is @PORT@ udaddy -s $hg -C 10" \
        "sh $RG_HERE/cmcell.sh as-is @PORT@ $d udaddy -b $ha -C 10" "sh $RG_HERE/cmcell.sh as-is @PORT@ $d udaddy -s $gh -C 10"
}
dropin_udaddy_cells ipv4
dropin_udaddy_cells ipv6ll
# perftest 4.5's -R is IPv4 only (its client resolves the server with AF_INET: "Address family for
# hostname not supported"), on rxe as on ours: no IPv6 cell. It races, whoever runs it: -R connects twice,
# the exchange connection and then, after a hand-shake over it, the test's own; the server listens again
# only once its last hand-shake SEND has completed (the peer's ACK), while the client connects as soon as
# it has received that SEND. A client that wins gets REJ 8 (no listener yet), and perftest 4.5-0.17 then
# retries with the IDs it has just destroyed (EINVAL here; on Linux a use after free, seen as a SIGSEGV in
# the guest). Against a TCG guest, whose rxe ACKs tens of ms late, our side loses as server now and then
# (the guest's REQ 4.7 ms after its ACK, 22 ms after our SEND) and always wins as client (the guest server
# is slower to listen again; our client's REQ leaves 0.2 ms after the guest's last hand-shake SEND). rxe
# against rxe between two guests fails the same way (REQ 4.2 ms after the SEND, REJ 8, SIGSEGV: README, "Debian's
# tools on both ends"). Our rdma-perf -R server listens before that SEND, so it is never late. These two cells
# run only when --cells names them.
both "ib_write_bw:rdma-cm:ipv4:drop-in" "ib_write_bw -R -d rxe0 -x 1 -s 4096 -n 5 -F" \
    "$(dropin_of ipv4) ib_write_bw -R -d rxe0 -x 0 -s 4096 -n 5 -F"

# A REQ that no CM answers, each way (rping, IPv4; last in the list: the second cell removes the guest's
# rxe0). The guest's rping against the host's address while nothing of ours runs there (the host side
# checks that no UDP socket holds port 4791 in the namespace): rxe's kernel CM resends the REQ
# CMA_MAX_CM_RETRIES (15) times, each after the REQ's timeout (CMA_CM_RESPONSE_TIMEOUT 20: 4.3 s, plus
# twice the packet lifetime), so about 16 x 4.8 s before rping sees UNREACHABLE; neither rping nor the
# kernel 6.1 offers a knob. Then our rping against the guest once rxe0 is removed (`rdma link del`):
# our CM (hca::cm::CmConfig::default(), Linux's values) resends 15 times 4.3 s apart, about 69 s.
UNREACH_SECS=150
CELLS+=("rping:rdma-cm:ipv4:unreachable:ours-absent|client|sh /job/cmcell.sh expect UNREACHABLE rping -c -a $HOST_IP -p @PORT@ -C 1 -V -v|sh $RG_HERE/cmcell.sh no-roce-socket @PORT@|$UNREACH_SECS")
CELLS+=("rxe0-removed:unreachable|server|sh /job/cmcell.sh rxe-del @PORT@|true")
CELLS+=("rping:rdma-cm:ipv4:unreachable:ours-client|server|sh /job/cmcell.sh no-rdma-device @PORT@|sh $RG_HERE/cmcell.sh expect UNREACHABLE $(dropin_of ipv4) rping -c -a $GUEST_IP -p @PORT@ -C 1 -V -v|$UNREACH_SECS")
# The same with our CM's timer set short (ROCE_CM_RESPONSE_TIMEOUT 16: 268 ms, ROCE_CM_MAX_RETRIES 3: four
# REQs, about 1.1 s), the one dead-peer cell tests/ci.sh runs.
CELLS+=("rping:rdma-cm:ipv4:unreachable-fast:ours-client|server|sh /job/cmcell.sh no-rdma-device @PORT@|sh $RG_HERE/cmcell.sh expect UNREACHABLE env ROCE_CM_RESPONSE_TIMEOUT=16 ROCE_CM_MAX_RETRIES=3 $(dropin_of ipv4) rping -c -a $GUEST_IP -p @PORT@ -C 1 -V -v")

# The run without --cells (tests/ci.sh) takes a representative part of the drop-in cells, both roles each:
# every kind of verbs tool (RC and UD pingpong, WRITE, READ, atomics), both MTUs and both GID kinds, and
# rping (IPv4, IPv6 link-local), ucmatose (IPv6 link-local; in RDMA_PS_IB over IPv4), udaddy (IPv4), and our rping
# against the guest without rxe0 with our CM's timer set short (unreachable-fast), about 45 s with the guest's pace. The rest (the other
# drop-in cells, the two unreachable cells at the CMs' default timers, about 70 and 100 s, perftest -R over
# the drop-in libraries, which races: see above) runs with --all, or selected with --cells.
CI_DROPIN='^((ibv_rc_pingpong:mtu(1024|4096):ipv4|ibv_ud_pingpong:mtu1024:ipv6ll|ib_write_bw:mtu4096:ipv4|ib_read_bw:mtu1024:ipv6ll|ib_atomic_bw:mtu1024:ipv4|rping:rdma-cm:ipv(4|6ll)|ucmatose:rdma-cm:ipv6ll|ucmatose-ib:rdma-cm:ipv4|udaddy:rdma-cm:ipv4):drop-in:|rxe0-removed:unreachable$|rping:rdma-cm:ipv4:unreachable-fast:)'
BY_HAND=':drop-in:|:unreachable'
# perftest -R over the drop-in libraries races against the TCG guest (perftest's own race, see above): only
# with --cells.
RACY='^ib_write_bw:rdma-cm:ipv4:drop-in:'
FILTER="" LIST=0 ALL=0
while [ $# -gt 0 ]; do
    case "$1" in
        --cells) FILTER="${2:?--cells needs a regex}"; shift 2 ;;
        --all) ALL=1; shift ;;
        --list) LIST=1; shift ;;
        -h|--help) awk 'NR > 1 && /^set -euo/ {exit} NR > 1' "$0"; exit 0 ;;
        *) rg_die "unknown argument $1 (see --help)" ;;
    esac
done
if [ -n "$FILTER" ]; then
    rg_cells_matching CELLS "$FILTER"
elif [ "$ALL" -eq 1 ]; then
    kept=()
    for c in "${CELLS[@]}"; do [[ "${c%%|*}" =~ $RACY ]] || kept+=("$c"); done
    CELLS=("${kept[@]}")
else
    kept=()
    for c in "${CELLS[@]}"; do
        n="${c%%|*}"
        if ! [[ "$n" =~ $BY_HAND ]] || [[ "$n" =~ $CI_DROPIN ]]; then kept+=("$c"); fi
    done
    CELLS=("${kept[@]}")
fi
[ ${#CELLS[@]} -gt 0 ] || rg_die "no cell matches '$FILTER'"
if [ "$LIST" -eq 1 ]; then
    for c in "${CELLS[@]}"; do
        IFS='|' read -r n r g o secs <<<"$c"
        echo "$n"; echo "    guest ($r): $g"; echo "    ours: $o"; [ -z "$secs" ] || echo "    each side: ${secs} s"
    done
    exit 0
fi
[ "$(id -u)" -eq 0 ] || rg_die "matrix: must run as root (network namespaces, taps)"

# ---------------------------------------------------------------- setup and build
rg_run_start

rg_phase_begin "build our tools"
# cells_any REGEX: some selected cell ("NAME|ROLE|GUEST ARGS|OUR ARGS[|SECS]") matches REGEX (a bash loop:
# no pipe whose writer a `grep -q` could cut short under pipefail).
cells_any() {
    local c
    for c in "${CELLS[@]}"; do [[ "$c" =~ $1 ]] && return 0; done
    return 1
}
if ! cells_any '^[^|]*\|[^|]*\|[^|]*\|([^|]* )?rdma-(pingpong|perf) '; then
    : # only Debian's tools over the drop-in libraries (below): rdma-pingpong / rdma-perf not needed
elif [ -n "${ROCE_MATRIX_BIN_DIR:-}" ]; then
    BIN_DIR="$ROCE_MATRIX_BIN_DIR"
else
    BIN_DIR="${CARGO_TARGET_DIR:-$RG_REPO/target}/release"
    (cd "$RG_REPO" && rg_step 1800 "cargo build --release -p hca --bins" cargo build --release -p hca --bins) \
        || rg_die "building rdma-pingpong and rdma-perf failed"
fi
for b in rdma-pingpong rdma-perf; do
    [ -n "${BIN_DIR:-}" ] || break
    [ -x "$BIN_DIR/$b" ] || rg_die "no $b in $BIN_DIR"
    # Copies: a build running meanwhile must not change the binaries under a run.
    cp "$BIN_DIR/$b" "$RG_RUN/bin/$b"
done
# Debian's tools over the drop-in libraries (the :drop-in: cells): libibverbs.so.1 and librdmacm.so.1
# copied into <run>/lib, and `dropin ADDR TOOL ARGS...` (in <run>/bin, on the host job's PATH) to run one.
if cells_any '^[^|]*:drop-in:'; then
    if [ -n "${ROCE_MATRIX_LIB_DIR:-}" ]; then
        LIB_DIR="$ROCE_MATRIX_LIB_DIR"
    else
        LIB_DIR="${CARGO_TARGET_DIR:-$RG_REPO/target}/release"
        (cd "$RG_REPO" && rg_step 1800 "cargo build --release -p ibverbs-abi -p rdmacm-abi" \
            cargo build --release -p ibverbs-abi -p rdmacm-abi) || rg_die "building the drop-in libraries failed"
    fi
    mkdir -p "$RG_RUN/lib"
    for l in libibverbs.so.1 librdmacm.so.1; do
        [ -e "$LIB_DIR/$l" ] || rg_die "no $l in $LIB_DIR"
        cp -L "$LIB_DIR/$l" "$RG_RUN/lib/$l"
    done
    printf '#!/bin/sh\n# dropin ADDR TOOL ARGS...: TOOL over the drop-in libraries, device rxe0 on ADDR\na="$1"\nshift\nLD_LIBRARY_PATH=%q ROCE_DEVICES="rxe0=udp:$a" exec "$@"\n' \
        "$RG_RUN/lib" >"$RG_RUN/bin/dropin"
    chmod +x "$RG_RUN/bin/dropin"
fi
rg_phase_end "build our tools" >>"$TIMES"

NS="rg-mx-$$-$RANDOM"
rg_netns_create "$NS"
rg_bridge_add "$NS" br0 "$LINK_MTU"
# A fixed MAC gives the bridge a known link-local address; no DAD, so that it is usable at once.
ip -n "$NS" link set br0 address "$HOST_MAC"
ip netns exec "$NS" sysctl -q -w net.ipv6.conf.br0.accept_dad=0 >/dev/null 2>&1 || true
ip -n "$NS" addr add "$HOST_IP/$PFX" dev br0
ip -n "$NS" addr add "$HOST_LL/64" dev br0 nodad 2>/dev/null || true
rg_tap_add "$NS" br0 tap1 "$LINK_MTU"

# ---------------------------------------------------------------- jobs
rg_job_new "$RG_RUN/job-g1"
cp "$HERE/rejcheck.sh" "$RG_RUN/job-g1/rejcheck.sh"
cp "$HERE/cmcell.sh" "$RG_RUN/job-g1/cmcell.sh"
rg_job_new "$RG_RUN/job-host"
rg_job_pairs "$RG_RUN/job-g1" 18700 "" "$((2 * CELL_SECS + 120))" "${CELLS[@]}"
# The guest stays up until the host's last cell is through (its peer must still be on the link: a guest
# that powered off takes the bridge's carrier with it, and the host's last packets would never leave).
rg_job_hold "$RG_RUN/job-g1" 17999 $((2 * CELL_SECS + 120))
rg_job_release "$RG_RUN/job-host" guest-release "$GUEST_IP" 17999 60

# ---------------------------------------------------------------- boot and run
PCAP="$RG_RUN/matrix.pcap"
# On the bridge, except with the AF_XDP link: its frames leave and arrive past br0's packet taps (XDP
# redirects before them; AF_XDP transmits by dev_direct_xmit), so capture on the guest's tap instead.
CAPTURE_DEV=br0
[ "$OUR_LINK" = xdp ] && CAPTURE_DEV=tap1
rg_capture_start "$NS" "$CAPTURE_DEV" "$PCAP" $((JOB_SECS + 180))
rg_phase_begin "guest+host (boot+cells)"
rg_log "matrix: ${#CELLS[@]} cells; g1 ($GUEST_IP) booting, our tools on $HOST_IP / $HOST_LL; run folder $RG_RUN"
rg_guest_start g1 "$NS" tap1 "$GUEST_MAC" "$GUEST_IP/$PFX" "$LINK_MTU" "$RG_RUN/job-g1" "$JOB_SECS"
rg_host_start host "$NS" "$RG_RUN/job-host" $((JOB_SECS + 120))
rg_sides_wait $((JOB_SECS + 150)) g1 host
rg_phase_end "guest+host (boot+cells)" >>"$TIMES"
rg_capture_stop

# ---------------------------------------------------------------- verdicts
for c in "${CELLS[@]}"; do
    IFS='|' read -r name grole _ <<<"$c"
    if [ "$grole" = server ]; then v="$(rg_verdict "$name" g1 host)"; else v="$(rg_verdict "$name" host g1)"; fi
    why="${v#*|}"
    # The reference cell: TOOL:mtuMTU:GID (a bulk or variant cell is compared with its plain one).
    ref="${name#fault-*:}" ref="$(cut -d: -f1-3 <<<"$ref")"
    if [ "${v%%|*}" != PASS ]; then
        why="$why [rxe-to-rxe $ref: $(rg_reference_verdict "$ref")]"
    elif [[ "$name" == fault-* ]]; then
        # The drops must have happened: our tool's --stats prints the link's counters.
        d="$(rg_side_output host "$name" | sed -n 's/.*hook_drops: \([0-9]*\).*hook_drops: \([0-9]*\).*/\1+\2/p' | tail -n1)"
        d="${d:-0}"
        if [ "$(( d ))" -gt 0 ]; then why="$why; our link dropped $(( ${d%+*} )) received + $(( ${d#*+} )) sent datagrams"
        else v="FAIL|"; why="no datagram dropped (is the drop hook on?): $why"; fi
    fi
    rg_row "$name" "${v%%|*}" "$why"
    s="$(rg_side_cell g1 "$name")" k="$(rg_side_cell host "$name")"
    [ -z "$s" ] || [ -z "$k" ] || echo "cell $name: guest $(rg_field secs "$s")s, ours $(rg_field secs "$k")s" >>"$TIMES"
done
rg_rows_failed_sides

rg_phase_begin "pcap check"
want6=0 want4k=0 want1k=0
printf '%s\n' "${CELLS[@]}" | grep -q '^[^|]*:ipv6ll:' && want6=1
printf '%s\n' "${CELLS[@]}" | grep -q '^[^|]*:mtu4096:' && want4k=1
printf '%s\n' "${CELLS[@]}" | grep -q '^[^|]*:mtu1024:' && want1k=1
rg_pcap_checks "$PCAP" "$want6" "$want4k" "$want1k"
# RDMA CM cells: tshark must dissect the CM exchange on QP1 as InfiniBand CM (class 0x07): REQ, REP, RTU,
# DREQ and DREP, over each IP version the selected rdma-cm cells use (malformed frames: the row above).
cm_counts() {  # IPFILTER ATTRIBUTE-ID...: a count per CM attribute (REQ 0x10, REP 0x13, RTU 0x14, DREQ 0x15,
    # DREP 0x16, SIDR_REQ 0x17, SIDR_REP 0x18)
    local f="$1" a n out=""
    shift
    for a in "$@"; do
        n="$(timeout 120 tshark -n --disable-protocol rpcordma -r "$PCAP" \
            -Y "$f && infiniband.mad.mgmtclass == 0x07 && infiniband.mad.attributeid == $a" 2>/dev/null | wc -l)"
        out+="$n "
    done
    echo "${out% }"
}
for v in ipv4 ipv6ll; do
    f=ip; [ "$v" = ipv4 ] || f=ipv6
    if cells_any "^udaddy:rdma-cm:$v:"; then  # UD: SIDR_REQ / SIDR_REP
        read -r q p <<<"$(cm_counts "$f" 0x0017 0x0018)"
        why="SIDR_REQ $q, SIDR_REP $p (tshark: InfiniBand CM over $f)"
        if [ "$q" -gt 0 ] && [ "$p" -gt 0 ]; then rg_row "pcap: SIDR exchange over $v" PASS "$why"
        else rg_row "pcap: SIDR exchange over $v" FAIL "$why"; fi
    fi
    cells_any "^(rping|ucmatose(-ib)?|ib_[a-z_]+):rdma-cm:$v:(drop-in:)?ours-(client|server)\|" || continue
    read -r q p t d r <<<"$(cm_counts "$f" 0x0010 0x0013 0x0014 0x0015 0x0016)"
    why="REQ $q, REP $p, RTU $t, DREQ $d, DREP $r (tshark: InfiniBand CM over $f)"
    if [ "$q" -gt 0 ] && [ "$p" -gt 0 ] && [ "$t" -gt 0 ] && [ "$d" -gt 0 ] && [ "$r" -gt 0 ]; then
        rg_row "pcap: CM exchange over $v" PASS "$why"
    else
        rg_row "pcap: CM exchange over $v" FAIL "$why"
    fi
done
# RDMA_PS_IB cells: their REQs carry port space 0x3F in the IP CM service ID (0x0000_0000_013F_pppp), from
# both sides (REQs from the guest's rxe and from ours).
if cells_any "^ucmatose-ib:rdma-cm:"; then
    ib="$(timeout 120 tshark -n --disable-protocol rpcordma -r "$PCAP" \
        -Y "infiniband.cm.req.serviceid.protocol == 0x3f" -T fields -e ip.src -e ipv6.src 2>/dev/null | sort -u | wc -l)"
    why="REQs with port space RDMA_PS_IB (0x3F) from $ib source addresses (tshark)"
    if [ "$ib" -ge 2 ]; then rg_row "pcap: RDMA_PS_IB service IDs" PASS "$why"
    else rg_row "pcap: RDMA_PS_IB service IDs" FAIL "$why"; fi
fi
rg_phase_end "pcap check" >>"$TIMES"

# ---------------------------------------------------------------- the grid (README "Conformance")
# matrix_grid: the rows again as one line per peer tool, a column per (MTU, GID, variant), each
# "client / server" (our tool's role), in markdown.
matrix_grid() {
    local r n v why tool rest role col fault cols=() tools=() c t line
    declare -A cell=() seen_col=() seen_tool=()
    for r in "${RG_ROWS[@]}"; do
        IFS='|' read -r n v why <<<"$r"
        case "$n" in *:ours-client|*:ours-server) ;; *) continue ;; esac
        role="${n##*:ours-}" rest="${n%:ours-*}" fault=""
        case "$rest" in fault-*) fault="${rest%%:*}" rest="${rest#*:}" ;; esac
        tool="${rest%%:*}" col="${rest#*:}${fault:+:${fault#fault-}}"
        [ -n "${seen_col[$col]:-}" ] || { seen_col[$col]=1; cols+=("$col"); }
        [ -n "${seen_tool[$tool]:-}" ] || { seen_tool[$tool]=1; tools+=("$tool"); }
        cell["$tool|$col|$role"]="${v,,}"
    done
    line="| peer tool (rxe0, guest) |"
    for c in "${cols[@]}"; do
        c="${c/:drop-in/, Debian tool over the drop-in libraries}"
        c="${c/mtu/MTU }" c="${c/:ipv4/, IPv4}" c="${c/:ipv6ll/, IPv6 link-local}" c="${c/:bulk/, bulk}"
        c="${c/:drop/, lossy, drop }" c="${c//:/, }"
        line+=" $c |"
    done
    echo "$line"
    line="|---|"
    for c in "${cols[@]}"; do line+="---|"; done
    echo "$line"
    for t in "${tools[@]}"; do
        line="| $t |"
        for c in "${cols[@]}"; do
            line+=" ${cell[$t|$c|client]:--} / ${cell[$t|$c|server]:--} |"
        done
        echo "$line"
    done
}

# ---------------------------------------------------------------- report
echo
echo "== timings =="
cat "$TIMES"
echo "guest g1: $(rg_side_times g1)"
awk -v a="$T_ALL0" -v b="$(rg_now)" 'BEGIN{printf "total %.1f s\n", b-a}'
echo
rg_table "conformance matrix: ours (host, $HOST_IP / $HOST_LL, $( [ "$OUR_LINK" = xdp ] && echo AF_XDP link || echo UDP link )) <-> rxe0 (guest g1, $GUEST_IP), link MTU $LINK_MTU"
rg_table_save "$RG_RUN/table.tsv"
echo
echo "== the matrix: our tool as client / as server =="
matrix_grid | tee "$RG_RUN/grid.md"
if [ -z "$FILTER" ]; then
    cp -f "$RG_RUN/grid.md" "$CACHE/matrix-latest.md"
    cp -f "$PCAP" "$CACHE/matrix-latest.pcap" 2>/dev/null || true
    cp -f "$RG_RUN/table.tsv" "$CACHE/matrix-latest.tsv"
fi
echo
echo "pcap: $PCAP"
echo "run folder: $RG_RUN (sides/*/result.log, sides/g1/console.log)"
if [ "$RG_FAILS" -gt 0 ]; then
    rg_console_tail g1 25
    echo "matrix: $RG_FAILS of ${#RG_ROWS[@]} rows failed"
    exit 1
fi
echo "matrix: all ${#RG_ROWS[@]} rows passed"
