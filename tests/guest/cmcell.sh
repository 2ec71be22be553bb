#!/bin/sh
# cmcell.sh: the sides of the matrix's RDMA CM cells that are not a tool run as given (tests/guest/matrix.sh,
# cells *:unreachable:*). POSIX sh: /job/cmcell.sh in the guest (busybox ash) and tests/guest/cmcell.sh on the
# host. Every form ends on its own; the caller (cellrun) bounds its time.
#
#   cmcell.sh expect EVENT TOOL ARGS...  TOOL (rping, ucmatose) must FAIL with RDMA_CM_EVENT_<EVENT> (e.g.
#                                        UNREACHABLE: its REQ went unanswered through every CM retry): prints
#                                        the tool's output and how long it took; exits 0 only if the tool
#                                        exited non-zero and printed that event.
#   cmcell.sh as-is PORT TOOL ARGS...    runs TOOL as given (one whose port is fixed, udaddy's 7174); PORT:
#                                        the cell's, unused.
#   cmcell.sh no-roce-socket PORT        no UDP socket of this network namespace holds port 4791 (so nothing
#                                        answers RoCEv2 here); PORT: the cell's port, only printed.
#   cmcell.sh rxe-del PORT               removes rxe0 (`rdma link del rxe0`) and checks that no RDMA device
#                                        is left.
#   cmcell.sh no-rdma-device PORT        no RDMA device exists (after rxe-del).
set -u
no_device() {
    n="$(ls /sys/class/infiniband 2>/dev/null | wc -l)"
    [ "$n" -eq 0 ] || { echo "cmcell: RDMA devices present: $(ls /sys/class/infiniband)"; return 1; }
}
case "${1:-}" in
    expect)
        event="$2"
        shift 2
        t0="$(cut -d' ' -f1 /proc/uptime)"
        rc=0
        out="$("$@" 2>&1)" || rc=$?
        secs="$(awk -v a="$t0" -v b="$(cut -d' ' -f1 /proc/uptime)" 'BEGIN{printf "%.1f", b-a}')"
        echo "$out"
        case "$out" in
            *"RDMA_CM_EVENT_$event"*)
                if [ "$rc" -ne 0 ]; then
                    echo "cmcell: RDMA_CM_EVENT_$event after $secs s (rc=$rc), as expected"
                    exit 0
                fi
                echo "cmcell: RDMA_CM_EVENT_$event printed but the tool exited 0 after $secs s"
                exit 1 ;;
        esac
        echo "cmcell: no RDMA_CM_EVENT_$event after $secs s (rc=$rc)"
        exit 1 ;;
    as-is)
        shift 2
        exec "$@" ;;
    no-roce-socket)
        # /proc/net/udp{,6}: "sl local_address:PORT ..." with the port in hex (4791 = 0x12B7).
        if awk 'NR > 1 && $2 ~ /:12B7$/ {found = 1} END {exit !found}' /proc/net/udp /proc/net/udp6; then
            echo "cmcell: a UDP socket holds port 4791 here:"
            awk 'NR == 1 || $2 ~ /:12B7$/' /proc/net/udp /proc/net/udp6
            exit 1
        fi
        echo "cmcell: no UDP socket on port 4791 in this namespace (cell port $2)" ;;
    rxe-del)
        rdma link del rxe0 || exit 1
        no_device || exit 1
        echo "cmcell: rxe0 removed, no RDMA device left (cell port $2)" ;;
    no-rdma-device)
        no_device || exit 1
        echo "cmcell: no RDMA device: nothing here answers RoCEv2 (cell port $2)" ;;
    *)
        echo "usage: cmcell.sh expect EVENT TOOL... | as-is PORT TOOL... | no-roce-socket PORT | rxe-del PORT | no-rdma-device PORT" >&2
        exit 2 ;;
esac
