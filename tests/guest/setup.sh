#!/usr/bin/env bash
# Prepares everything the QEMU guest harness needs, as root on Debian 12; idempotent and cached.
#
#   bash tests/guest/setup.sh            # install missing packages, fetch the kernel, build the initramfs
#
# 1. Installs, when missing: qemu-system-x86, busybox-static, kmod, cpio, ibverbs-utils, perftest,
#    rdmacm-utils, rdma-core, ibverbs-providers, iproute2, iputils-ping, tshark (one `apt-get update` first).
# 2. Downloads ONE Debian kernel image package, the `linux-image-6.1.0-*-amd64` that `linux-image-amd64`
#    depends on (exact name resolved with apt-cache, one version fetched with `apt-get download`), into the
#    cache folder and unpacks it there with `dpkg -x`. It is never installed on the host.
# 3. Builds an initramfs (cpio newc, gzip): busybox, the soft-RoCE and virtio modules with their
#    dependencies (depmod + modprobe --show-depends), libibverbs + the rxe provider, rdma-core's and
#    perftest's tools with the libraries ldd lists, tests/guest/init.sh as /init and cellrun.sh as
#    /bin/cellrun. Rebuilt only when an input changes (stamp file).
#
# Cache folder: $ROCE_GUEST_CACHE, default <repo>/.cache/guest (gitignored). Outputs there:
#   kernel/vmlinuz, initramfs.cpio.gz, initramfs.stamp, kernel/VERSION, setup-timings.txt
# Every step is bounded by `timeout`; a failing step says which step failed.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=lib.sh
. "$HERE/lib.sh"

[ "$(id -u)" -eq 0 ] || rg_die "setup: must run as root (installs packages, builds an initramfs)"
CACHE="$(rg_cache_dir)"
mkdir -p "$CACHE"
# One setup at a time per cache (two harness runs may start together).
exec 9>"$CACHE/.setup.lock"
flock -w 1500 9 || rg_die "setup: another setup holds $CACHE/.setup.lock for over 25 minutes"
TIMINGS="$CACHE/setup-timings.txt"
: >"$TIMINGS"

# ---------------------------------------------------------------- 1. packages
rg_phase_begin "package install"
pkgs=(qemu-system-x86 busybox-static kmod cpio gzip xz-utils zstd ibverbs-utils perftest rdmacm-utils rdma-core
      ibverbs-providers iproute2 iputils-ping tshark)
need=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
    rg_log "setup: installing ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections
    rg_step 600 "apt-get update" apt-get update -q
    rg_step 1200 "apt-get install ${need[*]}" apt-get install -y -q --no-install-recommends "${need[@]}"
    APT_UPDATED=1
else
    rg_log "setup: all packages present"
fi
rg_phase_end "package install" | tee -a "$TIMINGS"

# ---------------------------------------------------------------- 2. kernel
rg_phase_begin "kernel fetch"
KDIR="$CACHE/kernel"
mkdir -p "$KDIR"
kdeb=""
if [ -f "$KDIR/DEB" ] && [ -f "$KDIR/$(cat "$KDIR/DEB")" ] && [ -f "$KDIR/vmlinuz" ] && [ -f "$KDIR/VERSION" ]; then
    kdeb="$(cat "$KDIR/DEB")"
    rg_log "setup: kernel cached: $kdeb"
