#!/bin/sh
# cellrun ROLE NAME SECS -- CMD [ARGS...]: runs one side of one interop cell and reports it in lines that the
# harness parses. POSIX sh: the same file is /bin/cellrun in the guest (busybox ash) and runs on the host
# (`ip netns exec NS tests/guest/cellrun.sh ...`) for a host-side tool.
#
#   ROLE server  runs CMD once, bounded by SECS seconds.
#   ROLE client  runs CMD; while an attempt fails only because the server is not listening yet (rdma-core's
#                "Couldn't connect to HOST:PORT", perftest's "Unable to open file descriptor for socket
#                connection", rping's / ucmatose's "RDMA_CM_EVENT_REJECTED, error 8" and perftest -R's
#                "Unexpected CM event bl blka 8" on its first connection: the peer's CM answered REJ reason
#                8, no listener on the service ID; udaddy's "RDMA_CM_EVENT_UNREACHABLE, error: 1": SIDR_REP
#                status 1, no listener), waits 1 s and tries again, until SECS have
#                passed since the first attempt; each attempt is bounded by the time left. A client never
#                connects to the wrong cell's server because every cell has its own TCP port.
#
# Output (stdout):
#   @@OUT NAME| <line>                                     every line the tool printed (stdout and stderr)
#   @@CELL NAME role=ROLE rc=RC secs=S tries=N timeout=0|1  the verdict of this side; rc=0 means it passed
set -u
if [ $# -lt 5 ] || [ "$4" != "--" ]; then
    echo "usage: cellrun server|client NAME SECS -- CMD [ARGS...]" >&2
    exit 2
fi
role="$1" name="$2" secs="$3"
shift 4
case "$role" in server|client) ;; *) echo "cellrun: bad role $role" >&2; exit 2 ;; esac

uptime_s() { cut -d' ' -f1 /proc/uptime; }
elapsed() { awk -v a="$1" -v b="$(uptime_s)" 'BEGIN{printf "%d", b-a}'; }
elapsed_f() { awk -v a="$1" -v b="$(uptime_s)" 'BEGIN{printf "%.1f", b-a}'; }

out="$(mktemp "${TMPDIR:-/tmp}/cellrun.XXXXXX")"
t0="$(uptime_s)"
tries=0
rc=0
timed_out=0
while :; do
    tries=$((tries + 1))
    left=$((secs - $(elapsed "$t0")))
    if [ "$left" -lt 1 ]; then timed_out=1; rc=124; break; fi
    rc=0
    timeout "$left" "$@" >"$out" 2>&1 || rc=$?
    if [ "$rc" -ne 0 ] && [ "$(elapsed "$t0")" -ge "$secs" ]; then timed_out=1; break; fi
    if [ "$role" = client ] && [ "$rc" -ne 0 ] \
        && grep -q -E -e "Couldn't connect to [^ ]+:[0-9]+" -e "Unable to open file descriptor for socket connection" \
            -e "RDMA_CM_EVENT_REJECTED, error:? 8\$" -e "^Unexpected CM event bl blka 8\$" \
            -e "udaddy: event: RDMA_CM_EVENT_UNREACHABLE, error: 1\$" "$out"; then
        sleep 1
        continue
    fi
    break
done
awk -v n="$name" '{print "@@OUT " n "| " $0}' "$out"
echo "@@CELL $name role=$role rc=$rc secs=$(elapsed_f "$t0") tries=$tries timeout=$timed_out"
rm -f "$out"
exit 0
