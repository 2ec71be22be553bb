#!/usr/bin/env bash
# The congested router (issue 22, "End to end through the guest router"): DCQCN on this project's software
# HCA over the kernel UDP link, through a QEMU TCG guest that routes between two host network namespaces
# and whose egress toward the receivers is a shaped bottleneck (HTB) with RED marking ECN (RFC 3168; the
# host kernel has no such qdisc, the guest's Linux 6.1 has sch_red).
#
#   bash tests/guest/router.sh          # as root: about 1.5-3 minutes (two phases in one guest boot)
#
#   ns A (senders)                 ns R (QEMU)                              ns B (receivers)
#   h0 198.18.1.1, .2  -- veth -- bra -- tapa == guest eth0 198.18.1.254
#                                          guest: ip_forward, eth1 egress: htb RATE + red ecn
#                                 brb -- tapb == guest eth1 198.18.2.254 -- veth -- h0 198.18.2.1, .2
#
# Two `rdma-perf write-bw` senders in A (udp:198.18.1.1 and .2, RC, path MTU 1024, -D SECS) write to two
# receivers in B (udp:198.18.2.1 and .2): both flows cross the guest's eth1 egress. The engine marks its
# data packets ECT(0); RED marks them CE above its thresholds; the receivers' notification points answer
# with CNPs (IBTA vol. 1 Annex A17.9.3), which go back through the guest.
#
# Phase "dcqcn": the senders run `--dcqcn LINE` (the reaction point, `DcqcnParams::paper_scaled`, paced at
#   LINE Mb/s each, together above the bottleneck). Checks: both flows complete; CNPs sent by the
#   receivers and received by the senders; RED marked packets; nothing lost: no drop in the guest's
#   qdisc, none on the host's taps, every packet sent was received (the engines' sent_pkts and
#   rcvd_pkts, both directions; go-back-N retries are reported: a guest stalled past the local ACK
#   timeout makes a sender resend what was not lost); no ICRC error;
#   the rates converge: the slower flow has at least MIN_SHARE percent of the faster one's bandwidth.
# Phase "plain": the same without `--dcqcn` (today's default: CNPs counted and ignored, senders unpaced, a
#   window each, together more than RED's byte limit). Checks: both flows still complete (RC's go-back-N
#   recovers) with no ICRC error; the guest's qdisc dropped packets and the senders retransmitted.
# Functional only: TCG's speed is no performance figure, so no check reads a time.
# Known limit: a guest that stalls (TCG on a loaded host) for longer than RED's limit takes at the senders'
# rates (80 KB at 16 Mb/s: 40 ms) finds both windows waiting in its tap and forwards them into RED at once,
# past its limit, with DCQCN as without: the "nothing lost" check then fails (once in five runs, at load
# 16.5; tests/ci.sh runs the cell a second time when it fails).
#
# Environment: ROCE_GUEST_CACHE (as setup.sh); ROCE_ROUTER_BIN_DIR (a folder with rdma-perf; default:
# `cargo build --release -p hca --bin rdma-perf` into $CARGO_TARGET_DIR or <repo>/target);
# ROCE_ROUTER_MBIT (the bottleneck, 20), ROCE_ROUTER_LINE_MBPS (each sender's line rate under DCQCN, 16),
# ROCE_ROUTER_SECS (each flow's -D, 5), ROCE_ROUTER_MIN_SHARE (percent, 50), ROCE_ROUTER_JOB_SECS (bound
# on the guest's whole job, 300).
# Output: the phase times, the counters of each phase and a table (check | PASS/FAIL | figures); exits 1
# on any failure. Files: <cache>/runs/latest/ (sides/g1: the guest's console and result log; hosts/: each
# tool's output), <cache>/router-latest.tsv (the table).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=lib.sh
. "$HERE/lib.sh"