else
    resolve() {
        apt-cache depends linux-image-amd64 2>/dev/null \
            | awk '$1=="Depends:" && $2 ~ /^linux-image-6\.1\.0-[0-9]+-amd64$/ {print $2; exit}'
    }
    kpkg="$(resolve || true)"
    if [ -z "$kpkg" ] && [ -z "${APT_UPDATED:-}" ]; then
        rg_step 600 "apt-get update" apt-get update -q
        kpkg="$(resolve || true)"
    fi
    [ -n "$kpkg" ] || rg_die "setup: could not resolve the linux-image-6.1.0-*-amd64 package that linux-image-amd64 depends on"
    rg_log "setup: downloading exactly one kernel package: $kpkg"
    rm -f "$KDIR"/*.deb
    # apt-get download writes into the current folder; _apt must be able to write there (else a warning).
    chown _apt "$KDIR" 2>/dev/null || true
    (cd "$KDIR" && rg_step 900 "apt-get download $kpkg" apt-get download -q "$kpkg")
    debs=("$KDIR"/"${kpkg}"_*.deb)
    [ ${#debs[@]} -eq 1 ] && [ -f "${debs[0]}" ] || rg_die "setup: expected one ${kpkg}_*.deb in $KDIR, found: ${debs[*]}"
    kdeb="$(basename "${debs[0]}")"
    rm -rf "$KDIR/root"
    rg_step 300 "dpkg -x $kdeb" dpkg -x "$KDIR/$kdeb" "$KDIR/root"
    kver="$(ls "$KDIR/root/lib/modules" | head -n1)"
    [ -n "$kver" ] && [ -f "$KDIR/root/boot/vmlinuz-$kver" ] || rg_die "setup: no kernel image in $kdeb"
    rg_step 300 "depmod $kver" depmod -b "$KDIR/root" "$kver"
    cp "$KDIR/root/boot/vmlinuz-$kver" "$KDIR/vmlinuz"
    echo "$kver" >"$KDIR/VERSION"
    echo "$kdeb" >"$KDIR/DEB"
fi
KVER="$(cat "$KDIR/VERSION")"
rg_phase_end "kernel fetch" | tee -a "$TIMINGS"

# ---------------------------------------------------------------- 3. initramfs
rg_phase_begin "initramfs build"
# Modules to load, in this order (crc32_generic before rdma_rxe: rxe's ICRC needs the "crc32" shash).
# sch_htb, sch_tbf, sch_red, cls_u32: the shaped, ECN-marking bottleneck of tests/guest/router.sh.
MODULES=(crc32_generic virtio_pci virtio_net rdma_rxe ib_uverbs rdma_ucm sch_htb sch_tbf sch_red cls_u32)
# Tools in the guest (iproute2's `tc`: busybox's has no RED). The rxe provider is dlopen()ed, so it is listed by path, not found by ldd.
TOOLS=(ibv_rc_pingpong ibv_uc_pingpong ibv_ud_pingpong ibv_srq_pingpong ibv_devinfo ibv_devices
       ib_send_bw ib_write_bw ib_read_bw ib_atomic_bw ib_send_lat ib_write_lat ib_read_lat ib_atomic_lat
       rping ucmatose udaddy rdma tc)
tool_paths=()
for t in "${TOOLS[@]}"; do
    p="$(command -v "$t" || true)"
    [ -n "$p" ] || rg_die "setup: tool $t not found on the host (package missing?)"
    tool_paths+=("$(readlink -f "$p")")
done
provider="$(ls /usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav*.so 2>/dev/null | head -n1)"
[ -n "$provider" ] || rg_die "setup: rxe provider librxe-rdmav*.so not found (ibverbs-providers missing?)"
[ -f /etc/libibverbs.d/rxe.driver ] || rg_die "setup: /etc/libibverbs.d/rxe.driver missing"
BUSYBOX=/bin/busybox
[ -x "$BUSYBOX" ] && "$BUSYBOX" --list >/dev/null 2>&1 || rg_die "setup: $BUSYBOX missing (busybox-static)"

stamp_input() {
    echo "kernel $kdeb $KVER"
    echo "modules ${MODULES[*]}"
    echo "tools ${TOOLS[*]}"
    echo "provider $provider"
    dpkg-query -W -f='${Package} ${Version}\n' busybox-static ibverbs-utils perftest rdmacm-utils \
        ibverbs-providers libibverbs1 librdmacm1 iproute2 libc6 2>/dev/null || true
    sha256sum "$HERE/setup.sh" "$HERE/init.sh" "$HERE/cellrun.sh" | awk '{print $1}'
}
STAMP="$(stamp_input | sha256sum | awk '{print $1}')"
INITRD="$CACHE/initramfs.cpio.gz"
if [ -f "$INITRD" ] && [ "$(cat "$CACHE/initramfs.stamp" 2>/dev/null)" = "$STAMP" ]; then
    rg_log "setup: initramfs up to date: $INITRD"
else
    rg_log "setup: building initramfs for kernel $KVER"
    ROOT="$CACHE/initramfs.root"
    rm -rf "$ROOT"
    mkdir -p "$ROOT"/{usr/bin,usr/sbin,usr/lib/x86_64-linux-gnu,usr/lib64,etc/libibverbs.d,proc,sys,dev,tmp,run,job}
    ln -s usr/lib "$ROOT/lib"
    ln -s usr/lib64 "$ROOT/lib64"
    mkdir -p "$ROOT/bin" "$ROOT/sbin"

    # busybox and its applets (busybox's `ip` serves for addresses; iproute2's `rdma` is copied below).
    cp "$BUSYBOX" "$ROOT/bin/busybox"
    for a in $("$BUSYBOX" --list); do
        [ -e "$ROOT/bin/$a" ] || ln -s busybox "$ROOT/bin/$a"
    done

    # Files with their shared libraries; each library lands at the path ldd names (lib -> usr/lib above).
    copy_file() {  # SRC [DEST-IN-ROOT]
        local src="$1" dst="${2:-$1}"
        mkdir -p "$ROOT$(dirname "$dst")"
        [ -e "$ROOT$dst" ] || cp -L "$src" "$ROOT$dst"
    }
    copy_with_libs() {
        local f="$1" dst="${2:-$1}" lib
        copy_file "$f" "$dst"
        for lib in $(ldd "$f" 2>/dev/null | awk '/=> \//{print $3} /^\s*\/[^ ]*ld-linux/{print $1}'); do
            copy_file "$lib"
        done
    }
    for p in "${tool_paths[@]}"; do
        copy_with_libs "$p" "/usr/bin/$(basename "$p")"
    done
    copy_with_libs "$provider"
    copy_file /etc/libibverbs.d/rxe.driver
    # glibc dlopen()s libgcc_s for pthread_exit / pthread_cancel (rping's threads end that way: without
    # it, "libgcc_s.so.1 must be installed for pthread_exit to work" and SIGABRT); ldd does not list it.
    libgcc="$(ldconfig -p | awk '/libgcc_s\.so\.1 .*x86-64/ {print $NF; exit}')"
    [ -n "$libgcc" ] || rg_die "setup: libgcc_s.so.1 not found (libgcc-s1 missing?)"
    copy_file "$libgcc"
    [ -e "$ROOT/lib64/ld-linux-x86-64.so.2" ] || copy_file /lib64/ld-linux-x86-64.so.2
    # rdma-core's tools resolve nothing by name, but glibc wants these to exist.
    printf 'root:x:0:0:root:/:/bin/sh\n' >"$ROOT/etc/passwd"
    printf 'root:x:0:\n' >"$ROOT/etc/group"
    printf '127.0.0.1 localhost\n::1 localhost\n' >"$ROOT/etc/hosts"
    printf 'hosts: files\n' >"$ROOT/etc/nsswitch.conf"
    ldconfig -r "$ROOT" 2>/dev/null || true

    # Kernel modules in dependency order, decompressed (busybox insmod takes plain .ko).
    MROOT="$KDIR/root"
    : >"$ROOT/etc/modules.order"
    declare -A seen=()
    for m in "${MODULES[@]}"; do
        deps="$(timeout 60 modprobe -d "$MROOT" -S "$KVER" --show-depends "$m" 2>&1)" \
            || rg_die "setup: modprobe --show-depends $m failed: $deps"
        while read -r kind path _; do
            [ "$kind" = insmod ] || continue
            rel="${path#"$MROOT"}"
            case "$rel" in
                *.ko.xz) out="${rel%.xz}";  dec=(xz -dc) ;;
                *.ko.zst) out="${rel%.zst}"; dec=(zstd -qdc) ;;
                *.ko.gz) out="${rel%.gz}";  dec=(gzip -dc) ;;
                *) out="$rel"; dec=(cat) ;;
            esac
            [ -n "${seen[$out]:-}" ] && continue
            seen[$out]=1
            mkdir -p "$ROOT$(dirname "$out")"
            "${dec[@]}" "$path" >"$ROOT$out"
            echo "$out" >>"$ROOT/etc/modules.order"
        done <<<"$deps"
    done
    grep -q rdma_rxe "$ROOT/etc/modules.order" || rg_die "setup: rdma_rxe not among the modules: $(cat "$ROOT/etc/modules.order")"

    install -m 0755 "$HERE/init.sh" "$ROOT/init"
    install -m 0755 "$HERE/cellrun.sh" "$ROOT/bin/cellrun"
    echo "$KVER" >"$ROOT/etc/kernel-version"

    tmp="$INITRD.tmp"
    (cd "$ROOT" && find . -mindepth 1 | LC_ALL=C sort | timeout 300 cpio -o -H newc --quiet -R 0:0 | gzip -1 >"$tmp") \
        || rg_die "setup: cpio/gzip of the initramfs failed"
    mv "$tmp" "$INITRD"
    echo "$STAMP" >"$CACHE/initramfs.stamp"
    rg_log "setup: initramfs $(du -h "$INITRD" | cut -f1): $(wc -l <"$ROOT/etc/modules.order") modules, ${#TOOLS[@]} tools"
fi
rg_phase_end "initramfs build" | tee -a "$TIMINGS"
rg_log "setup: kernel $CACHE/kernel/vmlinuz ($KVER), initramfs $INITRD"
