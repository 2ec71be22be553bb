# shellcheck shell=bash
# Functions of the QEMU guest harness (bash; `source` it). Names start with rg_ ("rxe guest").
#
# A cell is one tool run between two SIDES, a server and a client. A side is either a TCG guest running
# Linux soft-RoCE (rxe0) or a process on the host inside the harness's network namespace (where this
# project's own tools will run). Both sides run the same kind of JOB: a list of cells run in order, each a
# line `cellrun ROLE NAME SECS -- CMD ...` (tests/guest/cellrun.sh). Every cell has its own TCP port, so a
# client that runs late or early only ever meets its own server.
#
# Building blocks:
#   rg_run_init                                  make $RG_RUN, install the cleanup trap
#   rg_run_start                                 setup.sh, then rg_run_init; sets T_ALL0, CACHE, TIMES
#   rg_netns_create NS                           a namespace, deleted by the trap (also on failure/timeout)
#   rg_bridge_add NS BR MTU [ADDR/PFX]           a bridge in it; its address is where a host-side tool binds
#   rg_tap_add NS BR TAP MTU                     a tap on the bridge, for one guest
#   rg_job_new JOB; rg_job_cell JOB ROLE NAME SECS CMD...; rg_job_cmd JOB LINE   write a job
#   rg_job_hold JOB PORT SECS / rg_job_release JOB NAME ADDR PORT SECS   keep a guest up for a host job
#   rg_job_barrier JOB PORT SECS / rg_job_go JOB GUEST PREVCELL ADDR PORT SECS   start a cell on both together
#   rg_job_pairs JOB PORT PREVCELL SECS CELL...  write guest/host cells into JOB and job-host, started together
#   rg_cells_matching ARRAY REGEX                keep the cells of ARRAY whose name matches REGEX (--cells)
#   rg_guest_start SIDE NS TAP MAC ADDR/PFX MTU JOB SECS    boot a guest running JOB (in background;
#                                                 RG_GUEST_LAYERS: extra cpio archives, RG_GUEST_MEM: MiB, 768)
#   rg_host_start SIDE NS JOB SECS               run JOB on the host inside NS (in background)
#   rg_side_wait SIDE SECS                       wait (bounded) for a side; fails if it did not finish
#   rg_sides_wait SECS SIDE...                   wait for several; stop all once one broke (fail fast)
#   rg_side_cell SIDE CELL / rg_side_output SIDE CELL     a cell's @@CELL line / its tool output
#   rg_verdict CELL SERVER_SIDE CLIENT_SIDE      "PASS|reason" or "FAIL|reason" (which side failed, and why)
#   rg_console_tail SIDE [N]                     the last N console lines of a guest
#   rg_capture_start NS IF FILE SECS / rg_capture_stop    a bounded pcap (classic format) on the bridge
#   rg_pcap_checks PCAP WANT_V6 WANT_4K [WANT_1K]  tshark checks over a capture, as table rows
#   rg_row NAME PASS|FAIL REASON; rg_table TITLE print the result table; $RG_FAILS counts failed rows
#   rg_rows_failed_sides                         a FAIL row for each side in RG_SIDES_FAILED
#   rg_table_save FILE; rg_reference_verdict CELL   keep the table; the newest reference verdict of a cell
# Files of one run: $RG_RUN/sides/SIDE/{result.log,console.log,qemu.log,cmdline,pid,...}.

RG_HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
RG_REPO="$(cd "$RG_HERE/../.." && pwd)"
# Run folders kept under <cache>/runs (each holds its capture, up to a few hundred MB): the newest 2.
RG_KEEP_RUNS="${ROCE_GUEST_KEEP_RUNS:-2}"

rg_cache_dir() { echo "${ROCE_GUEST_CACHE:-$RG_REPO/.cache/guest}"; }
rg_now() { date +%s.%N | cut -c1-14; }
rg_log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
rg_die() { rg_log "FAILED: $*"; exit 1; }

# rg_step SECS DESCRIPTION CMD...: runs CMD bounded by SECS, its output into a log; on failure says what
# failed (and whether it timed out) with the last lines of that output.
rg_step() {
    local secs="$1" desc="$2" rc=0 log
    shift 2
    log="$(mktemp "${TMPDIR:-/tmp}/rg-step.XXXXXX")"
    timeout --kill-after=10 "$secs" "$@" >"$log" 2>&1 || rc=$?
    if [ "$rc" -ne 0 ]; then
        if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
            rg_log "step timed out after ${secs}s: $desc"
        else
            rg_log "step failed (rc=$rc): $desc"
        fi
        tail -n 30 "$log" | sed 's/^/    | /' >&2
        rm -f "$log"
        return "$rc"
    fi
    rm -f "$log"
}

