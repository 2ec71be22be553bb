#!/usr/bin/env bash
# The VFIO run: this project's userspace virtio-net driver (hca::link::vfio) against Linux soft-RoCE, inside
# one QEMU TCG guest. The guest is a q35 machine with an emulated IOMMU (intel-iommu, caching mode; kernel
# argument intel_iommu=on) and three virtio-net NICs on one QEMU hub (no host network at all):
#   00:03.0  NIC B  kernel virtio-net, eth0 198.18.0.1/24, rdma_rxe rxe0 on it (tests/guest/init.sh)
#   00:04.0  NIC A1 modern-only with ACCESS_PLATFORM, moved to vfio-pci, driven by vfio_pingpong (198.18.0.10)
#   00:05.0  NIC A2 the same (198.18.0.11), for the cases between two instances of this project's driver
# The binary (hca's example `vfio_pingpong`, release build) with its ldd libraries, the VFIO modules and
# tests/guest/vfio-bind.sh ride in an extra cpio archive appended to the cached initramfs; the reference
# initramfs is not changed. Each cell runs its server in the background and its client in the foreground in
# the same guest (the pingpong TCP exchange goes over 127.0.0.1; the RDMA traffic over the hub).
#
#   bash tests/guest/vfio.sh [--cells REGEX] [--list]
#
# Cells: rdma-pingpong --rc --link vfio: against ibv_rc_pingpong and rdma-perf write-bw / read-bw / send-bw
# --link vfio: against ib_write_bw / ib_read_bw / ib_send_bw, each in both roles (the tools run the engine
# through SoftDevice<VfioLink>: its progress thread and verbs API); ibv_rc_pingpong on rxe0 against vfio_pingpong in both roles (IPv4 GID and link-local IPv6 GID,
# MTU 1024 and 4096, -c data check on both sides; once with MSI-X interrupts instead of polling); RDMA WRITE between two vfio_pingpong instances with the
# data checked (and read back with RDMA READ); the negative case (the server deregisters its region, which unmaps it from the IOMMU and
# asks the kernel that nothing is left there; the client's WRITE must complete with REM_ACCESS_ERR and the
# server must see IBV_EVENT_QP_ACCESS_ERR); and the driver's refusal of a NIC not bound to vfio-pci.
# The tools' cells run with --stats and also require the link's tx_gathered counter to be positive (packets
# whose payload descriptors pointed straight into IOMMU-mapped registered memory) where the driver sends payload.
# A pcap of NIC B's hub port (QEMU filter-dump) is checked with tshark.
#
# Environment: ROCE_GUEST_CACHE (as setup.sh), ROCE_VFIO_JOB_SECS (bound on the guest's job, 900),
# CARGO_TARGET_DIR (where the binary is built). As root on Debian 12; runs setup.sh first (cached).
# Prints the time of each phase and a table (cell | result | reason); exits 1 on any failure.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=lib.sh
. "$HERE/lib.sh"

JOB_SECS="${ROCE_VFIO_JOB_SECS:-900}"
CELL_SECS=120
GUEST_IP=198.18.0.1 A1_IP=198.18.0.10 A2_IP=198.18.0.11 PFX=24 LINK_MTU=4200
A1=0000:00:04.0 A2=0000:00:05.0 B=0000:00:03.0
VP=/opt/vfio/vfio_pingpong
RP=/opt/vfio/rdma-pingpong RPERF=/opt/vfio/rdma-perf

# ---------------------------------------------------------------- the cells
# CELLS[i]="NAME|SERVER CMD|CLIENT CMD" (the client gets -p PORT and 127.0.0.1 appended; so does the server's -p).
CELLS=()
cell() { CELLS+=("$1|$2|$3"); }
for mtu in 1024 4096; do
    cell "rc_pingpong:vfio-client:ipv4:mtu$mtu" \
        "ibv_rc_pingpong -d rxe0 -g 1 -m $mtu -s 4096 -n 20 -c" \
        "$VP --link vfio:$A1 --ip $A1_IP -g 2 -m $mtu -s 4096 -n 20 -c --timeout 40"
    cell "rc_pingpong:vfio-server:ipv4:mtu$mtu" \
        "$VP --link vfio:$A1 --ip $A1_IP -g 2 -m $mtu -s 4096 -n 20 -c --timeout 60" \
        "ibv_rc_pingpong -d rxe0 -g 1 -m $mtu -s 4096 -n 20 -c"