[ "$(id -u)" -eq 0 ] || rg_die "router: must run as root (namespaces, taps, QEMU)"
MBIT="${ROCE_ROUTER_MBIT:-10}"
LINE="${ROCE_ROUTER_LINE_MBPS:-8}"
SECS="${ROCE_ROUTER_SECS:-5}"
MIN_SHARE="${ROCE_ROUTER_MIN_SHARE:-50}"
JOB_SECS="${ROCE_ROUTER_JOB_SECS:-300}"
# RED on the bottleneck (bytes; tc-red(8)): marks CE with a probability rising to PROB between MIN and MAX
# of the average queue, and every ECT packet above MAX; drops only what finds LIMIT bytes queued (ecn
# without harddrop). LIMIT is above one sender's window (--window-budget 64: 64 packets of 1102 bytes,
# 70 KB; a window that cannot fit would be dropped on every go-back-N and its QP fail with
# RETRY_EXC_ERR) and below two (141 KB), so two unpaced senders overflow it; DCQCN's paced senders
# queue far less (about MIN).
RED_LIMIT=80000 RED_MIN=8000 RED_MAX=24000 RED_AVPKT=1100 RED_BURST=8 RED_PROB=0.2
A1=198.18.1.1 A2=198.18.1.2 GA=198.18.1.254 B1=198.18.2.1 B2=198.18.2.2 GB=198.18.2.254
MTU=1500
# iproute2's tc in the guest (busybox's ash prefers its own applet, which has no RED).
TC=/usr/bin/tc
# rdma-perf's local ACK timeout: 4.096 us x 2^18 = 1.07 s, above a full RED queue's delay at the bottleneck
# (100 KB at 20 Mb/s: 40 ms) and a TCG guest's stalls, so only real losses make the senders go back.
PERF=(write-bw -m 1024 -s 65536 -u 18 --window-budget 64 --timeout 60 --stats)

rg_run_start
HOSTS="$RG_RUN/hosts"
mkdir -p "$HOSTS"

# ---------------------------------------------------------------- rdma-perf
rg_phase_begin build
if [ -n "${ROCE_ROUTER_BIN_DIR:-}" ]; then
    BIN_DIR="$ROCE_ROUTER_BIN_DIR"
else
    BIN_DIR="${CARGO_TARGET_DIR:-$RG_REPO/target}/release"
    (cd "$RG_REPO" && rg_step 1800 "cargo build --release -p hca --bin rdma-perf" \
        cargo build --release -p hca --bin rdma-perf) || rg_die "cannot build rdma-perf"
fi
[ -x "$BIN_DIR/rdma-perf" ] || rg_die "no rdma-perf in $BIN_DIR"
cp "$BIN_DIR/rdma-perf" "$RG_RUN/bin/rdma-perf"
rg_phase_end build | tee -a "$TIMES"

# ---------------------------------------------------------------- namespaces, links
NSA="rg-rt-a-$$" NSR="rg-rt-r-$$" NSB="rg-rt-b-$$"
for ns in "$NSA" "$NSR" "$NSB"; do rg_netns_create "$ns"; done
rg_bridge_add "$NSR" bra "$MTU"
rg_bridge_add "$NSR" brb "$MTU"
rg_tap_add "$NSR" bra tapa "$MTU"
rg_tap_add "$NSR" brb tapb "$MTU"
# Taps queue what QEMU has not read yet: a FIFO far longer than any window, so that the guest's qdisc is
# the only place where packets queue up long enough to be marked or dropped (and the taps' drops are
# counted below).
for t in tapa tapb; do tc -n "$NSR" qdisc replace dev "$t" root pfifo limit 10000; done
hostside() {  # NS BRIDGE ADDR1 ADDR2 GATEWAY
    ip -n "$1" link add h0 type veth peer name "v$2" netns "$NSR" || rg_die "cannot add a veth pair to $1"
    ip -n "$NSR" link set "v$2" mtu "$MTU" master "$2" up
    ip -n "$1" link set h0 mtu "$MTU" up
    ip -n "$1" addr add "$3/24" dev h0
    ip -n "$1" addr add "$4/24" dev h0
    ip -n "$1" route add default via "$5"
}
hostside "$NSA" bra "$A1" "$A2" "$GA"
hostside "$NSB" brb "$B1" "$B2" "$GB"

# ---------------------------------------------------------------- the guest: a router
JOB="$RG_RUN/job-g1"
rg_job_new "$JOB"
cat >"$JOB/qdisc.sh" <<EOF
#!/bin/sh
# The bottleneck on eth1 (toward the receivers), made afresh (counters at zero).
set -e
$TC qdisc del dev eth1 root 2>/dev/null || true
# HTB: MBIT in all; RoCEv2 (UDP to 4791, filter below) in class 1:1 under RED with ECN, everything else
# (the tools' TCP exchange, ARP) in 1:2 under a FIFO, so RED's counters are RoCE's alone.
$TC qdisc add dev eth1 root handle 1: htb default 2
$TC class add dev eth1 parent 1: classid 1:10 htb rate ${MBIT}mbit ceil ${MBIT}mbit
$TC class add dev eth1 parent 1:10 classid 1:1 htb rate $((MBIT * 1000 - 500))kbit ceil ${MBIT}mbit
$TC class add dev eth1 parent 1:10 classid 1:2 htb rate 500kbit ceil ${MBIT}mbit
$TC qdisc add dev eth1 parent 1:1 handle 10: red limit $RED_LIMIT min $RED_MIN max $RED_MAX avpkt $RED_AVPKT \\
    burst $RED_BURST probability $RED_PROB bandwidth ${MBIT}mbit ecn