# Phase timing: rg_phase_begin NAME ... rg_phase_end NAME prints "phase NAME S s" on stdout.
declare -gA RG_PHASE_T0=()
rg_phase_begin() { RG_PHASE_T0["$1"]="$(rg_now)"; }
rg_phase_end() {
    awk -v n="$1" -v a="${RG_PHASE_T0[$1]}" -v b="$(rg_now)" 'BEGIN{printf "phase %-20s %7.1f s\n", n, b-a}'
}

# ---------------------------------------------------------------- run folder, cleanup
RG_NETNS=()
RG_PIDS=()
# rg_run_init: makes $RG_RUN (a fresh folder under <cache>/runs, the newest $RG_KEEP_RUNS kept), points
# <cache>/runs/latest at it, and installs the cleanup trap (EXIT; INT and TERM exit through it).
rg_run_init() {
    local cache old
    cache="$(rg_cache_dir)"
    mkdir -p "$cache/runs"
    # shellcheck disable=SC2012
    for old in $(ls -1d "$cache"/runs/2* 2>/dev/null | sort -r | tail -n +"$RG_KEEP_RUNS"); do
        # A run whose harness (the pid ending its name) is still going is not pruned: several
        # harness scripts may share one cache.
        ! kill -0 "${old##*-}" 2>/dev/null || continue
        rm -rf "$old"
    done
    RG_RUN="$cache/runs/$(date +%Y%m%d-%H%M%S)-$$"
    mkdir -p "$RG_RUN/sides" "$RG_RUN/bin"
    ln -sfn "$RG_RUN" "$cache/runs/latest"
    # Host-side jobs call `cellrun` by name, as guests do.
    printf '#!/bin/sh\nexec sh %q "$@"\n' "$RG_HERE/cellrun.sh" >"$RG_RUN/bin/cellrun"
    chmod +x "$RG_RUN/bin/cellrun"
    trap 'rg_cleanup' EXIT
    trap 'rg_log "interrupted"; exit 130' INT TERM
}
# rg_tree PID: PID and all its descendants (nested `timeout`s each lead their own process group, so a
# group kill would miss them).
rg_tree() {
    local c
    echo "$1"
    for c in $(ps -o pid= --ppid "$1" 2>/dev/null); do rg_tree "$c"; done
}
rg_alive() { ps -o stat= -p "$1" 2>/dev/null | grep -qv Z; }  # PID: running (not gone, not a zombie)
# rg_kill_tree PID: TERM to PID and its descendants, KILL to what is left after 5 s.
rg_kill_tree() {
    local pids p
    pids="$(rg_tree "$1")"
    # shellcheck disable=SC2086
    kill -TERM $pids 2>/dev/null || true
    for _ in $(seq 1 50); do
        for p in $pids; do rg_alive "$p" && break; p=""; done
        [ -n "$p" ] || return 0
        sleep 0.1
    done
    # shellcheck disable=SC2086
    kill -KILL $pids 2>/dev/null || true
}
# rg_forget PID: drops a reaped child from RG_PIDS (its number may be reused: never signal it again).
rg_forget() {
    local p keep=()
    for p in "${RG_PIDS[@]}"; do [ "$p" = "$1" ] || keep+=("$p"); done
    RG_PIDS=("${keep[@]+"${keep[@]}"}")
}
# rg_cleanup: stops every process this harness started (by pid, with their descendants: guests' QEMU,
# host jobs, the capture), then deletes its namespaces.
rg_cleanup() {
    local p ns
    for p in "${RG_PIDS[@]}"; do
        rg_kill_tree "$p"
    done
    RG_PIDS=()
    for ns in "${RG_NETNS[@]}"; do
        ip netns del "$ns" 2>/dev/null || true
    done
    RG_NETNS=()
}

# rg_run_start: starts a harness run: T_ALL0 (its start, rg_now), setup.sh (rg_die if it fails), CACHE
# (rg_cache_dir), rg_run_init, and TIMES ($RG_RUN/times.txt, which begins with setup.sh's output).
rg_run_start() {
    T_ALL0="$(rg_now)"
    SETUP_OUT="$(bash "$RG_HERE/setup.sh")" || rg_die "setup.sh failed"
    CACHE="$(rg_cache_dir)"
    rg_run_init
    TIMES="$RG_RUN/times.txt"
    echo "$SETUP_OUT" >"$TIMES"
}