done
cell "rc_pingpong:vfio-client:ipv6ll:mtu1024" \
    "ibv_rc_pingpong -d rxe0 -g 0 -m 1024 -s 8192 -n 20 -c" \
    "$VP --link vfio:$A1 --ip $A1_IP -g 1 -m 1024 -s 8192 -n 20 -c --timeout 40"
cell "rc_pingpong:vfio-server:ipv6ll:mtu1024" \
    "$VP --link vfio:$A1 --ip $A1_IP -g 1 -m 1024 -s 8192 -n 20 -c --timeout 60" \
    "ibv_rc_pingpong -d rxe0 -g 0 -m 1024 -s 8192 -n 20 -c"
# MSI-X: the driver sleeps on its receive interrupt (VFIO eventfd) when idle instead of polling.
cell "rc_pingpong:vfio-client:ipv4:msix" \
    "ibv_rc_pingpong -d rxe0 -g 1 -m 1024 -s 4096 -n 20 -c" \
    "$VP --link vfio:$A1 --ip $A1_IP -g 2 -m 1024 -s 4096 -n 20 -c --interrupts --timeout 40"
cell "rdma_write_read:vfio-vfio:ipv4:mtu4096" \
    "$VP --link vfio:$A1 --ip $A1_IP -m 4096 -s 262144 --mode write --timeout 60" \
    "$VP --link vfio:$A2 --ip $A2_IP -m 4096 -s 262144 --mode write --timeout 40"
cell "negative:write-after-dereg" \
    "$VP --link vfio:$A1 --ip $A1_IP -m 1024 -s 65536 --mode dereg --timeout 60" \
    "$VP --link vfio:$A2 --ip $A2_IP -m 1024 -s 65536 --mode dereg --timeout 40"
# The tools on the VFIO link (hca's SoftDevice over VfioLink, its progress engine and verbs API),
# against rdma-core's and perftest's tools on rxe0, in both roles. rdma-pingpong -c checks the data.
for role in client server; do
    tool="$RP --rc --link vfio:$A1 --vfio-ip $A1_IP -g 2 -m 1024 -s 4096 -n 20 -c --stats"
    peer="ibv_rc_pingpong -d rxe0 -g 1 -m 1024 -s 4096 -n 20 -c"
    if [ $role = client ]; then
        cell "rdma-pingpong:vfio-client:ipv4" "$peer" "$tool --timeout 40"
    else
        cell "rdma-pingpong:vfio-server:ipv4" "$tool --timeout 60" "$peer"
    fi
done
cell "rdma-pingpong:vfio-client:ipv4:msix" \
    "ibv_rc_pingpong -d rxe0 -g 1 -m 4096 -s 8192 -n 20 -c" \
    "$RP --rc --link vfio:$A1 --vfio-ip $A1_IP --vfio-interrupts --progress thread -g 2 -m 4096 -s 8192 -n 20 -c --stats --timeout 40"
for t in write read send; do
    perf="$RPERF $t-bw --link vfio:$A1 --vfio-ip $A1_IP -x 2 -s 65536 -n 100 --stats"
    # -F: a TCG guest's TSC calibration can miss perftest's r^2 >= 0.9 check, after which perftest exits 1
    # with "Can't produce a report" although the traffic ran (the matrix and reference runs pass -F too).
    ref="ib_${t}_bw -d rxe0 -x 1 -s 65536 -n 100 -F"
    cell "rdma-perf:$t-bw:vfio-client:ipv4" "$ref" "$perf --timeout 60"
    cell "rdma-perf:$t-bw:vfio-server:ipv4" "$perf --timeout 90" "$ref"