$TC qdisc add dev eth1 parent 1:2 handle 20: pfifo limit 1000
$TC filter add dev eth1 parent 1: protocol ip prio 1 u32 match ip protocol 17 0xff match ip dport 4791 0xffff flowid 1:1
$TC -s qdisc show dev eth1
EOF
cat >"$JOB/setup.sh" <<EOF
#!/bin/sh
set -e
ip addr add $GB/24 dev eth1
ip link set eth1 mtu $MTU up
echo 1 >/proc/sys/net/ipv4/ip_forward
echo 0 >/proc/sys/net/ipv4/conf/all/rp_filter
sh /job/qdisc.sh
# wait (bounded) until eth1 has a carrier
n=0
while [ "\$(cat /sys/class/net/eth1/carrier 2>/dev/null)" != 1 ]; do
    n=\$((n + 1)); [ "\$n" -le 100 ] || { echo "eth1: no carrier"; exit 1; }; sleep 0.1
done
ip route
EOF
cat >"$JOB/stats.sh" <<EOF
#!/bin/sh
$TC -s qdisc show dev eth1
ip -s link show eth1
ip -s link show eth0
EOF
rg_job_cell "$JOB" server router-setup 60 sh /job/setup.sh
rg_job_hold "$JOB" 7001 "$JOB_SECS"
rg_job_cell "$JOB" server stats-dcqcn 60 sh /job/stats.sh
rg_job_cell "$JOB" server router-reset 60 sh /job/qdisc.sh
rg_job_hold "$JOB" 7002 "$JOB_SECS"
rg_job_cell "$JOB" server stats-plain 60 sh /job/stats.sh

# rr_guest_start SIDE MAC_A MAC_B: as rg_guest_start, with two NICs: eth0 on tapa (ADDR $GA), eth1 on tapb.
rr_guest_start() {
    local side="$1" d cache append
    cache="$(rg_cache_dir)"
    d="$RG_RUN/sides/$side"
    mkdir -p "$d/stage/job"
    cp -a "$JOB/." "$d/stage/job/"
    (cd "$d/stage" && find job | cpio -o -H newc --quiet -R 0:0 | gzip -1 >"$d/job.cpio.gz") \
        || rg_die "cannot pack the job of guest $side"
    cat "$cache/initramfs.cpio.gz" "$d/job.cpio.gz" >"$d/initrd.gz"
    : >"$d/console.log"
    : >"$d/result.log"
    echo guest >"$d/kind"
    append="console=ttyS0 quiet panic=-1 mitigations=off roce.name=$side roce.ip=$GA/24 roce.mtu=$MTU roce.timeout=$JOB_SECS"
    echo "$append" >"$d/cmdline"
    ip netns exec "$NSR" timeout --kill-after=5 $((JOB_SECS + 60)) \
        qemu-system-x86_64 -accel tcg,thread=multi -cpu max -smp 1 -m 768 -no-reboot -nographic -nodefaults \
        -monitor none -serial "file:$d/console.log" -serial "file:$d/result.log" \
        -kernel "$cache/kernel/vmlinuz" -initrd "$d/initrd.gz" -append "$append" \
        -netdev "tap,id=n0,ifname=tapa,script=no,downscript=no" \
        -device "virtio-net-pci,netdev=n0,mac=$2,romfile=" \
        -netdev "tap,id=n1,ifname=tapb,script=no,downscript=no" \
        -device "virtio-net-pci,netdev=n1,mac=$3,romfile=" \
        </dev/null >"$d/qemu.log" 2>&1 &
    echo $! >"$d/pid"
    RG_PIDS+=("$!")
    rg_now >"$d/t_start"
}
rg_phase_begin boot
rr_guest_start g1 52:54:00:52:01:01 52:54:00:52:02:01
RES="$RG_RUN/sides/g1/result.log"
# rr_wait_guest PATTERN SECS: until the guest's result log has a line matching PATTERN (bounded; fails
# at once if the guest stopped or its setup failed).
rr_wait_guest() {
    local deadline=$(($(date +%s) + $2)) pid
    pid="$(cat "$RG_RUN/sides/g1/pid")"
    until grep -q -E "$1" "$RES"; do
        if grep -q -E '^@@SETUP-FAILED|^@@DONE' "$RES" || ! kill -0 "$pid" 2>/dev/null \
            || [ "$(date +%s)" -ge "$deadline" ]; then
            rg_log "router: the guest did not reach /$1/ (see $RG_RUN/sides/g1/)"
            rg_console_tail g1 40
            return 1
        fi
        sleep 0.5
    done
}
rr_wait_guest '^@@HOLD port=7001' 240 || rg_die "the guest router did not come up"
grep -q -E '^@@CELL router-setup .* rc=0 ' "$RES" \
    || { rg_side_output g1 router-setup >&2; rg_die "the guest router's setup failed"; }