# ---------------------------------------------------------------- network namespace, bridge, taps
rg_netns_create() {  # NS
    ip netns add "$1" || rg_die "cannot create network namespace $1"
    RG_NETNS+=("$1")
    ip -n "$1" link set lo up
}
rg_bridge_add() {  # NS BR MTU [ADDR/PFX]
    ip -n "$1" link add "$2" type bridge || rg_die "cannot add bridge $2 in $1"
    # Forward at once: no STP listening/learning delay on the ports.
    ip -n "$1" link set "$2" type bridge stp_state 0 forward_delay 0 2>/dev/null || true
    ip -n "$1" link set "$2" mtu "$3" up
    [ -z "${4:-}" ] || ip -n "$1" addr add "$4" dev "$2"
}
rg_tap_add() {  # NS BR TAP MTU
    ip -n "$1" tuntap add "$3" mode tap || rg_die "cannot add tap $3 in $1"
    ip -n "$1" link set "$3" mtu "$4" master "$2" up || rg_die "cannot attach tap $3 to $2"
}

# ---------------------------------------------------------------- jobs: what a side runs
rg_job_new() {  # JOBDIR
    mkdir -p "$1"
    printf '#!/bin/sh\n# generated by tests/guest/lib.sh\n' >"$1/run.sh"
}
rg_job_cell() {  # JOBDIR ROLE NAME SECS CMD [ARGS...]: appends one cellrun line
    local job="$1" role="$2" name="$3" secs="$4" a line
    shift 4
    line="cellrun $role $name $secs --"
    for a in "$@"; do line+=" $(printf '%q' "$a")"; done
    echo "$line" >>"$job/run.sh"
}
rg_job_cmd() {  # JOBDIR SHELL-LINE: appends a raw line (a sleep, a diagnostic command)
    echo "$2" >>"$1/run.sh"
}
# rg_job_hold JOBDIR PORT SECS: (guest job) at this point, wait until someone connects to TCP PORT (at most
# SECS): keeps a guest up until a host-side job that checks it (rg_job_release) is through with it.
rg_job_hold() {
    {
        echo "echo '@@HOLD port=$2'"
        echo "timeout $3 nc -l -p $2 </dev/null >/dev/null 2>&1; echo \"@@RELEASED rc=\$?\""
    } >>"$1/run.sh"
}
# rg_job_release JOBDIR NAME ADDR PORT SECS: (host job) a cell that connects to ADDR:PORT, retrying each
# second for at most SECS, to let a guest that holds there go on.
rg_job_release() {
    rg_job_cell "$1" client "$2" "$5" bash -c "until (exec 3<>/dev/tcp/$3/$4) 2>/dev/null; do sleep 1; done; echo released $3:$4"
}

