#!/bin/sh
# /job/netdir.sh in the pyverbs guest (tests/guest/pyverbs.sh), busybox sh: gives rxe0 the sysfs link
# `device` that rdma-core's pyverbs suite reads. The suite finds a device's network interface by listing
# /sys/class/infiniband/DEV/device/net/ (tests/base.py get_net_name) and takes its address from `ip -j addr
# show`; without it every test_rdmacm test skips ("Device rxe0 doesn't have net interface"). Linux 6.1's
# rxe registers its ib_device without a parent, so rxe0 has no `device` link. This adds one, pointing where
# a device with a parent would point (eth0's own parent, /sys/class/net/eth0/device, whose net/ lists eth0):
# a tmpfs over rxe0's sysfs folder holding a link to each original entry (kept reachable by a bind mount at
# /run/rxe0-sysfs) plus `device`. Nothing else changes; the guest is powered off afterwards.
set -eu
d="$(readlink -f /sys/class/infiniband/rxe0)"
[ -d "$d" ] || { echo "netdir: no /sys/class/infiniband/rxe0"; exit 1; }
[ ! -e "$d/device" ] || { echo "netdir: rxe0 already has a device link: $(ls "$d/device/net")"; exit 0; }
mkdir -p /run/rxe0-sysfs
mount --bind "$d" /run/rxe0-sysfs
mount -t tmpfs -o mode=755 rxe0-sysfs "$d"
for e in /run/rxe0-sysfs/*; do ln -s "$e" "$d/${e##*/}"; done
ln -s /sys/class/net/eth0/device "$d/device"
echo "netdir: /sys/class/infiniband/rxe0/device/net: $(ls /sys/class/infiniband/rxe0/device/net)"
