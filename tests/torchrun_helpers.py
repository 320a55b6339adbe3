"""Launch a 2-process gloo job under ``torchrun`` on this one machine, bounded in time.

Every address is the loopback: the rendezvous store and the workers' master address (``--local-addr``, else the
host's FQDN) and gloo's own sockets (``GLOO_SOCKET_IFNAME``, else the address the hostname resolves to). A host
whose name resolves to an address that drops connections makes gloo wait out its 30-minute timeout otherwise.
A job that outlives ``timeout`` is killed with all its workers (its own process group), and the failure shows
what it printed.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LOOPBACK = "127.0.0.1"
TIMEOUT_S = 240  # under pytest-timeout's 300 s, so the job's output reaches the report


def loopback_interface() -> str | None:
    """The name of the loopback interface ('lo' on Linux), or None when this host lists none by that name."""
    names = {name for _, name in socket.if_nameindex()}
    for name in ("lo", "lo0"):
        if name in names:
            return name
    return None


def launcher(world: int) -> list[str]:
    """``python -m torch.distributed.run`` for ``world`` local workers, rendezvous on the loopback."""
    return [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", "1", "--nproc_per_node", str(world), "--max_restarts", "0",
        "--rdzv_backend", "c10d", "--rdzv_endpoint", f"{LOOPBACK}:0", "--rdzv_id", uuid.uuid4().hex,
        "--local_addr", LOOPBACK,
    ]  # fmt: skip


def loopback_env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", **extra}
    interface = loopback_interface()
    if interface is not None:
        env["GLOO_SOCKET_IFNAME"] = interface
    return env


def run_torchrun(script: Path, args: list[str], world: int = 2, timeout: int = TIMEOUT_S, **env: str) -> str:
    """Run ``script args`` as ``world`` ranks; its combined output. Fails the test on a non-zero exit or a hang."""
    process = subprocess.Popen(
        [*launcher(world), str(script), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=loopback_env(**env),
        cwd=ROOT,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        pytest.fail(f"torchrun ({world} ranks) still running after {timeout} s, killed; its output:\n{output[-4000:]}")
    if process.returncode != 0:
        pytest.fail(f"torchrun ({world} ranks) exited {process.returncode}; its output:\n{output[-4000:]}")
    return output