# A per-cell barrier between a guest job and a host job that run the same cell list (tests/guest/matrix.sh):
# each cell starts on both sides together, so that a side that fails a cell fast never runs ahead into the
# next cell while its peer still waits out the previous one.
# rg_job_barrier JOBDIR PORT SECS: (guest job) wait, at most SECS, until the host connects to TCP PORT.
rg_job_barrier() {
    echo "timeout $3 nc -l -p $2 </dev/null >/dev/null 2>&1 || echo '@@BARRIER port=$2 rc='\$?" >>"$1/run.sh"
}
# rg_job_go JOBDIR GUEST PREVCELL ADDR PORT SECS: (host job) wait until guest side GUEST has reported
# PREVCELL (its @@CELL line; none for the first cell), then connect to ADDR:PORT (the guest's barrier),
# retrying each 0.2 s; all bounded by SECS.
rg_job_go() {
    local log="$RG_RUN/sides/$2/result.log" wait=""
    [ -z "$3" ] || wait="until grep -q -F '@@CELL $3 ' '$log' || grep -q '^@@DONE' '$log'; do sleep 0.2; done; "
    echo "timeout $6 bash -c $(printf '%q' "${wait}until (exec 3<>/dev/tcp/$4/$5) 2>/dev/null; do sleep 0.2; done") || echo '@@BARRIER go port=$5 rc='\$?" >>"$1/run.sh"
}
# rg_job_pairs GUEST_JOBDIR PORT PREVCELL SECS CELL...: writes each CELL "NAME|GUEST_ROLE|GUEST_ARGS|OUR_ARGS"
# into the guest's job and $RG_RUN/job-host, on its own port from PORT up (its barrier on port + 1000).
# Both sides start a cell together: the host once the guest is through with the previous cell (PREVCELL
# for the first; empty: none). The barrier and the go are each bounded by SECS; the server runs
# $CELL_SECS, the client $CELL_SECS + 30, against $GUEST_IP / $HOST_IP.
# A cell whose arguments hold @PORT@ (RDMA CM tools: rping's -a, ucmatose's -s/-b) gets its port put there
# instead, and no server address appended: such a cell names both sides' addresses itself. A side's
# seconds may be given as a fifth field (a cell that waits out a CM's retries).
rg_job_pairs() {
    local job="$1" port="$2" prev="$3" secs="$4" c name grole gargs oargs csecs g o
    shift 4
    for c in "$@"; do
        IFS='|' read -r name grole gargs oargs csecs <<<"$c"
        csecs="${csecs:-$CELL_SECS}"
        if [[ "$gargs$oargs" == *@PORT@* ]]; then
            read -r -a g <<<"${gargs//@PORT@/$port}"
            read -r -a o <<<"${oargs//@PORT@/$port}"
            rg_job_barrier "$job" "$((port + 1000))" "$secs"
            rg_job_go "$RG_RUN/job-host" g1 "$prev" "$GUEST_IP" "$((port + 1000))" "$secs"
            prev="$name"
            if [ "$grole" = server ]; then
                rg_job_cell "$job" server "$name" "$csecs" "${g[@]}"
                rg_job_cell "$RG_RUN/job-host" client "$name" "$((csecs + 30))" "${o[@]}"
            else
                rg_job_cell "$RG_RUN/job-host" server "$name" "$csecs" "${o[@]}"
                rg_job_cell "$job" client "$name" "$((csecs + 30))" "${g[@]}"
            fi
            port=$((port + 1))
            continue
        fi
        read -r -a g <<<"$gargs"
        read -r -a o <<<"$oargs"
        rg_job_barrier "$job" "$((port + 1000))" "$secs"
        rg_job_go "$RG_RUN/job-host" g1 "$prev" "$GUEST_IP" "$((port + 1000))" "$secs"
        prev="$name"
        if [ "$grole" = server ]; then
            rg_job_cell "$job" server "$name" "$CELL_SECS" "${g[@]}" -p "$port"
            rg_job_cell "$RG_RUN/job-host" client "$name" "$((CELL_SECS + 30))" "${o[@]}" -p "$port" "$GUEST_IP"
        else
            rg_job_cell "$RG_RUN/job-host" server "$name" "$CELL_SECS" "${o[@]}" -p "$port"
            rg_job_cell "$job" client "$name" "$((CELL_SECS + 30))" "${g[@]}" -p "$port" "$HOST_IP"
        fi
        port=$((port + 1))
    done
}

