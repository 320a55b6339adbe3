#!/usr/bin/env bash
# One-command set-up on a fresh clone: a virtual environment with the CPU build of torch, exitbench and
# its dev tools, and DVC initialised. Safe to re-run. GPU users: activate an environment that already has
# a CUDA torch and set EXITBENCH_SKIP_TORCH=1 (pyproject accepts any torch>=2.4,<3).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv with $($PY --version)"
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
if [ "${EXITBENCH_SKIP_TORCH:-0}" != "1" ]; then
  # Pinned first: the CPU wheel. An unpinned torch would pull a multi-GB CUDA build.
  .venv/bin/python -m pip install -q "torch==2.13.0"
fi
.venv/bin/python -m pip install -q -e ".[dev]"
if [ ! -d .dvc ]; then
  .venv/bin/dvc init -q
fi
.venv/bin/dvc config core.analytics false >/dev/null 2>&1 || true
echo "[setup] done. Activate with: source .venv/bin/activate"
