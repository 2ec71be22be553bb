#!/usr/bin/env bash
# Step time of the example trainer (examples/train.py: DDP and FSDP2), our backend against Gloo,
# on 2 and 4 ranks, interleaved (rocecoll, gloo, rocecoll, gloo, ... per mode and rank count),
# best median of ROUNDS runs each (issue 20). MODES (default "ddp fsdp"; also "hook"). Prints the load average before and after: figures taken at a
# load above the CPU count say little. Run by hand, not a test.
#
#   PY=/root/.cache/rdma-py/venv-torch27/bin/python ROUNDS=3 STEPS=200 \
#       bash collectives/python/benches/trainer_steps.sh
#
# ROCECOLL_TRANSPORT (shm by default) picks our transport; OMP_NUM_THREADS=1 for every rank.
set -euo pipefail
HERE=$(cd "$(dirname "$0")/.." && pwd)
PY=${PY:-/root/.cache/rdma-py/venv-torch27/bin/python}
ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-200}
NPROCS=${NPROCS:-"2 4"}
MODES=${MODES:-"ddp fsdp"}
export OMP_NUM_THREADS=1 ROCECOLL_TRANSPORT=${ROCECOLL_TRANSPORT:-shm}

echo "# load average before: $(cut -d' ' -f1-3 /proc/loadavg); $ROUNDS rounds of $STEPS steps"
declare -A best
for mode in $MODES; do
    for n in $NPROCS; do
        for ((r = 0; r < ROUNDS; r++)); do
            for backend in rocecoll gloo; do
                line=$(timeout 900 "$PY" -m torch.distributed.run --standalone --nproc-per-node "$n" \
                    "$HERE/examples/train.py" --backend "$backend" --mode "$mode" --steps "$STEPS" 2>&1 |
                    grep "median step" | tail -1)
                ms=$(sed -E 's/.*median step ([0-9.]+) ms.*/\1/' <<<"$line")
                [ -n "$ms" ] || { echo "no median step from $backend $mode on $n ranks: $line" >&2; exit 1; }
                key="$backend/$mode/$n"
                if [ -z "${best[$key]:-}" ] || awk -v a="$ms" -v b="${best[$key]}" 'BEGIN{exit !(a < b)}'; then
                    best[$key]=$ms
                fi
            done
        done
    done
done
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "mode ranks gloo_ms rocecoll_ms gloo/rocecoll"
for mode in $MODES; do
    for n in $NPROCS; do
        awk -v m="$mode" -v n="$n" -v g="${best[gloo/$mode/$n]}" -v o="${best[rocecoll/$mode/$n]}" \
            'BEGIN{printf "%s %d %.3f %.3f %.2fx\n", m, n, g, o, g / o}'
    done
done