done
# One-sided cell: the driver refuses NIC B (bound to virtio-pci) with a clear error.
SOLO_CELL="negative:not-bound-to-vfio"
SOLO_CMD="out=\$($VP --link vfio:$B --ip 198.18.0.99 2>&1); echo \"\$out\"; case \"\$out\" in *'bound to virtio-pci, not vfio-pci'*) exit 0 ;; *) exit 1 ;; esac"

FILTER="" LIST=0
while [ $# -gt 0 ]; do
    case "$1" in
        --cells) FILTER="${2:?--cells needs a regex}"; shift 2 ;;
        --list) LIST=1; shift ;;
        -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
        *) rg_die "unknown argument $1 (see --help)" ;;
    esac
done
if [ -n "$FILTER" ]; then
    rg_cells_matching CELLS "$FILTER"
fi
RUN_SOLO=1
[ -z "$FILTER" ] || [[ "$SOLO_CELL" =~ $FILTER ]] || RUN_SOLO=0
if [ "$LIST" -eq 1 ]; then
    for c in "${CELLS[@]+"${CELLS[@]}"}"; do IFS='|' read -r n s k <<<"$c"; echo "$n"; echo "    server: $s"; echo "    client: $k"; done
    [ "$RUN_SOLO" = 0 ] || echo "$SOLO_CELL"
    exit 0
