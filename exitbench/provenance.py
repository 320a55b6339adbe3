"""Where and how a number was measured: commit, config hash, versions, environment lock, hardware, threads, date."""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import json
import platform
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import torch
import transformers
from packaging.version import InvalidVersion, Version

#: tracked paths a run itself rewrites (DVC's lock, the results, DVC's config rewritten by scripts/setup.sh):
#: their changes say nothing about the code that made a number, so they do not make a commit ``+dirty``
RUN_OUTPUTS = ("dvc.lock", "results", ".dvc")


def git_commit(repo: Path | None = None) -> str:
    """HEAD's commit (with ``+dirty`` when tracked files other than :data:`RUN_OUTPUTS` differ), or ``unknown``
    outside git."""
    cwd = repo or Path.cwd()
    excluded = [f":(top,exclude){path}" for path in RUN_OUTPUTS]
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, check=True)
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "-uno", "--", ":(top)", *excluded], cwd=cwd, capture_output=True, text=True
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return sha.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def config_hash(config_view: dict[str, Any]) -> str:
    """sha256 (first 16 hex digits) of a resolved config, canonical JSON."""
    return hashlib.sha256(json.dumps(config_view, sort_keys=True).encode()).hexdigest()[:16]


LOCK_FILE = "requirements/cpu.lock.txt"
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)", re.MULTILINE)


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def environment_lock(root: Path | None = None) -> dict[str, Any] | None:
    """The pinned environment scripts/setup.sh installs: the lock file, its sha256, and this interpreter's
    packages that differ from it (``mismatched``: a GPU user's own torch, a hand-made upgrade; empty when the
    environment is the lock). None when there is no lock file (an exitbench installed without its repository).
    """
    found = _environment_lock(root)
    return None if found is None else {**found, "mismatched": list(found["mismatched"])}


@functools.lru_cache(maxsize=4)
def _environment_lock(root: Path | None) -> dict[str, Any] | None:
    candidates = [root] if root is not None else [Path.cwd(), Path(__file__).resolve().parents[1]]
    path = next((base / LOCK_FILE for base in candidates if (base / LOCK_FILE).is_file()), None)
    if path is None:
        return None
    data = path.read_bytes()
    installed = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            installed.setdefault(_canonical(name), dist.version)
    mismatched = []
    for name, version in _PIN.findall(data.decode()):
        have = installed.get(_canonical(name))
        if have is None or not _same_version(have, version):
            mismatched.append(f"{name} {have or 'missing'} (lock {version})")
    return {"file": LOCK_FILE, "sha256": hashlib.sha256(data).hexdigest(), "mismatched": mismatched}


def _same_version(a: str, b: str) -> bool:
    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return a == b


def device_name(device: torch.device | str = "cpu") -> str:
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


#: CPU flags that decide which bf16 and fp32 kernels torch can use (/proc/cpuinfo names)
CPU_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8")


@functools.cache
def cpu_features() -> dict[str, Any]:
    """The CPU's instruction-set features that choose kernels (the same model decodes 1.2x faster on one 2-core
    machine than on another): torch's dispatch level (``DEFAULT``, ``AVX2``, ``AVX512``) and which of
    :data:`CPU_FLAGS` the CPU reports (Linux; ``flags`` empty elsewhere)."""
    flags: set[str] = set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    return {
        "torch_capability": torch.backends.cpu.get_cpu_capability(),
        "flags": [flag for flag in CPU_FLAGS if flag in flags],
    }


def provenance(config_view: dict[str, Any], device: torch.device | str = "cpu", dtype: str = "") -> dict[str, Any]:
    """The provenance block every result file carries."""
    return {
        "git_commit": git_commit(),
        "params_hash": config_hash(config_view),
        "profile": config_view.get("profile"),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "environment_lock": environment_lock(),
        "device": device_name(device),
        "cpu_features": cpu_features(),
        "threads": torch.get_num_threads(),
        "dtype": dtype,
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
    }
