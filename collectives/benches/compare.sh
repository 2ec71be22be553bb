#!/usr/bin/env bash
# The all-reduce benchmark of issue 6, run by hand (not a test): 4 local ranks, f32 sum, sizes
# MIN..MAX (default 1 KiB .. 64 MiB, factor 4), in one run, side by side with ratios:
#   coll-perf --transport roce   RDMA WRITE_WITH_IMM on the software HCA over loopback UDP
#   coll-perf --transport shm    the shared-memory path
#   Open MPI MPI_Allreduce       --mca btl tcp,self (TCP over loopback) and --mca btl vader,self
#                                (shared memory), benches/mpi_allreduce.c built with mpicc
#   PyTorch Gloo                 torch.distributed all_reduce on CPU, if torch installs from PyPI
#                                within GLOO_INSTALL_TIMEOUT seconds (default 600), else skipped
#   the floors (issue 21)        benches/floor.rs: the bytes one ring all-reduce moves, sent and
#                                received by a plain program (threads, no RDMA engine) plus one
#                                reduction pass: `udp` as RoCE-sized UDP GSO trains with GRO,
#                                `tcp` over TCP; FLOORS=0 skips them
# Every column is nccl-tests' bus bandwidth (GB/s) of the out-of-place operation: algbw * 2(n-1)/n,
# the time averaged over ITERS iterations (after WARMUP) and over ranks. The ratios compare each
# path of this crate with what a user would pick instead: roce/tcp, shm/vader, roce/gloo, and
# the RoCE path with the kernel's floors: roce/fudp, roce/ftcp (issue 21's goal: roce/fudp >=
# 1/1.3 = 0.77 from 1 MiB up). The load average is printed before and after the run.
#
# Usage: collectives/benches/compare.sh            (as root: installs openmpi when missing)
#   MIN=1K MAX=64M FACTOR=4 ITERS=20 WARMUP=5 NRANKS=4 ROUNDS=1 GLOO=0 (skip Gloo) ...
#
# NETNS=1 (issue 21; root and iproute2): the multi-host stand-in of collectives/tests/netns.rs.
# Every rank runs in a network namespace of its own (`<prefix>r<k>`, eth0 10.79.0.<k+1>/24, a
# veth pair to bridge br0 in namespace `<prefix>sw`, which holds 10.79.0.254 for the launchers),
# so its only network is its veth; the prefix carries this script's pid, the addresses exist only
# inside the namespaces, and the namespaces are deleted at exit (trap). Columns then:
#   roce   coll-perf --transport roce, one process per namespace, bootstrapped the torchrun way
#          (RANK / WORLD_SIZE / MASTER_ADDR: rank 0's address)
#   tcp    Open MPI, btl tcp,self, pml ob1: mpirun runs in the bridge's namespace with
#          `--host 10.79.0.1,...` and a plm_rsh_agent script that starts each host's orted in
#          that host's namespace (`ip netns exec`, no ssh). Each namespace looks like a host
#          with one slot, so Open MPI would busy-poll without yielding (4 spinning ranks on 2
#          CPUs: 20-40 ms per all-reduce of 1-64 KiB in a trial run): mpi_yield_when_idle 1 is
#          set, as --oversubscribe sets it in the local run (NETNS_MPI_YIELD=0 leaves it out)
#   gloo   torch.distributed Gloo, one process per namespace (GLOO_SOCKET_IFNAME=eth0)
# shm, vader and the floors have no meaning across hosts (the floors are one process on
# loopback): they are left out ("-").
# Other load on the machine skews every figure. The columns run one after the other; with
# ROUNDS=k every column runs k times, interleaved, and the table keeps each one's best run per
# size, so that a burst of other load does not land on one column only.
set -euo pipefail