fi
[ ${#CELLS[@]} -gt 0 ] || [ "$RUN_SOLO" = 1 ] || rg_die "no cell matches '$FILTER'"
[ "$(id -u)" -eq 0 ] || rg_die "vfio: must run as root"

# ---------------------------------------------------------------- setup and build
T_ALL0="$(rg_now)"
rg_phase_begin "setup"
SETUP_OUT="$(bash "$HERE/setup.sh")" || rg_die "setup.sh failed"
rg_phase_end "setup" >/dev/null
CACHE="$(rg_cache_dir)"
rg_run_init
TIMES="$RG_RUN/times.txt"
echo "$SETUP_OUT" >"$TIMES"

rg_phase_begin "build vfio_pingpong, rdma-pingpong, rdma-perf"
TARGET="${CARGO_TARGET_DIR:-$RG_REPO/target}"
(cd "$RG_REPO" && rg_step 1800 "cargo build --release -p hca --example vfio_pingpong --bins" \
    cargo build --release -p hca --example vfio_pingpong --bins) || rg_die "building the binaries failed"
BIN="$TARGET/release/examples/vfio_pingpong"
TOOLS=("$TARGET/release/rdma-pingpong" "$TARGET/release/rdma-perf")
for b in "$BIN" "${TOOLS[@]}"; do [ -x "$b" ] || rg_die "no binary at $b"; done
rg_phase_end "build vfio_pingpong, rdma-pingpong, rdma-perf" >>"$TIMES"

# ---------------------------------------------------------------- the extra archive
rg_phase_begin "extra initramfs"
KVER="$(cat "$CACHE/kernel/VERSION")"
MROOT="$CACHE/kernel/root"
EXTRA="$RG_RUN/extra"
mkdir -p "$EXTRA/opt/vfio/modules"
cp "$BIN" "$EXTRA/opt/vfio/vfio_pingpong"
cp "${TOOLS[@]}" "$EXTRA/opt/vfio/"
install -m 0755 "$HERE/vfio-bind.sh" "$EXTRA/opt/vfio/vfio-bind.sh"
# The base archive has /lib -> usr/lib and /lib64 -> usr/lib64: a "lib" directory in a later archive would
# replace those links (the kernel's unpacker removes an entry of another type), so libraries go under usr/.
for lib in $(ldd "$BIN" "${TOOLS[@]}" | awk '/=> \//{print $3} /^\s*\/[^ ]*ld-linux/{print $1}'); do
    case "$lib" in /lib/*|/lib64/*) dst="/usr$lib" ;; *) dst="$lib" ;; esac
    mkdir -p "$EXTRA$(dirname "$dst")"
    cp -L "$lib" "$EXTRA$dst"
done
: >"$EXTRA/opt/vfio/modules.order"
declare -A seen=()
for m in vfio vfio_iommu_type1 vfio-pci; do
    deps="$(timeout 60 modprobe -d "$MROOT" -S "$KVER" --show-depends "$m" 2>&1)" \
        || rg_die "modprobe --show-depends $m failed: $deps"
    while read -r kind path _; do
        [ "$kind" = insmod ] || continue
        base="$(basename "$path")"
        case "$base" in
            *.ko.xz) out="${base%.xz}"; dec=(xz -dc) ;;
            *.ko.zst) out="${base%.zst}"; dec=(zstd -qdc) ;;
            *.ko.gz) out="${base%.gz}"; dec=(gzip -dc) ;;
            *) out="$base"; dec=(cat) ;;
        esac
        [ -n "${seen[$out]:-}" ] && continue
        seen[$out]=1
        "${dec[@]}" "$path" >"$EXTRA/opt/vfio/modules/$out"
        echo "$out" >>"$EXTRA/opt/vfio/modules.order"
    done <<<"$deps"
done
(cd "$EXTRA" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc --quiet -R 0:0 | gzip -1 >"$RG_RUN/extra.cpio.gz") \
    || rg_die "cannot pack the extra archive"
rg_phase_end "extra initramfs" >>"$TIMES"

# ---------------------------------------------------------------- the job
JOB="$RG_RUN/job-g"
rg_job_new "$JOB"
rg_job_cmd "$JOB" "sh /opt/vfio/vfio-bind.sh $A1 $A2 || echo '@@JOB vfio-bind failed'"
qcmd() { local a out=""; for a in "$@"; do out+=" $(printf '%q' "$a")"; done; echo "${out# }"; }
port=18600
for c in "${CELLS[@]+"${CELLS[@]}"}"; do
    IFS='|' read -r name scmd kcmd <<<"$c"
    read -r -a s <<<"$scmd"
    read -r -a k <<<"$kcmd"
    rg_job_cmd "$JOB" "cellrun server $(qcmd "$name" "$CELL_SECS") -- $(qcmd "${s[@]}" -p "$port") >/tmp/server.out 2>&1 &"
    rg_job_cmd "$JOB" "sleep 2"
    rg_job_cmd "$JOB" "cellrun client $(qcmd "$name" "$CELL_SECS") -- $(qcmd "${k[@]}" -p "$port" 127.0.0.1)"
    rg_job_cmd "$JOB" "wait; cat /tmp/server.out"
    port=$((port + 1))
done
if [ "$RUN_SOLO" = 1 ]; then
    rg_job_cmd "$JOB" "cellrun client $(qcmd "$SOLO_CELL" 30) -- sh -c $(printf '%q' "$SOLO_CMD")"
fi
rg_job_cmd "$JOB" "dmesg | grep -i -e 'DMAR' -e vfio | tail -n 20 | sed 's/^/@@DMESG /'"

# ---------------------------------------------------------------- the guest
# vfio_guest_start SIDE JOBDIR SECS: boots the q35 + intel-iommu guest with NIC B and NICs A1, A2 on one hub.
vfio_guest_start() {
    local side="$1" job="$2" secs="$3" d kernel initrd append
    d="$RG_RUN/sides/$side"
    kernel="$CACHE/kernel/vmlinuz"
    initrd="$CACHE/initramfs.cpio.gz"
    [ -f "$kernel" ] && [ -f "$initrd" ] || rg_die "no kernel/initramfs in $CACHE: run tests/guest/setup.sh"
    mkdir -p "$d/stage/job"
    cp "$job/run.sh" "$d/stage/job/run.sh"
    (cd "$d/stage" && find job | cpio -o -H newc --quiet -R 0:0 | gzip -1 >"$d/job.cpio.gz") \
        || rg_die "cannot pack the job of guest $side"
    cat "$initrd" "$RG_RUN/extra.cpio.gz" "$d/job.cpio.gz" >"$d/initrd.gz"
    : >"$d/console.log"
    : >"$d/result.log"
    echo guest >"$d/kind"
    append="console=ttyS0 quiet panic=-1 mitigations=off intel_iommu=on roce.name=$side roce.ip=$GUEST_IP/$PFX roce.mtu=$LINK_MTU roce.timeout=$secs"
    echo "$append" >"$d/cmdline"
    local nic="virtio-net-pci,romfile=,host_mtu=$LINK_MTU"
    local vnic="$nic,disable-legacy=on,iommu_platform=on"
    timeout --kill-after=5 $((secs + 90)) \
        qemu-system-x86_64 -accel tcg,thread=multi -cpu max -smp 2 -m 1536 -no-reboot -nographic -nodefaults \
        -machine q35,kernel-irqchip=split -device intel-iommu,intremap=on,caching-mode=on \
        -monitor none -serial "file:$d/console.log" -serial "file:$d/result.log" \
        -kernel "$kernel" -initrd "$d/initrd.gz" -append "$append" \
        -netdev hubport,id=nb,hubid=0 -device "$nic,netdev=nb,mac=52:54:00:52:00:01,addr=0x3" \
        -netdev hubport,id=na1,hubid=0 -device "$vnic,netdev=na1,mac=52:54:00:52:00:0a,addr=0x4" \
        -netdev hubport,id=na2,hubid=0 -device "$vnic,netdev=na2,mac=52:54:00:52:00:0b,addr=0x5" \
        -object "filter-dump,id=dump0,netdev=nb,file=$RG_RUN/vfio.pcap,maxlen=9000" \
        </dev/null >"$d/qemu.log" 2>&1 &
    echo $! >"$d/pid"
    RG_PIDS+=("$!")
    rg_now >"$d/t_start"
}

rg_phase_begin "guest (boot+cells)"
rg_log "vfio: ${#CELLS[@]} cells + $RUN_SOLO one-sided; guest booting; run folder $RG_RUN"
vfio_guest_start g "$JOB" "$JOB_SECS"
rg_sides_wait $((JOB_SECS + 120)) g || true
rg_phase_end "guest (boot+cells)" >>"$TIMES"

# ---------------------------------------------------------------- verdicts
R="$RG_RUN/sides/g/result.log"
role_cell() {  # NAME ROLE: the @@CELL line of that role
    awk -v n="$1" -v r="role=$2" '$1 == "@@CELL" && $2 == n && $3 == r {print; exit}' "$R"
}
# gather_check NAME: for the tools' cells (run with --stats), the link counters' tx_gathered and
# tx_gather_copied as " gathered=N copied=M"; fails (rc 1) when the VFIO side sent no packet as a
# descriptor chain into registered memory, except where the payload flows from rxe to the driver:
# read-bw as client (its READ requests carry none), write-bw and send-bw as server (perftest's server
# only receives).
gather_check() {
    local out g c
    out="$(rg_side_output g "$1" | grep -m1 '^link: ' || true)"
    g="$(sed -n 's/.*tx_gathered: \([0-9]*\).*/\1/p' <<<"$out")"
    c="$(sed -n 's/.*tx_gather_copied: \([0-9]*\).*/\1/p' <<<"$out")"
    echo " gathered=${g:-?} copied=${c:-?}"
    case "$1" in
        rdma-perf:read-bw:vfio-client:* | rdma-perf:write-bw:vfio-server:* | rdma-perf:send-bw:vfio-server:*) return 0 ;;
        rdma-*) [ "${g:-0}" -gt 0 ] ;;
        *) return 0 ;;
    esac
}
if grep -q '^@@VFIO-FAILED' "$R"; then
    rg_row "vfio-bind" FAIL "$(grep -m1 '^@@VFIO-FAILED' "$R")"
