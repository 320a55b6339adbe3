#!/usr/bin/env bash
# Regenerates requirements/cpu.lock.txt, the environment scripts/setup.sh installs exactly, with pip-tools'
# pip-compile: pyproject.toml's [project.dependencies] and dev extra plus requirements/cpu.in (the CPU torch
# wheel), every version pinned and every file of it hashed. pip-compile runs from a virtual environment of
# its own outside the repository, so it never enters the project's; pip's configuration (index, find-links)
# applies as for any pip command.
#   bash scripts/update_lock.sh                          # keep every pin that still fits, add what is new
#   bash scripts/update_lock.sh --upgrade-package NAME   # move NAME (and what it needs) to the newest allowed
#   bash scripts/update_lock.sh --upgrade                # move everything to the newest allowed
# Then `bash scripts/setup.sh && .venv/bin/python -m pytest`, and commit the lock with the change that needed it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TOOLS=${EXITBENCH_LOCK_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/exitbench/pip-tools}
PIP_TOOLS="pip-tools==7.7.0"
if ! "$TOOLS/bin/python" -m pip show -q "${PIP_TOOLS%%==*}" 2>/dev/null \
    || [ "$("$TOOLS/bin/python" -m pip show "${PIP_TOOLS%%==*}" | sed -n 's/^Version: //p')" != "${PIP_TOOLS##*==}" ]; then
  echo "[lock] installing $PIP_TOOLS into $TOOLS"
  "$PY" -m venv "$TOOLS"
  "$TOOLS/bin/python" -m pip install -q "$PIP_TOOLS"
fi
CUSTOM_COMPILE_COMMAND="bash scripts/update_lock.sh" "$TOOLS/bin/pip-compile" --quiet \
  --generate-hashes --allow-unsafe --strip-extras --no-emit-index-url --no-emit-find-links \
  --extra dev --output-file requirements/cpu.lock.txt "$@" pyproject.toml requirements/cpu.in
"$TOOLS/bin/python" scripts/check_lock.py