MIN=${MIN:-1K}
MAX=${MAX:-64M}
FACTOR=${FACTOR:-4}
ITERS=${ITERS:-20}
WARMUP=${WARMUP:-5}
NRANKS=${NRANKS:-4}
ROUNDS=${ROUNDS:-1}
GLOO=${GLOO:-1}
FLOORS=${FLOORS:-1}
[ "${NETNS:-0}" = 1 ] && FLOORS=0
GLOO_INSTALL_TIMEOUT=${GLOO_INSTALL_TIMEOUT:-600}
NETNS=${NETNS:-0}
NETNS_MPI_YIELD=${NETNS_MPI_YIELD:-1}
# A bound on each run of a column (seconds): a hung rank fails that run, not the script.
RUN_TIMEOUT=${RUN_TIMEOUT:-900}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
WORK=$(mktemp -d)
# NETNS=1: the namespaces this run created, deleted at exit.
NSP=cmp$$
CREATED_NS=()
cleanup() {
    local ns
    kill $(jobs -p) 2>/dev/null || true
    wait 2>/dev/null || true
    for ns in "${CREATED_NS[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [ "$NETNS" = 1 ]; then
    if [ "$(id -u)" -ne 0 ] || ! ip -V >/dev/null 2>&1; then
        echo "NETNS=1 needs root and iproute2's ip (network namespaces)" >&2
        exit 1
    fi
    netns_add() {
        ip netns add "$1"
        CREATED_NS+=("$1")
        ip -n "$1" link set lo up
    }
    # 10.79.0.0/24 (netns.rs uses 10.77 and 10.78); these addresses exist only in the namespaces.
    netns_add "${NSP}sw"
    ip -n "${NSP}sw" link add br0 type bridge
    ip -n "${NSP}sw" addr add 10.79.0.254/24 dev br0
    ip -n "${NSP}sw" link set br0 up
    HOSTS=""
    for k in $(seq 0 $((NRANKS - 1))); do
        netns_add "${NSP}r$k"
        ip -n "${NSP}sw" link add "p$k" type veth peer name eth0 netns "${NSP}r$k"
        ip -n "${NSP}sw" link set "p$k" master br0 up
        ip -n "${NSP}r$k" addr add "10.79.0.$((k + 1))/24" dev eth0
        ip -n "${NSP}r$k" link set eth0 up
        HOSTS="${HOSTS:+$HOSTS,}10.79.0.$((k + 1))"
    done
    # Open MPI's remote launcher, called as "agent HOST command...": runs the command as ssh
    # would (one shell line) in the namespace of HOST (10.79.0.<k+1> -> <prefix>r<k>).
    printf '%s\n' '#!/bin/sh' 'host=$1' 'shift' \
        "exec ip netns exec \"${NSP}r\$((\${host##*.} - 1))\" sh -c \"\$*\"" >"$WORK/netns-agent.sh"
    chmod +x "$WORK/netns-agent.sh"
    echo "NETNS=1: ranks in namespaces ${NSP}r0..$((NRANKS - 1)) at $HOSTS, bridge br0 in ${NSP}sw" >&2
fi

bytes() { # 1K -> 1024, 64M -> 67108864
    local v=$1
    case $v in
        *K) echo $((${v%K} << 10)) ;;
        *M) echo $((${v%M} << 20)) ;;
        *G) echo $((${v%G} << 30)) ;;
        *) echo "$v" ;;
    esac
}
MINB=$(bytes "$MIN")
MAXB=$(bytes "$MAX")