elif grep -q '^@@VFIO bound' "$R"; then
    rg_row "vfio-bind" PASS "$(grep -c '^@@VFIO bound' "$R") NICs on vfio-pci; $(grep -m1 '^@@VFIO modules' "$R" | cut -c8-)"
else
    rg_row "vfio-bind" FAIL "no @@VFIO line (guest did not get there)"
fi
for c in "${CELLS[@]+"${CELLS[@]}"}"; do
    name="${c%%|*}"
    s="$(role_cell "$name" server)" k="$(role_cell "$name" client)"
    if [ -z "$s" ] || [ -z "$k" ]; then
        rg_row "$name" FAIL "no result from the ${s:+client}${k:+server}${s:-${k:-server and client}} side"
    elif [ "$(rg_field rc "$s")" = 0 ] && [ "$(rg_field rc "$k")" = 0 ]; then
        if [[ "$name" == rdma-* ]]; then
            if note="$(gather_check "$name")"; then
                rg_row "$name" PASS "$(rg_field secs "$k")s:$note; $(rg_summary g "$name" | cut -c1-60)"
            else
                rg_row "$name" FAIL "no packet left as a gather chain from registered memory:$note"
            fi
        else
            rg_row "$name" PASS "$(rg_field secs "$k")s: $(rg_summary g "$name")"
        fi
    else
        rg_row "$name" FAIL "server rc=$(rg_field rc "$s"), client rc=$(rg_field rc "$k"): $(rg_reason g "$name")"
    fi
    echo "cell $name: server $(rg_field secs "$s")s, client $(rg_field secs "$k")s" >>"$TIMES"