# ---------------------------------------------------------------- sides: guests and host
# rg_guest_start SIDE NS TAP MAC ADDR/PFX MTU JOBDIR SECS
#   Boots a TCG guest under `ip netns exec NS` whose virtio-net NIC is TAP (host_mtu 4200, so path MTU 4096
#   works), with eth0 at ADDR/PFX and MTU, running JOBDIR/run.sh bounded by SECS (QEMU itself is bounded by
#   SECS + 60). Returns at once. Files in $RG_RUN/sides/SIDE: console.log (serial 0: kernel and init),
#   result.log (serial 1: @@ lines and tool output only), qemu.log, cmdline.
rg_guest_start() {
    local side="$1" ns="$2" tap="$3" mac="$4" addr="$5" mtu="$6" job="$7" secs="$8"
    local cache d kernel initrd append
    cache="$(rg_cache_dir)"
    d="$RG_RUN/sides/$side"
    kernel="$cache/kernel/vmlinuz"
    initrd="$cache/initramfs.cpio.gz"
    [ -f "$kernel" ] && [ -f "$initrd" ] || rg_die "no kernel/initramfs in $cache: run tests/guest/setup.sh"
    # The whole job folder becomes /job: run.sh and whatever rides beside it (tests/guest/verbs.sh puts
    # stripped release binaries in bin/, the libraries the base archive lacks in lib/, input files).
    rm -rf "$d/stage/job"
    mkdir -p "$d/stage/job"
    cp -a "$job/." "$d/stage/job/"
    # The job rides as a second cpio archive appended to the cached initramfs (the kernel unpacks both).
    (cd "$d/stage" && find job | cpio -o -H newc --quiet -R 0:0 | gzip -1 >"$d/job.cpio.gz") \
        || rg_die "cannot pack the job of guest $side"
    # RG_GUEST_LAYERS: more archives (space-separated paths) between the base and the job, e.g. the Python
    # layer of tests/guest/pyverbs.sh; the base archive itself stays as setup.sh built it.
    # shellcheck disable=SC2086 # a list of paths without spaces
    cat "$initrd" ${RG_GUEST_LAYERS:-} "$d/job.cpio.gz" >"$d/initrd.gz"
    : >"$d/console.log"
    : >"$d/result.log"
    echo guest >"$d/kind"
    append="console=ttyS0 quiet panic=-1 mitigations=off roce.name=$side roce.ip=$addr roce.mtu=$mtu roce.timeout=$secs"
    echo "$append" >"$d/cmdline"
    ip netns exec "$ns" timeout --kill-after=5 $((secs + 60)) \
        qemu-system-x86_64 -accel tcg,thread=multi -cpu max -smp 1 -m "${RG_GUEST_MEM:-768}" -no-reboot -nographic -nodefaults \
        -monitor none -serial "file:$d/console.log" -serial "file:$d/result.log" \
        -kernel "$kernel" -initrd "$d/initrd.gz" -append "$append" \
        -netdev "tap,id=n0,ifname=$tap,script=no,downscript=no" \
        -device "virtio-net-pci,netdev=n0,mac=$mac,romfile=,host_mtu=4200" \
        </dev/null >"$d/qemu.log" 2>&1 &
    echo $! >"$d/pid"
    RG_PIDS+=("$!")
    rg_now >"$d/t_start"
}
# rg_host_start SIDE NS JOBDIR SECS: runs JOBDIR/run.sh on the host inside NS, bounded by SECS, in
# background; its output goes to $RG_RUN/sides/SIDE/result.log, closed by "@@DONE rc=N" as a guest's is.
rg_host_start() {
    local side="$1" ns="$2" job="$3" secs="$4" d
    d="$RG_RUN/sides/$side"
    mkdir -p "$d"
    echo host >"$d/kind"
    : >"$d/result.log"
    # $! is `timeout` itself (ip netns exec execs it); rg_cleanup and rg_side_wait stop it with its tree.
    # shellcheck disable=SC2016 # $1 and $? belong to the inner shell
    ip netns exec "$ns" timeout --kill-after=5 "$secs" env PATH="$RG_RUN/bin:$PATH" \
        sh -c 'sh "$1"; echo "@@DONE rc=$?"' job "$job/run.sh" </dev/null >>"$d/result.log" 2>&1 &
    echo $! >"$d/pid"
    RG_PIDS+=("$!")
    rg_now >"$d/t_start"
}
# rg_side_wait SIDE SECS: waits until the side's process exited, at most SECS (then stops it). Succeeds
# when the side reported @@DONE; otherwise says what failed and prints the console tail of a guest.
rg_side_wait() {
    local side="$1" secs="$2" d pid deadline
    d="$RG_RUN/sides/$side"
    pid="$(cat "$d/pid")"
    deadline=$(($(date +%s) + secs))
    while kill -0 "$pid" 2>/dev/null && [ "$(date +%s)" -lt "$deadline" ]; do sleep 0.5; done
    if kill -0 "$pid" 2>/dev/null; then
        rg_log "side $side: still running$([ "$secs" -gt 0 ] && echo " after ${secs}s"), stopping it"
        rg_kill_tree "$pid"
    fi
    wait "$pid" 2>/dev/null || true
    rg_forget "$pid"
    # The side's end: the last write to its result log (@@DONE), not when this wait noticed it.
    [ -f "$d/t_end" ] || stat -c %.3Y "$d/result.log" >"$d/t_end" 2>/dev/null || rg_now >"$d/t_end"
    rm -f "$d/initrd.gz"
    if grep -q '^@@SETUP-FAILED' "$d/result.log"; then
        rg_log "side $side: guest setup failed: $(grep -m1 '^@@SETUP-FAILED' "$d/result.log")"
        rg_console_tail "$side" 40
        return 1
    fi
    if ! grep -q '^@@DONE' "$d/result.log"; then
        rg_log "side $side: did not finish (no @@DONE)$([ -f "$d/qemu.log" ] && echo "; qemu: $(tail -n 3 "$d/qemu.log" | tr '\n' ' ')")"
        rg_console_tail "$side" 40
        return 1
    fi
}
# rg_sides_wait SECS SIDE...: waits for several sides at once, at most SECS. Fails fast: once one side has
# ended without @@DONE, or a guest reported @@SETUP-FAILED, the others are stopped (their peer is gone, so
# they could only wait out their timeouts). Then checks each side as rg_side_wait does; RG_SIDES_FAILED
# lists those that did not finish.
RG_SIDES_FAILED=()
rg_sides_wait() {
    local secs="$1" deadline side pid running broken=""
    shift
    deadline=$(($(date +%s) + secs))
    while :; do
        running=0
        for side in "$@"; do
            pid="$(cat "$RG_RUN/sides/$side/pid")"
            if grep -q '^@@SETUP-FAILED' "$RG_RUN/sides/$side/result.log"; then
                broken="$side"
            elif kill -0 "$pid" 2>/dev/null; then
                running=1
            elif ! grep -q '^@@DONE' "$RG_RUN/sides/$side/result.log"; then
                broken="$side"
            fi
        done
        [ "$running" = 1 ] && [ -z "$broken" ] && [ "$(date +%s)" -lt "$deadline" ] || break
        sleep 0.5
    done
    if [ -n "$broken" ] && [ "$running" = 1 ]; then
        rg_log "side $broken ended without finishing: stopping the other sides"
    elif [ "$running" = 1 ]; then
        rg_log "sides still running after ${secs}s: stopping them"
    fi
    RG_SIDES_FAILED=()
    for side in "$@"; do
        rg_side_wait "$side" 0 || RG_SIDES_FAILED+=("$side")
    done
}
rg_side_cell() {  # SIDE CELL: the side's "@@CELL CELL ..." line (empty if it never got there)
    awk -v n="$2" '$1 == "@@CELL" && $2 == n {print; exit}' "$RG_RUN/sides/$1/result.log"
}
rg_side_output() {  # SIDE CELL: the tool output of one cell on one side
    awk -v p="@@OUT $2| " 'index($0, p) == 1 {print substr($0, length(p) + 1)}' "$RG_RUN/sides/$1/result.log"
}
rg_console_tail() {  # SIDE [N]: a guest's serial console (a host side has none: its result.log instead)
    local f="$RG_RUN/sides/$1/console.log"
    [ -f "$f" ] || f="$RG_RUN/sides/$1/result.log"
    echo "---- tail of side $1 ($f) ----" >&2
    tail -n "${2:-30}" "$f" | tr -d '\r' | sed 's/^/    | /' >&2
    echo "----" >&2
}
# rg_side_times SIDE: "boot=S ready=S wall=S" (guest: kernel start to @@BOOT / @@READY as the guest saw
# it; wall: the whole run of the side, host clock).
rg_side_times() {
    local d="$RG_RUN/sides/$1" boot ready
    boot="$(sed -n 's/^@@BOOT .*uptime=\([0-9.]*\).*/\1/p' "$d/result.log" | head -n1)"
    ready="$(sed -n 's/^@@READY .*uptime=\([0-9.]*\).*/\1/p' "$d/result.log" | head -n1)"
    awk -v b="${boot:--}" -v r="${ready:--}" -v s="$(cat "$d/t_start")" -v e="$(cat "$d/t_end" 2>/dev/null || echo 0)" \
        'BEGIN{printf "boot=%ss ready=%ss wall=%.1fs", b, r, e-s}'
}

