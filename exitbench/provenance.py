"""Where and how a number was measured: commit, config hash, versions, hardware, threads, date."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
import transformers


def git_commit(repo: Path | None = None) -> str:
    """HEAD's commit (with ``+dirty`` when tracked files differ), or ``unknown`` outside git."""
    cwd = repo or Path.cwd()
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "-uno"], cwd=cwd, capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return sha.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def config_hash(config_view: dict[str, Any]) -> str:
    """sha256 (first 16 hex digits) of a resolved config, canonical JSON."""
    return hashlib.sha256(json.dumps(config_view, sort_keys=True).encode()).hexdigest()[:16]


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


def provenance(config_view: dict[str, Any], device: torch.device | str = "cpu", dtype: str = "") -> dict[str, Any]:
    """The provenance block every result file carries."""
    return {
        "git_commit": git_commit(),
        "params_hash": config_hash(config_view),
        "profile": config_view.get("profile"),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "device": device_name(device),
        "threads": torch.get_num_threads(),
        "dtype": dtype,
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
    }