done
if [ "$RUN_SOLO" = 1 ]; then
    k="$(role_cell "$SOLO_CELL" client)"
    if [ -n "$k" ] && [ "$(rg_field rc "$k")" = 0 ]; then
        rg_row "$SOLO_CELL" PASS "$(rg_side_output g "$SOLO_CELL" | head -n 1 | cut -c1-110)"
    else
        rg_row "$SOLO_CELL" FAIL "${k:+rc=$(rg_field rc "$k"): }$(rg_reason g "$SOLO_CELL")"
    fi
fi
for f in "${RG_SIDES_FAILED[@]+"${RG_SIDES_FAILED[@]}"}"; do
    rg_row "guest" FAIL "$(grep -m1 -E '^@@SETUP-FAILED' "$R" || echo "did not finish: see $RG_RUN/sides/$f/")"
done
if grep -q '^@@DMESG.*DMAR.*fault' "$R"; then
    rg_row "iommu faults" FAIL "$(grep -c '^@@DMESG.*DMAR.*fault' "$R") DMAR faults in dmesg: $(grep -m1 '^@@DMESG.*DMAR' "$R" | cut -c9-100)"
else
    rg_row "iommu faults" PASS "no DMAR fault in the guest's dmesg"
fi

rg_phase_begin "pcap check"
want4k=0 want1k=0 want6=0
printf '%s\n' "${CELLS[@]+"${CELLS[@]}"}" | grep -q 'ipv4:mtu4096|' && want4k=1
printf '%s\n' "${CELLS[@]+"${CELLS[@]}"}" | grep -q ':mtu1024|' && want1k=1
printf '%s\n' "${CELLS[@]+"${CELLS[@]}"}" | grep -q 'ipv6ll' && want6=1
if [ ${#CELLS[@]} -gt 0 ]; then rg_pcap_checks "$RG_RUN/vfio.pcap" "$want6" "$want4k" "$want1k"; fi
rg_phase_end "pcap check" >>"$TIMES"

# ---------------------------------------------------------------- report
echo
echo "== timings =="
cat "$TIMES"
echo "guest: $(rg_side_times g)"
awk -v a="$T_ALL0" -v b="$(rg_now)" 'BEGIN{printf "total %.1f s\n", b-a}'
echo
rg_table "vfio run: vfio_pingpong on NIC A (vfio-pci, intel-iommu) <-> rxe0 on NIC B, one QEMU hub, link MTU $LINK_MTU"
rg_table_save "$RG_RUN/table.tsv"
echo
echo "pcap: $RG_RUN/vfio.pcap (NIC B's hub port)"
echo "run folder: $RG_RUN (sides/g/console.log, result.log)"
if [ "$RG_FAILS" -gt 0 ]; then
    rg_console_tail g 40
    echo "vfio: $RG_FAILS of ${#RG_ROWS[@]} rows failed"
    exit 1
fi
echo "vfio: all ${#RG_ROWS[@]} rows passed"