# ---------------------------------------------------------------- verdicts and the table
rg_field() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<<"$2"; }
# rg_reason SIDE CELL: one line from a side's output: its last error-looking line, else its last line.
rg_reason() {
    local out line
    out="$(rg_side_output "$1" "$2")"
    line="$(grep -i -E "fail|error|couldn't|unable|invalid|not supported|mismatch|timeout|denied" <<<"$out" | tail -n 1 || true)"
    [ -n "$line" ] || line="$(grep -v '^[[:space:]]*$' <<<"$out" | tail -n 1 || true)"
    [ -n "$line" ] || line="(no output)"
    echo "$line" | sed -e 's/^[[:space:]]*//' -e 's/[[:space:]]*$//' -e 's/[[:space:]]\+/ /g' | cut -c1-110
}
# rg_summary SIDE CELL: the result line of a passing side (pingpong's usec/iter, perftest's numbers).
rg_summary() {
    local out line
    out="$(rg_side_output "$1" "$2")"
    line="$(grep -E 'usec/iter' <<<"$out" | tail -n 1 || true)"
    [ -n "$line" ] || line="$(grep -E '^[[:space:]]*[0-9]+[[:space:]]+[0-9]+[[:space:]]+[0-9.]+' <<<"$out" | tail -n 1 || true)"
    [ -n "$line" ] || line="$(grep -v '^[[:space:]]*$' <<<"$out" | tail -n 1 || true)"
    echo "$line" | sed -e 's/^[[:space:]]*//' -e 's/[[:space:]]*$//' -e 's/[[:space:]]\+/ /g' | cut -c1-90
}
# rg_verdict CELL SERVER_SIDE CLIENT_SIDE: prints "PASS|<client secs>s: <result line>" or
# "FAIL|server SIDE rc=N [timed out]: <reason>; client SIDE rc=N ...: <reason>" (each side that failed);
# a cell passes when both sides exited 0.
rg_verdict() {
    local cell="$1" sv="$2" cl="$3" s k why=""
    s="$(rg_side_cell "$sv" "$cell")"
    k="$(rg_side_cell "$cl" "$cell")"
    [ -n "$s" ] || why="no result from server $sv"
    [ -n "$k" ] || why="${why:+$why, }no result from client $cl"
    if [ -n "$why" ]; then
        echo "FAIL|$why (side stopped before this cell, or its setup failed)"
    elif [ "$(rg_field rc "$s")" = 0 ] && [ "$(rg_field rc "$k")" = 0 ]; then
        echo "PASS|$(rg_field secs "$k")s: $(rg_summary "$cl" "$cell")"
    else
        local sw="" kw=""
        [ "$(rg_field rc "$s")" = 0 ] || sw="server $sv rc=$(rg_field rc "$s")$([ "$(rg_field timeout "$s")" = 1 ] && echo " timed out"): $(rg_reason "$sv" "$cell")"
        [ "$(rg_field rc "$k")" = 0 ] || kw="client $cl rc=$(rg_field rc "$k")$([ "$(rg_field timeout "$k")" = 1 ] && echo " timed out"): $(rg_reason "$cl" "$cell")"
        echo "FAIL|$sw${sw:+${kw:+; }}$kw"
    fi
}
RG_ROWS=()
RG_FAILS=0
rg_row() {  # NAME PASS|FAIL REASON (also reported on stderr at once, so a long run shows its progress)
    RG_ROWS+=("$1|$2|$3")
    [ "$2" = PASS ] || RG_FAILS=$((RG_FAILS + 1))
    echo "  row ${#RG_ROWS[@]}: $2 $1${3:+ ($3)}" >&2
}
# rg_rows_failed_sides: a FAIL row "side SIDE" for each side in RG_SIDES_FAILED: its @@SETUP-FAILED line,
# else where to look.
rg_rows_failed_sides() {
    local side
    for side in "${RG_SIDES_FAILED[@]+"${RG_SIDES_FAILED[@]}"}"; do
        rg_row "side $side" FAIL "$(grep -m1 -E '^@@SETUP-FAILED' "$RG_RUN/sides/$side/result.log" || echo "did not finish: see $RG_RUN/sides/$side/")"
    done
}
# rg_cells_matching ARRAY REGEX: keeps the cells ("NAME|...") of the array named ARRAY whose NAME matches
# REGEX.
rg_cells_matching() {
    local -n rg_cells_="$1"
    local kept=() c
    for c in "${rg_cells_[@]}"; do [[ "${c%%|*}" =~ $2 ]] && kept+=("$c"); done
    rg_cells_=("${kept[@]+"${kept[@]}"}")
}
# rg_table_save FILE: the rows as tab-separated "cell, PASS|FAIL, reason" lines (a later run against this
# project's stack looks up the reference verdict of the same cell there, to tell whose fault a failure is).
rg_table_save() {
    local r n v why
    : >"$1"
    for r in "${RG_ROWS[@]}"; do
        IFS='|' read -r n v why <<<"$r"
        printf '%s\t%s\t%s\n' "$n" "$v" "$why" >>"$1"
    done
}
# rg_reference_verdict CELL: the verdict of CELL in the newest reference run ("PASS", "FAIL" or "none").
rg_reference_verdict() {
    local f
    f="$(rg_cache_dir)/reference-latest.tsv"
    [ -f "$f" ] && awk -F'\t' -v c="$1" '$1 == c {print $2; found=1; exit} END{if (!found) print "none"}' "$f" \
        || echo none
}
rg_table() {  # TITLE
    local w=4 r n v why
    for r in "${RG_ROWS[@]}"; do n="${r%%|*}"; [ ${#n} -le "$w" ] || w=${#n}; done
    echo "== $1 =="
    printf "| %-${w}s | %-6s | %s\n" cell result reason
    for r in "${RG_ROWS[@]}"; do
        IFS='|' read -r n v why <<<"$r"
        printf "| %-${w}s | %-6s | %s\n" "$n" "$v" "$why"
    done
}

# ---------------------------------------------------------------- capture and its checks
RG_CAPTURE_PID=""
rg_capture_start() {  # NS IF FILE SECS: a classic pcap (-P) of IF; promiscuous: a bridge shows what it forwards
    ip netns exec "$1" timeout --kill-after=5 -s INT "$4" \
        dumpcap -q -P -i "$2" -w "$3" -a "duration:$4" -a filesize:262144 >"$3.log" 2>&1 &
    RG_CAPTURE_PID=$!
    RG_PIDS+=("$!")
    # dumpcap needs a moment before it sees frames; wait until the file exists (bounded).
    for _ in $(seq 1 50); do [ -s "$3" ] && break; sleep 0.1; done
}
rg_capture_stop() {
    [ -n "$RG_CAPTURE_PID" ] || return 0
    sleep 1
    kill -INT "$RG_CAPTURE_PID" 2>/dev/null || true
    for _ in $(seq 1 50); do rg_alive "$RG_CAPTURE_PID" || break; sleep 0.1; done
    kill -KILL "$RG_CAPTURE_PID" 2>/dev/null || true
    wait "$RG_CAPTURE_PID" 2>/dev/null || true
    rg_forget "$RG_CAPTURE_PID"
    RG_CAPTURE_PID=""
}
# rg_pcap_checks PCAP WANT_V6 WANT_4K [WANT_1K]: tshark over the capture, as table rows: RoCEv2 frames
# present; IPv6 ones present (WANT_V6=1); frames of a full 4096-byte (WANT_4K=1) and 1024-byte (WANT_1K=1)
# path MTU payload present; none malformed; no expert
# error but the UDP checksum 0 that rxe puts on RoCEv2 over IPv6 (the ICRC covers those packets).
rg_pcap_checks() {
    local pcap="$1" want6="$2" want4k="$3" want1k="${4:-0}" n_roce n_v6 n_zero6 n_4k n_1k n_bad other
    if [ ! -s "$pcap" ]; then
        rg_row "pcap" FAIL "no capture (see $pcap.log)"
        return
    fi
    # rpcordma's heuristic would claim some RDMA payloads and judge them as RPC; that is not what runs here.
    local ts=(timeout 120 tshark -n --disable-protocol rpcordma -r "$pcap")
    n_roce="$("${ts[@]}" -Y 'udp.dstport == 4791' 2>/dev/null | wc -l)"
    n_v6="$("${ts[@]}" -Y 'ipv6 && udp.dstport == 4791' 2>/dev/null | wc -l)"
    n_zero6="$("${ts[@]}" -Y 'ipv6 && udp.dstport == 4791 && udp.checksum == 0' 2>/dev/null | wc -l)"
    n_4k="$("${ts[@]}" -Y 'udp.dstport == 4791 && frame.len > 4000' 2>/dev/null | wc -l)"
    # A full 1024-byte payload: 1024 + Eth 14 + IPv4 20 / IPv6 40 + UDP 8 + BTH 12 (+ RETH 16) + ICRC 4.
    n_1k="$("${ts[@]}" -Y 'udp.dstport == 4791 && frame.len >= 1082 && frame.len <= 1118' 2>/dev/null | wc -l)"
    n_bad="$("${ts[@]}" -Y '_ws.malformed' 2>/dev/null | wc -l)"
    other="$("${ts[@]}" -Y '_ws.expert.severity == error && !(ipv6 && udp.checksum == 0)' \
        -T fields -e frame.number -e _ws.expert.message 2>/dev/null | head -n 3 | tr '\t\n' ' ;')"
    if [ "$n_roce" -gt 0 ]; then rg_row "pcap: RoCEv2 frames" PASS "$n_roce frames to UDP 4791"
    else rg_row "pcap: RoCEv2 frames" FAIL "no RoCEv2 frame in the capture"; fi
    if [ "$want6" = 1 ]; then
        if [ "$n_v6" -gt 0 ]; then rg_row "pcap: RoCEv2 over IPv6" PASS "$n_v6 frames ($n_zero6 with UDP checksum 0, as rxe sends them)"
        else rg_row "pcap: RoCEv2 over IPv6" FAIL "no IPv6 RoCEv2 frame"; fi
    fi
    if [ "$want1k" = 1 ]; then
        if [ "$n_1k" -gt 0 ]; then rg_row "pcap: 1024-byte PMTU frames" PASS "$n_1k frames of a full 1024-byte payload"
        else rg_row "pcap: 1024-byte PMTU frames" FAIL "no frame of a full 1024-byte payload"; fi
    fi
    if [ "$want4k" = 1 ]; then
        if [ "$n_4k" -gt 0 ]; then rg_row "pcap: 4096-byte PMTU frames" PASS "$n_4k frames longer than 4000 bytes"
        else rg_row "pcap: 4096-byte PMTU frames" FAIL "no frame longer than 4000 bytes"; fi
    fi
    if [ "$n_bad" -eq 0 ]; then rg_row "pcap: tshark malformed" PASS "no frame malformed"
    else rg_row "pcap: tshark malformed" FAIL "$n_bad frames malformed"; fi
    if [ -z "$other" ]; then rg_row "pcap: tshark expert errors" PASS "none besides IPv6 UDP checksum 0"
    else rg_row "pcap: tshark expert errors" FAIL "$other"; fi
}