rg_phase_end boot | tee -a "$TIMES"
rg_log "router: guest up; qdisc: $(rg_side_output g1 router-setup | grep -m1 'qdisc red' || true)"

# ---------------------------------------------------------------- the phases
# rr_phase NAME PORT [SENDER OPTIONS...]: two receivers in B, two senders in A, all bounded; rc and output
# of each in $HOSTS/NAME-{recv,send}{1,2}.{log,rc}.
rr_phase() {
    local name="$1" port="$2" i pids=() p
    shift 2
    for i in 1 2; do
        local b=B$i
        ip netns exec "$NSB" timeout --kill-after=5 $((SECS + 120)) \
            "$RG_RUN/bin/rdma-perf" "${PERF[@]}" --link "udp:${!b}" -p $((port + i)) \
            >"$HOSTS/$name-recv$i.log" 2>&1 </dev/null &
        pids+=("$!")
        RG_PIDS+=("$!")
    done
    for i in 1 2; do
        local a=A$i b=B$i
        ip netns exec "$NSA" timeout --kill-after=5 $((SECS + 120)) \
            "$RG_RUN/bin/rdma-perf" "${PERF[@]}" --link "udp:${!a}" -p $((port + i)) -D "$SECS" "$@" "${!b}" \
            >"$HOSTS/$name-send$i.log" 2>&1 </dev/null &
        pids+=("$!")
        RG_PIDS+=("$!")
    done
    i=0
    for p in "${pids[@]}"; do
        local rc=0
        wait "$p" || rc=$?
        rg_forget "$p"
        if [ "$i" -lt 2 ]; then echo "$rc" >"$HOSTS/$name-recv$((i + 1)).rc"; else echo "$rc" >"$HOSTS/$name-send$((i - 1)).rc"; fi
        i=$((i + 1))
    done
}
rr_release() {  # PORT: lets the guest past its hold on PORT
    ip netns exec "$NSA" timeout 60 bash -c "until (exec 3<>/dev/tcp/$GA/$1) 2>/dev/null; do sleep 1; done" \
        || rg_die "cannot reach the guest's hold on port $1"
}
rr_tap_drops() {  # the taps' qdisc drops so far (host side, ns R)
    tc -n "$NSR" -s qdisc show | awk '/dropped/ {gsub(",", "", $7); s += $7} END {print s + 0}'
}

rg_phase_begin dcqcn
taps0="$(rr_tap_drops)"
rr_phase dcqcn 18600 --dcqcn "$LINE"
taps_dcqcn=$(($(rr_tap_drops) - taps0))
rr_release 7001
rr_wait_guest '^@@CELL router-reset ' 120 || rg_die "no statistics from the guest after phase dcqcn"
rg_phase_end dcqcn | tee -a "$TIMES"

rg_phase_begin plain
taps0="$(rr_tap_drops)"
rr_phase plain 18700
taps_plain=$(($(rr_tap_drops) - taps0))
rr_release 7002
rr_wait_guest '^@@CELL stats-plain ' 120 || rg_die "no statistics from the guest after phase plain"
rg_phase_end plain | tee -a "$TIMES"
rg_sides_wait 120 g1
rg_rows_failed_sides

