#!/bin/sh
# rejcheck.sh CLOSED TOOL ARGS...: a perftest client with -R first connects to port CLOSED of the same
# server, where nothing listens (perftest takes the last -p), and must end with RDMA_CM_EVENT_REJECTED
# (event 8: the peer's CM answered the REQ with REJ, reason 8 "invalid service ID"); then TOOL ARGS runs as
# given. Copied into the guest's job folder (/job) by tests/guest/matrix.sh; POSIX sh (busybox ash).
closed="$1"
shift
out="$("$@" -p "$closed" 2>&1)"
echo "$out" | sed 's/^/closed port: /'
case "$out" in
    *"Unexpected CM event bl blka 8"*) echo "rejcheck: REJECTED (8) for port $closed, as expected" ;;
    *) echo "rejcheck: no REJECTED (event 8) for port $closed"; exit 1 ;;
esac
exec "$@"