echo "building coll-perf ..." >&2
(cd "$ROOT" && cargo build --release -q -p collectives --bin coll-perf)
PERF=$TARGET/release/coll-perf
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
if [ "$FLOORS" = 1 ]; then
    echo "building the floor benchmark ..." >&2
    FLOOR=$(cd "$ROOT" && cargo bench -q -p collectives --bench floor --no-run --message-format=json 2>/dev/null |
        python3 -c 'import json, sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "floor" and m.get("executable"):
        print(m["executable"])')
    if [ -z "$FLOOR" ]; then
        echo "the floor benchmark did not build: floors skipped" >&2
        FLOORS=0
    fi
fi

# mpicc without mpi.h (openmpi-bin without libopenmpi-dev) counts as missing too.
if ! command -v mpicc >/dev/null || ! command -v mpirun >/dev/null ||
    ! echo '#include <mpi.h>' | mpicc -x c -E - >/dev/null 2>&1; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "Open MPI is missing and this is not root: install openmpi-bin libopenmpi-dev" >&2
        exit 1
    fi
    echo "installing Open MPI ..." >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y openmpi-bin libopenmpi-dev >/dev/null
fi
mpicc -O2 -o "$WORK/mpi_allreduce" "$ROOT/collectives/benches/mpi_allreduce.c"

# Each runner prints "size busbw" lines, out of place.
run_coll_perf() { # transport
    local args=(all-reduce --transport "$1" -d float -o sum
        -b "$MINB" -e "$MAXB" -f "$FACTOR" -n "$ITERS" -w "$WARMUP" -c 1)
    if [ "$NETNS" = 1 ]; then
        # One process per namespace; rank 0 serves the rendezvous on its address and prints.
        local port=$((20000 + RANDOM % 20000)) pids=() k rc=0
        for k in $(seq 0 $((NRANKS - 1))); do
            RANK=$k WORLD_SIZE=$NRANKS LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 MASTER_ADDR=10.79.0.1 \
                MASTER_PORT=$port timeout "$RUN_TIMEOUT" \
                ip netns exec "${NSP}r$k" "$PERF" "${args[@]}" >"$WORK/cp-$1-$k.txt" 2>"$WORK/cp-$1-$k.err" &
            pids+=($!)
        done
        for k in "${pids[@]}"; do wait "$k" || rc=$?; done
        if [ "$rc" -ne 0 ]; then
            echo "coll-perf across namespaces failed ($rc):" >&2
            tail -n 5 "$WORK"/cp-"$1"-*.err >&2
            return 1
        fi
        cp "$WORK/cp-$1-0.txt" "$WORK/cp-$1.txt"
    else
        "$PERF" "${args[@]}" --ranks "$NRANKS" >"$WORK/cp-$1.txt"
    fi
    # busbw from the time column (us): coll-perf prints bandwidths with two decimals only.
    awk -v n="$NRANKS" '!/^#/ && NF == 13 {
        if ($9 != "0") { print "wrong results: " $0 > "/dev/stderr"; exit 1 }
        print $1, $1 / $6 / 1e3 * 2 * (n - 1) / n }' "$WORK/cp-$1.txt"
}

run_mpi() { # btl
    local root_flags=() place=(--oversubscribe) netns=()
    [ "$(id -u)" -eq 0 ] && root_flags=(--allow-run-as-root)
    if [ "$NETNS" = 1 ]; then
        # mpirun in the bridge's namespace; each host's orted in its rank's namespace.
        netns=(ip netns exec "${NSP}sw")
        place=(--host "$HOSTS" --mca plm_rsh_agent "$WORK/netns-agent.sh"
            --mca plm_rsh_no_tree_spawn 1 --mca pml ob1)
        [ "$NETNS_MPI_YIELD" = 1 ] && place+=(--mca mpi_yield_when_idle 1)
    fi
    # orted's "setpgid failed" warning under ip netns exec is dropped; other stderr stays.
    timeout "$RUN_TIMEOUT" "${netns[@]}" mpirun "${root_flags[@]}" "${place[@]}" -np "$NRANKS" \
        --mca btl "$1" "$WORK/mpi_allreduce" "$MINB" "$MAXB" "$FACTOR" "$ITERS" "$WARMUP" \
        >"$WORK/mpi-$1.txt" 2> >(grep -v "setpgid" >&2)
    awk '{ if ($5 != "0") { print "wrong results: " $0 > "/dev/stderr"; exit 1 } print $1, $4 }' \
        "$WORK/mpi-$1.txt"
}

run_floor() { # udp|tcp
    "$FLOOR" "$1" "$NRANKS" "$MINB" "$MAXB" "$FACTOR" "$ITERS" "$WARMUP" >"$WORK/floor-$1.txt"
    awk '{ if ($3 != "0") { print "wrong results: " $0 > "/dev/stderr"; exit 1 } print $1, $2 }' \
        "$WORK/floor-$1.txt"
}

