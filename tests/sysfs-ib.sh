#!/usr/bin/env bash
# sysfs-ib.sh [--netns] -- COMMAND [ARGS...]
#
# Runs COMMAND in a private mount namespace (unshare(1) --mount, root only) in which
# /sys/class/infiniband, /sys/class/infiniband_verbs and /dev/infiniband/uverbsN show what a kernel
# rxe device would show for each device the drop-in libibverbs lists (tests/sysfs_ib.py writes the
# files from `ibv_devinfo -v`; LD_LIBRARY_PATH and ROCE_DEVICES are taken from the environment).
# The library itself never reads sysfs; some programs do: pyverbs' rdmacm tests look for the
# interface under /sys/class/infiniband/DEV/device/net/, UCX's uct_ib lists only devices whose
# /dev/infiniband/uverbsN is a read-write character device (ib_md.c uct_ib_device_is_accessible)
# and reads ports/N/gid_attrs/types/M to tell RoCE v2 GIDs from v1 ones. The uverbsN nodes are
# character devices 231:192+N as the kernel's (nothing opens them: the library never does).
#
# /sys/class and /dev are each covered by a tmpfs into which every original entry is bind-mounted
# (symlinks copied), then the new entries are added, so nothing outside the namespace changes and
# everything vanishes with it. --netns also gives COMMAND a network namespace of its own with only
# lo, up (unshare --net): the devices' UDP port 4791 and every address are then private to it.
#
# Exits 77 with a message when not root (the caller skips); otherwise COMMAND's exit status.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

netns=()
if [[ ${1:-} == --netns ]]; then
    netns=(--net)
    shift
fi
[[ ${1:-} == -- ]] && shift
if (($# == 0)); then
    echo "usage: $0 [--netns] -- COMMAND [ARGS...]" >&2
    exit 2
fi

if [[ -z ${SYSFS_IB_INNER:-} ]]; then
    if [[ $(id -u) != 0 ]]; then
        echo "sysfs-ib: needs root for a private mount namespace (unshare --mount); skipped" >&2
        exit 77
    fi
    work=$(mktemp -d /tmp/sysfs-ib.XXXXXX)
    rc=0
    SYSFS_IB_INNER=$work unshare --mount --propagation private "${netns[@]}" -- \
        bash "$0" "${netns[@]:+--netns}" -- "$@" || rc=$?
    rmdir "$work" 2>/dev/null || true
    exit "$rc"
fi

# Inside the namespace.
work=$SYSFS_IB_INNER
unset SYSFS_IB_INNER
if ((${#netns[@]})); then
    ip link set lo up
fi
mount -t tmpfs -o mode=755 sysfs-ib "$work"
mkdir -p "$work/gen" "$work/orig-class" "$work/orig-dev"
python3 "$here/sysfs_ib.py" "$work/gen"

# shadow DIR ORIG: a tmpfs over DIR holding every entry of the original DIR (bound, or copied if a
# symlink), the original kept reachable at ORIG.
shadow() {
    local dir=$1 orig=$2 e name
    mount --rbind "$dir" "$orig"
    mount -t tmpfs -o mode=755 sysfs-ib "$dir"
    for e in "$orig"/* "$orig"/.[!.]*; do
        [[ -e $e || -L $e ]] || continue
        name=${e##*/}
        if [[ -L $e ]]; then
            cp -P "$e" "$dir/$name"
        elif [[ -d $e ]]; then
            mkdir "$dir/$name"
            mount --rbind "$e" "$dir/$name"
        else
            touch "$dir/$name"
            mount --bind "$e" "$dir/$name"
        fi
    done
}

shadow /sys/class "$work/orig-class"
cp -a "$work/gen/infiniband" "$work/gen/infiniband_verbs" /sys/class/
shadow /dev "$work/orig-dev"
mkdir -p /dev/infiniband
i=0
while read -r node; do
    [[ -n $node ]] || continue
    mknod -m 666 "/dev/infiniband/$node" c 231 $((192 + i))
    i=$((i + 1))
done <"$work/gen/uverbs.list"
exec "$@"
