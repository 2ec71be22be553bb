#!/usr/bin/env bash
# Installs, as root on Debian, the system packages the test suite and the benchmarks need, when missing.
# Idempotent and quiet when everything is present. Called by tests/ci.sh (the README's test command).
set -euo pipefail

need=()
command -v tshark >/dev/null 2>&1 || need+=(tshark)
/usr/bin/python3 -c 'import scapy' >/dev/null 2>&1 || need+=(python3-scapy)
# collectives/tests/mpirun.rs runs coll-perf under Open MPI's real launcher.
command -v mpirun >/dev/null 2>&1 || need+=(openmpi-bin)

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