GLOO_PY=${GLOO_PY:-}
setup_gloo() {
    [ "$GLOO" = 1 ] || return 1
    if [ -n "$GLOO_PY" ] && "$GLOO_PY" -c 'import torch.distributed' 2>/dev/null; then
        return 0
    fi
    for py in python3 /usr/bin/python3; do
        if command -v "$py" >/dev/null && "$py" -c 'import torch.distributed' 2>/dev/null; then
            GLOO_PY=$py
            return 0
        fi
    done
    local venv=${GLOO_VENV:-/tmp/coll-compare-gloo-venv}
    if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import torch' 2>/dev/null; then
        echo "installing torch from PyPI into $venv (at most ${GLOO_INSTALL_TIMEOUT}s) ..." >&2
        python3 -m venv "$venv" >/dev/null 2>&1 || return 1
        timeout "$GLOO_INSTALL_TIMEOUT" "$venv/bin/pip" install --quiet torch numpy >/dev/null 2>&1 ||
            return 1
    fi
    GLOO_PY=$venv/bin/python
}

run_gloo() {
    cat >"$WORK/gloo.py" <<'PY'
import os, sys, time
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

def rank_main(rank, n, port, minb, maxb, factor, iters, warmup, out, master="127.0.0.1"):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{master}:{port}", rank=rank, world_size=n)
    size = minb
    lines = []
    while size <= maxb:
        count = size // 4
        x = torch.full((count,), float(rank + 1), dtype=torch.float32)
        y = x.clone()
        for _ in range(warmup):
            y.copy_(x); dist.all_reduce(y)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            y.copy_(x); dist.all_reduce(y)
        t = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64)
        dist.all_reduce(t)
        t = t.item() / n
        wrong = int((y != float(n * (n + 1) // 2)).sum())
        algbw = size / t / 1e9
        lines.append(f"{size} {algbw * 2 * (n - 1) / n:.5f} {wrong}")
        size *= factor
    if rank == 0:
        with open(out, "w") as f:
            f.write("\n".join(lines) + "\n")
    dist.destroy_process_group()

if __name__ == "__main__":
    n, port = int(sys.argv[1]), int(sys.argv[2])
    args = [int(a) for a in sys.argv[3:8]]
    if len(sys.argv) > 10:
        # One rank of this process (NETNS=1): RANK MASTER_ADDR follow the output file.
        rank_main(int(sys.argv[9]), n, port, *args, sys.argv[8], sys.argv[10])
    else:
        mp.spawn(rank_main, args=(n, port, *args, sys.argv[8]), nprocs=n)
PY
    local port=$((20000 + RANDOM % 20000))
    # The copy before each all_reduce keeps the input constant (in place, as Gloo works); it is
    # timed too, a small extra cost against Gloo.
    local gargs=("$WORK/gloo.py" "$NRANKS" "$port" "$MINB" "$MAXB" "$FACTOR" "$ITERS" "$WARMUP"
        "$WORK/gloo.txt")
    rm -f "$WORK/gloo.txt"
    if [ "$NETNS" = 1 ]; then
        local pids=() k rc=0
        for k in $(seq 0 $((NRANKS - 1))); do
            GLOO_SOCKET_IFNAME=eth0 TORCH_CPP_LOG_LEVEL=ERROR timeout "$RUN_TIMEOUT" \
                ip netns exec "${NSP}r$k" \
                "$GLOO_PY" "${gargs[@]}" "$k" 10.79.0.1 >&2 &
            pids+=($!)
        done
        for k in "${pids[@]}"; do wait "$k" || rc=$?; done
        [ "$rc" -eq 0 ] || return 1
    else
        timeout "$RUN_TIMEOUT" "$GLOO_PY" "${gargs[@]}" >&2
    fi
    awk '{ if ($3 != "0") { print "wrong results: " $0 > "/dev/stderr"; exit 1 } print $1, $2 }' \
        "$WORK/gloo.txt"
}

HAVE_GLOO=0
if setup_gloo; then
    HAVE_GLOO=1
    echo "PyTorch Gloo: torch $("$GLOO_PY" -c 'import torch; print(torch.__version__)' 2>/dev/null)" >&2
else
    echo "PyTorch Gloo: torch not installable here: skipped" >&2
fi
for col in roce shm tcp vader gloo fudp ftcp; do : >"$WORK/$col"; done
for round in $(seq "$ROUNDS"); do
    echo "round $round/$ROUNDS: coll-perf --transport roce ..." >&2
    run_coll_perf roce >>"$WORK/roce"
    if [ "$NETNS" != 1 ]; then
        echo "round $round/$ROUNDS: coll-perf --transport shm ..." >&2
        run_coll_perf shm >>"$WORK/shm"
    fi
    echo "round $round/$ROUNDS: Open MPI, btl tcp,self ..." >&2
    run_mpi tcp,self >>"$WORK/tcp"
    if [ "$NETNS" != 1 ]; then
        echo "round $round/$ROUNDS: Open MPI, btl vader,self ..." >&2
        run_mpi vader,self >>"$WORK/vader"
    fi
    if [ "$HAVE_GLOO" = 1 ]; then
        echo "round $round/$ROUNDS: PyTorch Gloo ..." >&2
        run_gloo >>"$WORK/gloo" || echo "Gloo run failed: skipped" >&2
    fi
    if [ "$FLOORS" = 1 ]; then
        echo "round $round/$ROUNDS: floor over UDP GSO/GRO ..." >&2
        run_floor udp >>"$WORK/fudp" || echo "UDP floor failed: skipped" >&2
        echo "round $round/$ROUNDS: floor over TCP ..." >&2
        run_floor tcp >>"$WORK/ftcp" || echo "TCP floor failed: skipped" >&2
    fi
done

echo
echo "# all-reduce, $NRANKS ranks on $(nproc) CPUs, float sum, out of place; busbw in GB/s"
if [ "$NETNS" = 1 ]; then
    echo "# NETNS=1: one rank per network namespace, veth pairs on one bridge (10.79.0.0/24);"
    echo "#  ompi-tcp across the same namespaces (plm_rsh_agent: ip netns exec), mpi_yield_when_idle $NETNS_MPI_YIELD"
fi
echo "# ($(uname -r); $(mpirun --version 2>/dev/null | head -1); iters $ITERS, warmup $WARMUP;"
echo "#  best of $ROUNDS interleaved run(s) per column; fudp / ftcp: the floors, benches/floor.rs)"
echo "# load average (1/5/15 min) before: $LOAD_BEFORE   after: $(cut -d' ' -f1-3 /proc/loadavg)"
awk '
    BEGIN { col_of["roce"] = 1; col_of["shm"] = 2; col_of["tcp"] = 3; col_of["vader"] = 4
            col_of["gloo"] = 5; col_of["fudp"] = 6; col_of["ftcp"] = 7 }
    { k = split(FILENAME, path, "/"); f = col_of[path[k]] }
    { if (!((f, $1) in v) || $2 > v[f, $1]) v[f, $1] = $2 }
    f == 1 && !($1 in seen) { seen[$1] = 1; sizes[++ns] = $1 }
    function col(k, s) { return ((k, s) in v) ? sprintf("%9.4f", v[k, s]) : sprintf("%9s", "-") }
    function ratio(a, b, s) {
        return ((a, s) in v && (b, s) in v && v[b, s] > 0) ? sprintf("%9.2f", v[a, s] / v[b, s]) \
                                                           : sprintf("%9s", "-")
    }
    END {
        printf "%12s %9s %9s %9s %9s %9s %9s %9s %9s %9s %9s %9s %9s\n", "size(B)", "roce", "shm",
               "ompi-tcp", "ompi-vader", "gloo", "fudp", "ftcp", "roce/tcp", "shm/vader",
               "roce/gloo", "roce/fudp", "roce/ftcp"
        for (i = 1; i <= ns; i++) {
            s = sizes[i]
            printf "%12d %s %s %s %s %s %s %s %s %s %s %s %s\n", s, col(1, s), col(2, s), col(3, s),
                   col(4, s), col(5, s), col(6, s), col(7, s), ratio(1, 3, s), ratio(2, 4, s),
                   ratio(1, 5, s), ratio(1, 6, s), ratio(1, 7, s)
        }
    }' "$WORK/roce" "$WORK/shm" "$WORK/tcp" "$WORK/vader" "$WORK/gloo" "$WORK/fudp" "$WORK/ftcp"
