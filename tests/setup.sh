#!/usr/bin/env bash
# Installs, as root on Debian, the system packages the test suite and the benchmarks need, when missing.
# Idempotent and quiet when everything is present. Called by tests/ci.sh (the README's test command).
set -euo pipefail

need=()
command -v tshark >/dev/null 2>&1 || need+=(tshark)
/usr/bin/python3 -c 'import scapy' >/dev/null 2>&1 || need+=(python3-scapy)
# collectives/tests/mpirun.rs runs coll-perf under Open MPI's real launcher.
command -v mpirun >/dev/null 2>&1 || need+=(openmpi-bin)
# hca/abi/tests/debian_tools.rs runs Debian's own verbs programs on the drop-in libibverbs.so.1,
# reads its symbol versions with objdump / readelf, and compiles a dlvsym(3) check with cc.
command -v ibv_rc_pingpong >/dev/null 2>&1 || need+=(ibverbs-utils)
command -v ib_write_bw >/dev/null 2>&1 || need+=(perftest)
command -v objdump >/dev/null 2>&1 || need+=(binutils)
command -v cc >/dev/null 2>&1 || need+=(gcc libc6-dev)
# hca/build.rs compiles the AF_XDP link's XDP program (hca/xdp/roce_redirect.bpf.c) with clang's
# BPF target and libbpf-dev's bpf_helpers.h.
command -v clang >/dev/null 2>&1 || command -v clang-14 >/dev/null 2>&1 || need+=(clang-14)
[ -f /usr/include/bpf/bpf_helpers.h ] || need+=(libbpf-dev)
[ -f /usr/include/infiniband/verbs.h ] || need+=(libibverbs-dev)
# hca/abi/tests/rdmacm_tools.rs runs Debian's RDMA CM programs (rping, ucmatose, ...) on the drop-in
# librdmacm.so.1; hca/abi/src/rdmacm/regenerate-bindings.sh reads librdmacm-dev's rdma_cma.h.
command -v rping >/dev/null 2>&1 || need+=(rdmacm-utils)
[ -f /usr/include/rdma/rdma_cma.h ] || need+=(librdmacm-dev)
# hca/abi/tests/pyverbs.rs runs rdma-core's pyverbs test suite (shipped in python3-pyverbs) on it.
/usr/bin/python3 -c 'import pyverbs' >/dev/null 2>&1 || need+=(python3-pyverbs)
# hca/abi/tests/ucx.rs runs UCX's ucx_info / ucx_perftest (rc_verbs) and an Open MPI all-reduce with
# --mca pml ucx (mpicc from libopenmpi-dev) on it.
command -v ucx_perftest >/dev/null 2>&1 || need+=(ucx-utils)
command -v mpicc >/dev/null 2>&1 || need+=(libopenmpi-dev)

if [ ${#need[@]} -gt 0 ]; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "setup: missing ${need[*]}; run as root (or install them) and retry" >&2
        exit 1
    fi
    echo "setup: installing ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    # wireshark-common asks whether non-root users may capture; answer no, non-interactively.
    echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections
    timeout 600 apt-get update -q
    timeout 900 apt-get install -y -q --no-install-recommends "${need[@]}"
fi
