#!/usr/bin/env bash
# The Python package (collectives/python: rocecoll, PyO3 + maturin) and its tests (issue 20):
# builds and installs it with `pip install ./collectives/python` into a virtual environment
# cached outside the repository, with pinned torch / numpy / pytest, then runs its pytest suite
# (numpy references on 2 and 4 ranks over shm and RoCE, async / abort / timeout / killed rank,
# store bootstrap, the torch.distributed backend, the trainer against Gloo under torchrun).
#
# ROCECOLL_VENV (default /root/.cache/rdma-py/venv-torch27): the environment. The first install
# downloads about 3 GB (PyPI's Linux torch wheel pulls the CUDA libraries; 477 s, 5.2 GB on disk,
# measured 2026-12-04). PYTEST_ARGS: extra pytest arguments, split at spaces (e.g. "-x test_collectives.py").
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${ROCECOLL_VENV:-/root/.cache/rdma-py/venv-torch27}
PINS=(torch==2.7.1 numpy==2.1.3 pytest==8.3.3)

if ! "$VENV/bin/python" -c 'import torch, numpy, pytest' >/dev/null 2>&1; then
    echo "python: installing ${PINS[*]} into $VENV (about 3 GB the first time)"
    mkdir -p "$(dirname "$VENV")"
    python3 -m venv "$VENV"
    start=$(date +%s)
    timeout 1800 "$VENV/bin/pip" install --quiet "${PINS[@]}"
    echo "python: installed in $(($(date +%s) - start)) s, $(du -sh "$VENV" | cut -f1) on disk"
fi

# The build directory stays under the repository's (ignored) target/, so reruns build
# incrementally.
start=$(date +%s)
CARGO_TARGET_DIR="$ROOT/target/py" timeout 1800 "$VENV/bin/pip" install --quiet \
    --force-reinstall --no-deps "$ROOT/collectives/python"
echo "python: pip install ./collectives/python took $(($(date +%s) - start)) s"

cd "$ROOT/collectives/python/tests"
set +e
timeout 3000 "$VENV/bin/python" -m pytest -q -p no:cacheprovider ${PYTEST_ARGS:-}
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
    echo "python: pytest collected no tests (exit 5): the suite is missing" >&2
    exit 1
fi
exit "$rc"