# ---------------------------------------------------------------- verdicts
# counter FILE NAME: a counter of rdma-perf --stats (the engine's Debug line), 0 if absent.
counter() { { grep -o -E "[ {]$2: [0-9]+" "$1" 2>/dev/null || true; } | awk 'NR == 1 {v = $2} END {print v + 0}'; }
# bw FILE: rdma-perf's BW average (MB/s) from its result line.
bw() { awk '/^ *[0-9]+ +[0-9]+ +[0-9.]+ +[0-9.]+/ {v = $4} END {print v + 0}' "$1"; }
# red STATS-CELL FIELD: from the guest's `tc -s qdisc show dev eth1` after a phase: the red qdisc's
# marked / early / pdrop, or `dropped` of its Sent line.
red() {
    rg_side_output g1 "$1" | awk -v f="$2" '
        /^qdisc red/ {r = 1; next}
        /^qdisc/ {r = 0}
        r && f == "dropped" && /Sent/ {for (i = 1; i <= NF; i++) if ($i == "(dropped") {gsub(",", "", $(i + 1)); print $(i + 1) + 0; exit}}
        r && f != "dropped" {for (i = 1; i < NF; i++) if ($i == f) {print $(i + 1) + 0; exit}}'
}
summary() {  # PHASE: one line of figures of a phase, for the table and the log
    local ph="$1" st="stats-$1"
    printf 'MB/s %s / %s; cnp_sent %s / %s; cnp_rcvd %s / %s; retries %s / %s; icrc_errors %s / %s; red marked %s dropped %s; tap drops %s' \
        "$(bw "$HOSTS/$ph-send1.log")" "$(bw "$HOSTS/$ph-send2.log")" \
        "$(counter "$HOSTS/$ph-recv1.log" cnp_sent)" "$(counter "$HOSTS/$ph-recv2.log" cnp_sent)" \
        "$(counter "$HOSTS/$ph-send1.log" cnp_rcvd)" "$(counter "$HOSTS/$ph-send2.log" cnp_rcvd)" \
        "$(counter "$HOSTS/$ph-send1.log" completer_retry_err)" "$(counter "$HOSTS/$ph-send2.log" completer_retry_err)" \
        "$(counter "$HOSTS/$ph-recv1.log" icrc_errors)" "$(counter "$HOSTS/$ph-recv2.log" icrc_errors)" \
        "$(red "$st" marked)" "$(red "$st" dropped)" "$2"
}
ok_all() {  # PHASE: all four tools exited 0
    local f
    for f in "$HOSTS/$1"-{recv,send}{1,2}.rc; do [ "$(cat "$f" 2>/dev/null)" = 0 ] || return 1; done
}
why_tools() {  # PHASE: the failing tools and their last line
    local f
    for f in "$HOSTS/$1"-{recv,send}{1,2}.rc; do
        [ "$(cat "$f" 2>/dev/null)" = 0 ] || printf '%s rc=%s: %s; ' "$(basename "$f" .rc)" "$(cat "$f" 2>/dev/null)" \
            "$(grep -v '^engine:\|^link:\|^progress:' "${f%.rc}.log" | tail -n 1 | cut -c1-100)"
    done
}
S_D="$(summary dcqcn "$taps_dcqcn")"
S_P="$(summary plain "$taps_plain")"
rg_log "router: dcqcn: $S_D"
rg_log "router: plain: $S_P"
row() { if eval "$2"; then rg_row "$1" PASS "$3"; else rg_row "$1" FAIL "$3"; fi; }
H="$HOSTS"
sum2() { echo $(($(counter "$H/$1" "$3") + $(counter "$H/$2" "$3"))); }

# phase dcqcn
row "dcqcn: flows complete" 'ok_all dcqcn' "$(why_tools dcqcn)$(bw "$H/dcqcn-send1.log") / $(bw "$H/dcqcn-send2.log") MB/s"
row "dcqcn: RED marks CE" '[ "$(red stats-dcqcn marked)" -gt 0 ]' "marked $(red stats-dcqcn marked)"
row "dcqcn: CNPs sent and received" \
    '[ "$(counter "$H/dcqcn-recv1.log" cnp_sent)" -gt 0 ] && [ "$(counter "$H/dcqcn-recv2.log" cnp_sent)" -gt 0 ] && [ "$(counter "$H/dcqcn-send1.log" cnp_rcvd)" -gt 0 ] && [ "$(counter "$H/dcqcn-send2.log" cnp_rcvd)" -gt 0 ]' \
    "sent $(counter "$H/dcqcn-recv1.log" cnp_sent) / $(counter "$H/dcqcn-recv2.log" cnp_sent), received $(counter "$H/dcqcn-send1.log" cnp_rcvd) / $(counter "$H/dcqcn-send2.log" cnp_rcvd)"
