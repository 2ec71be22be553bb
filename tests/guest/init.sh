#!/bin/sh
# /init of the harness's guest (busybox ash). Parameters from the kernel command line:
#   roce.name=NAME  roce.ip=ADDR/PFX  roce.mtu=BYTES (eth0's MTU)  roce.timeout=SECS (bound on the job)
# It mounts the pseudo file systems, loads the modules listed in /etc/modules.order, configures eth0, adds
# the soft-RoCE device (`rdma link add rxe0 type rxe netdev eth0`), waits until its port is ACTIVE with an
# IPv4 GID, runs /job/run.sh (appended to the initramfs per run by the harness) and powers off.
# Results go to the second serial port (/dev/ttyS1, the harness's result.log) and to the console:
#   @@BOOT / @@READY ... / @@SETUP-FAILED step=... / (the job's @@OUT and @@CELL lines) / @@DONE rc=N
export PATH=/usr/bin:/usr/sbin:/bin:/sbin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run

RES=/dev/ttyS1
[ -c "$RES" ] || RES=/dev/null
say() { echo "$*"; echo "$*" >"$RES"; }
finish() {
    say "@@DONE rc=$1"
    sync
    poweroff -f
    sleep 5
    echo o >/proc/sysrq-trigger
}
fail() {
    say "@@SETUP-FAILED step=$1 $2"
    dmesg | tail -n 30
    finish 1
}

NAME=guest IP="" MTU=1500 TMO=600
for w in $(cat /proc/cmdline); do
    case "$w" in
        roce.name=*) NAME="${w#*=}" ;;
        roce.ip=*) IP="${w#*=}" ;;
        roce.mtu=*) MTU="${w#*=}" ;;
        roce.timeout=*) TMO="${w#*=}" ;;
    esac
done
say "@@BOOT name=$NAME kernel=$(uname -r) uptime=$(cut -d' ' -f1 /proc/uptime)"

for m in $(cat /etc/modules.order); do
    err="$(insmod "$m" 2>&1)" || fail modules "insmod $m: $err"
done

n=0
while [ ! -d /sys/class/net/eth0 ]; do
    n=$((n + 1)); [ "$n" -le 100 ] || fail eth0 "no eth0 after 10 s"; sleep 0.1
done
ip link set lo up
# No duplicate address detection: the link-local address (and so rxe's IPv6 GID) is usable at once.
echo 0 >/proc/sys/net/ipv6/conf/eth0/accept_dad
echo 0 >/proc/sys/net/ipv6/conf/default/accept_dad
ip link set eth0 mtu "$MTU" || fail eth0 "cannot set mtu $MTU (host_mtu too small?)"
[ -z "$IP" ] || ip addr add "$IP" dev eth0 || fail eth0 "cannot add address $IP"
ip link set eth0 up || fail eth0 "cannot bring eth0 up"

err="$(rdma link add rxe0 type rxe netdev eth0 2>&1)" || fail rxe "rdma link add: $err"
P=/sys/class/infiniband/rxe0/ports/1
n=0
while :; do
    st="$(cat $P/state 2>/dev/null)"
    g1="$(cat $P/gids/1 2>/dev/null)"
    case "$st" in *ACTIVE*) [ -z "$IP" ] || { [ -n "$g1" ] && [ "$g1" != "0000:0000:0000:0000:0000:0000:0000:0000" ]; } && break ;; esac
    n=$((n + 1)); [ "$n" -le 200 ] || fail rxe "port not ACTIVE with an IPv4 GID after 20 s (state: $st, gid1: $g1)"
    sleep 0.1
done
amtu="$(ibv_devinfo -d rxe0 2>/dev/null | awk '/active_mtu/{print $2; exit}')"
say "@@READY name=$NAME ip=$IP mtu=$MTU active_mtu=$amtu gid0=$(cat $P/gids/0) gid1=$(cat $P/gids/1) uptime=$(cut -d' ' -f1 /proc/uptime)"

if [ -f /job/run.sh ]; then
    # Streamed through tee: every finished cell is on the result port even if the host kills the guest.
    { timeout "$TMO" sh /job/run.sh 2>&1 || echo "@@JOB rc=$?"; } | tee "$RES"
    # dmesg warnings of rxe, for a failing run's console
    dmesg | grep -i -e rxe -e infiniband | tail -n 20
else
    say "@@JOB none: no /job/run.sh"
fi
finish 0
