#!/usr/bin/env bash
# Run the sandbox's adversarial suite as an ordinary user (uid/gid 65534), also when called as root (CI):
# in a private mount namespace, the interpreter and the repository are made reachable for that user
# (a folder such as /root, closed to others, is replaced there by a tmpfs holding only those two), then
# pytest runs under setpriv. As a non-root caller the suite simply runs as that caller.
set -euo pipefail
cd "$(dirname "$0")/.."
py=.venv/bin/python
if [ "$(id -u)" != 0 ]; then
  exec "$py" -m pytest -q -p no:cacheprovider tests/test_sandbox.py "$@"
fi
repo=$(pwd -P)
prefix=$("$py" -c 'import os, sys; print(os.path.realpath(sys.base_prefix))')
export EXITBENCH_DATA_MIRROR="${EXITBENCH_DATA_MIRROR:-$(cd .. && pwd -P)/shared/data}"
exec unshare --mount --propagation private -- "$py" - "$repo" "$prefix" "$EXITBENCH_DATA_MIRROR" "$@" <<'PY'
import os, subprocess, sys, tempfile
repo, prefix, mirror, *extra = sys.argv[1:]

def closed(path):
    return not os.stat(path).st_mode & 0o001  # others cannot traverse it

needed = [p for p in (repo, prefix, mirror) if os.path.isdir(p)]
stash = tempfile.mkdtemp(prefix="exitbench_user_")
# the topmost closed ancestor of each needed folder gets a tmpfs holding only the needed folders
tops = set()
for path in needed:
    parts = path.split("/")
    for i in range(2, len(parts)):
        ancestor = "/".join(parts[:i])
        if closed(ancestor):
            tops.add(ancestor)
            break
for top in sorted(tops, key=len):
    inside = [p for p in needed if p.startswith(top + "/")]
    for index, path in enumerate(inside):
        os.makedirs(f"{stash}/{index}")
        subprocess.run(["mount", "--bind", path, f"{stash}/{index}"], check=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=755", "tmpfs", top], check=True)
    for index, path in enumerate(inside):
        os.makedirs(path, exist_ok=True)
        subprocess.run(["mount", "--bind", f"{stash}/{index}", path], check=True)
env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "EXITBENCH_DATA_MIRROR": mirror, "PYTHONDONTWRITEBYTECODE": "1"}
command = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", "--",
           f"{repo}/.venv/bin/python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_sandbox.py", *extra]
sys.exit(subprocess.run(command, cwd=repo, env=env).returncode)
PY