# Every packet a side sent arrived at its peer (the engines' sent_pkts / rcvd_pkts, rxe's names: the
# senders send only requests, the receivers only ACKs and CNPs), and no queue dropped. Go-back-N retries
# are reported, not required to be 0: a TCG guest stalled for longer than the local ACK timeout (1 s)
# on a loaded host makes a sender time out and resend packets that were not lost.
lost_req=$(($(sum2 dcqcn-send1.log dcqcn-send2.log sent_pkts) - $(sum2 dcqcn-recv1.log dcqcn-recv2.log rcvd_pkts)))
lost_resp=$(($(sum2 dcqcn-recv1.log dcqcn-recv2.log sent_pkts) - $(sum2 dcqcn-send1.log dcqcn-send2.log rcvd_pkts)))
row "dcqcn: nothing lost" \
    '[ "$(red stats-dcqcn dropped)" = 0 ] && [ "$taps_dcqcn" = 0 ] && [ "$lost_req" = 0 ] && [ "$lost_resp" = 0 ] && [ "$(sum2 dcqcn-send1.log dcqcn-send2.log sent_pkts)" -gt 0 ]' \
    "sent - received: requests $lost_req of $(sum2 dcqcn-send1.log dcqcn-send2.log sent_pkts), ACKs/CNPs $lost_resp of $(sum2 dcqcn-recv1.log dcqcn-recv2.log sent_pkts); qdisc dropped $(red stats-dcqcn dropped), taps dropped $taps_dcqcn; go-back-N retries $(sum2 dcqcn-send1.log dcqcn-send2.log completer_retry_err) (timeouts: nothing lost)"
row "dcqcn: data intact (ICRC)" '[ "$(sum2 dcqcn-recv1.log dcqcn-recv2.log icrc_errors)" = 0 ] && [ "$(sum2 dcqcn-recv1.log dcqcn-recv2.log rcvd_pkts)" -gt 0 ]' \
    "icrc_errors $(sum2 dcqcn-recv1.log dcqcn-recv2.log icrc_errors) of $(sum2 dcqcn-recv1.log dcqcn-recv2.log rcvd_pkts) packets"
share="$(awk -v a="$(bw "$H/dcqcn-send1.log")" -v b="$(bw "$H/dcqcn-send2.log")" 'BEGIN{m = a > b ? a : b; n = a > b ? b : a; print (m > 0) ? int(100 * n / m) : 0}')"
row "dcqcn: rates converge" '[ "$share" -ge "$MIN_SHARE" ]' "slower flow at ${share}% of the faster (bound ${MIN_SHARE}%)"
# phase plain
row "plain: flows complete" 'ok_all plain' "$(why_tools plain)$(bw "$H/plain-send1.log") / $(bw "$H/plain-send2.log") MB/s"
row "plain: drops and go-back-N" \
    '[ "$(red stats-plain dropped)" -gt 0 ] && [ "$(sum2 plain-send1.log plain-send2.log completer_retry_err)" -gt 0 ]' \
    "qdisc dropped $(red stats-plain dropped), taps dropped $taps_plain, go-back-N retries $(sum2 plain-send1.log plain-send2.log completer_retry_err)"
row "plain: data intact (ICRC)" '[ "$(sum2 plain-recv1.log plain-recv2.log icrc_errors)" = 0 ] && [ "$(sum2 plain-recv1.log plain-recv2.log rcvd_pkts)" -gt 0 ]' \
    "icrc_errors $(sum2 plain-recv1.log plain-recv2.log icrc_errors) of $(sum2 plain-recv1.log plain-recv2.log rcvd_pkts) packets"

echo "total $(awk -v a="$T_ALL0" -v b="$(rg_now)" 'BEGIN{printf "%.1f", b-a}') s" >>"$TIMES"
cat "$TIMES"
rg_table "guest router: DCQCN through RED ECN at ${MBIT} Mbit/s (senders ${LINE} Mb/s each with DCQCN)"
rg_table_save "$CACHE/router-latest.tsv"
[ "$RG_FAILS" -eq 0 ]
