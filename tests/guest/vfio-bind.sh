#!/bin/sh
# vfio-bind.sh PCI_ADDRESS...: runs INSIDE the VFIO guest (busybox ash), as /opt/vfio/vfio-bind.sh.
# Loads the VFIO modules shipped in /opt/vfio/modules (in /opt/vfio/modules.order), reserves huge pages for
# the driver's DMA memory, and moves each PCI function from its kernel driver to vfio-pci
# (unbind, driver_override, drivers_probe), then waits (bounded) for its /dev/vfio/<group>.
# Prints "@@VFIO ..." lines; on failure "@@VFIO-FAILED <what>" and exit status 1.
set -u
fail() { echo "@@VFIO-FAILED $*"; exit 1; }

for m in $(cat /opt/vfio/modules.order); do
    name="$(basename "$m" .ko | tr - _)"
    grep -q "^$name " /proc/modules && continue
    err="$(insmod "/opt/vfio/modules/$m" 2>&1)" || fail "insmod $m: $err"
done
echo 64 >/proc/sys/vm/nr_hugepages 2>/dev/null
echo "@@VFIO modules=$(grep -c '^vfio' /proc/modules) hugepages=$(cat /proc/sys/vm/nr_hugepages) iommu_groups=$(ls /sys/kernel/iommu_groups 2>/dev/null | wc -l) cmdline_iommu=$(grep -o 'intel_iommu=[a-z]*' /proc/cmdline)"
for n in /sys/class/net/eth*; do
    [ -e "$n/device" ] && echo "@@VFIO netdev $(basename "$n") at $(basename "$(readlink "$n/device")") mac=$(cat "$n/address")"
done

for a in "$@"; do
    d="/sys/bus/pci/devices/$a"
    [ -e "$d" ] || fail "no PCI device $a"
    [ -e "$d/iommu_group" ] || fail "$a has no IOMMU group (is intel_iommu=on / intel-iommu there?)"
    g="$(basename "$(readlink "$d/iommu_group")")"
    if [ -e "$d/driver" ]; then
        echo "$a" >"$d/driver/unbind" || fail "cannot unbind $a from $(basename "$(readlink "$d/driver")")"
    fi
    echo vfio-pci >"$d/driver_override" || fail "cannot set driver_override of $a"
    echo "$a" >/sys/bus/pci/drivers_probe 2>/dev/null
    n=0
    while [ ! -c "/dev/vfio/$g" ]; do
        n=$((n + 1)); [ "$n" -le 50 ] || fail "/dev/vfio/$g did not appear for $a"; sleep 0.1
    done
    drv="$(basename "$(readlink "$d/driver" 2>/dev/null)" 2>/dev/null)"
    [ "$drv" = vfio-pci ] || fail "$a is bound to '$drv', not vfio-pci"
    echo "@@VFIO bound $a group=$g vendor=$(cat "$d/vendor") device=$(cat "$d/device") group_devices=$(ls "/sys/kernel/iommu_groups/$g/devices" | tr '\n' ' ')"
done
exit 0
