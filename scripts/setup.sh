#!/usr/bin/env bash
# One-command set-up on a fresh clone: a virtual environment with exactly the packages of
# requirements/cpu.lock.txt (the CPU build of torch, exitbench's dependencies and dev tools: every version
# pinned, every file checked against its sha256, nothing resolved), exitbench itself on top, and DVC
# initialised. Safe to re-run: pins already installed are kept, others are moved to the lock's version.
# GPU users: put a CUDA torch into .venv first and set EXITBENCH_SKIP_TORCH=1 (see below).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
LOCK=requirements/cpu.lock.txt
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv with $($PY --version)"
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
install_from=$LOCK
if [ "${EXITBENCH_SKIP_TORCH:-0}" = "1" ]; then
  # Keep the CUDA torch already in .venv: install the lock less torch and what only torch needs (sympy,
  # mpmath, networkx: the CUDA build brought its own, at versions it accepts). The lock has no other
  # CUDA-specific pins to leave out: the CPU wheel needs no nvidia-* or triton packages, so it names none.
  if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    echo "error: EXITBENCH_SKIP_TORCH=1 but .venv has no torch: install your CUDA build of torch (>=2.4,<3)" \
      "into .venv first (.venv/bin/pip install torch ...), or unset EXITBENCH_SKIP_TORCH for the CPU lock" >&2
    exit 1
  fi
  install_from=$(mktemp)
  trap 'rm -f "$install_from"' EXIT
  .venv/bin/python scripts/check_lock.py --without torch --export "$install_from"
fi
# Exactly the lock: --require-hashes refuses any file whose sha256 is not listed, --no-deps resolves nothing,
# so every day and every machine gets the same set (a torch pin with hashes also keeps the CUDA build away).
.venv/bin/python -m pip install -q --require-hashes --no-deps -r "$install_from"
# exitbench on top, editable; --no-deps: pyproject.toml's ranges are not resolved again.
.venv/bin/python -m pip install -q --no-deps -e .
if [ "${EXITBENCH_SKIP_TORCH:-0}" = "1" ]; then
  .venv/bin/python -m pip check || echo "[setup] warning: pip check found the conflicts above (your torch)" >&2
  .venv/bin/python scripts/check_lock.py --installed --allow-extra --without torch
else
  # The lock is complete (every installed package's requirements are met) and installed as pinned; packages
  # the lock does not name (an earlier `pip install -e .[hub]`) are listed as warnings.
  .venv/bin/python -m pip check
  .venv/bin/python scripts/check_lock.py --installed --allow-extra
fi
if [ ! -d .dvc ]; then
  .venv/bin/dvc init -q
fi
# only when not set: `dvc config` rewrites the file and drops its comments, leaving a fresh clone dirty
if ! .venv/bin/dvc config core.analytics 2>/dev/null | grep -qx false; then
  .venv/bin/dvc config core.analytics false >/dev/null 2>&1 || true
fi
echo "[setup] done. Activate with: source .venv/bin/activate"
