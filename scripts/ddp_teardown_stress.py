"""Count the 2-rank gloo jobs that never exit: DDP steps, sums over ranks, then the trainer's teardown.

    python scripts/ddp_teardown_stress.py --jobs 40            # launcher: 40 torchrun jobs, one at a time
    python scripts/ddp_teardown_stress.py --jobs 40 --old      # the same with the teardown before the fix

Each job runs a few DDP steps of a tiny model, a few ``all_reduce_sum`` calls and the final barrier under
``exitbench.training.distributed.session``, then exits with the DDP wrapper left to the garbage collector (as the
train stage does). A job still running after ``--timeout`` seconds is a hang; it is killed with its workers. The
launcher prints one JSON line: jobs, hangs, failures.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]


def rank_main(old: bool) -> None:
    import torch.distributed as dist

    from exitbench.training import distributed as dist_utils

    if old:  # the teardown as it was: barrier, then destroy at once

        def shutdown(ctx, clean: bool = True) -> None:
            if ctx.active and dist.is_initialized() and clean:
                dist.barrier()
                dist.destroy_process_group()

        dist_utils.shutdown = shutdown
    torch.manual_seed(0)
    with dist_utils.session("ddp", torch.device("cpu")) as ctx:
        model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))
        wrapped = dist_utils.wrap(model, ctx, find_unused=False)
        optimizer = torch.optim.SGD(wrapped.parameters(), lr=0.1)
        for _ in range(3):
            loss = wrapped(torch.randn(8, 16)).pow(2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            dist_utils.all_reduce_sum(torch.stack([loss.detach(), loss.detach()]), ctx)
        dist_utils.barrier(ctx)
        cycle = {"model": wrapped}
        cycle["self"] = cycle  # left to the collector, as the trainer's state is


def launch(old: bool, timeout: float) -> str:
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "2",
        "--max_restarts", "0", "--rdzv_backend", "c10d", "--rdzv_endpoint", "127.0.0.1:0",
        "--rdzv_id", uuid.uuid4().hex, "--local_addr", "127.0.0.1",
        __file__, "--rank", *(["--old"] if old else []),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "GLOO_SOCKET_IFNAME": "lo"}
    process = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=True
    )
    try:
        return "ok" if process.wait(timeout=timeout) == 0 else "failed"
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        return "hang"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=40)
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--old", action="store_true", help="the teardown before the fix")
    parser.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank:
        rank_main(args.old)
        return
    outcomes = [launch(args.old, args.timeout) for _ in range(args.jobs)]
    counts = {name: outcomes.count(name) for name in ("ok", "hang", "failed")}
    print(json.dumps({"teardown": "old" if args.old else "current", "jobs": args.jobs, **counts}))


if __name__ == "__main__":
    main()
