"""Data-parallel training under ``torchrun``: process group, DDP wrapping, sharding of the global batch.

The same entry point runs single-process or under ``torchrun --nproc_per_node N`` (``distributed: ddp``).
Every rank builds the same global batch (batch_size * grad_accum examples per optimizer step) and the same
layer-dropout mask, and takes its contiguous share of the rows; the loss is normalised by the global
loss-token count, so the update equals the single-process one up to float rounding.

FSDP is rejected: the early-exit forward calls each decoder layer's submodules directly
(:meth:`EarlyExitModel.layer_forward`), bypassing the module ``forward`` hooks FSDP uses to gather and free
sharded parameters.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from exitbench.errors import ExitbenchError


@dataclass(frozen=True)
class DistContext:
    """This process's place in the job; ``world_size`` 1 = plain single-process training."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world_size > 1


def launched_world_size() -> int:
    """WORLD_SIZE as set by ``torchrun`` (1 when launched as a plain process)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def init_distributed(mode: str, device: torch.device) -> DistContext:
    """Join the process group for ``mode`` ('none', 'ddp', 'fsdp'); gloo on CPU, NCCL on CUDA."""
    world = launched_world_size()
    if mode == "fsdp":
        raise ExitbenchError(
            "distributed: fsdp is not supported (the early-exit forward calls layer submodules directly, "
            "bypassing FSDP's parameter gathering); use distributed: ddp"
        )
    if mode == "none":
        if world > 1:
            raise ExitbenchError(
                f"launched with torchrun (WORLD_SIZE={world}) but the variant has distributed: none; set ddp"
            )
        return DistContext()
    if world == 1:
        return DistContext()
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return DistContext(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))


def shutdown(ctx: DistContext) -> None:
    if ctx.active and dist.is_initialized():
        dist.destroy_process_group()


def wrap(module: nn.Module, ctx: DistContext, find_unused: bool) -> nn.Module:
    """DDP around ``module`` when distributed; ``find_unused`` when layer dropout can skip a whole layer."""
    if not ctx.active:
        return module
    device_ids = [ctx.local_rank] if next(module.parameters()).device.type == "cuda" else None
    return DistributedDataParallel(module, device_ids=device_ids, find_unused_parameters=find_unused)


def unwrap(module: nn.Module) -> nn.Module:
    return module.module if isinstance(module, DistributedDataParallel) else module


def grad_sync(module: nn.Module, sync: bool) -> contextlib.AbstractContextManager:
    """Skip DDP's gradient all-reduce on every micro-batch but the last of an optimizer step."""
    if sync or not isinstance(module, DistributedDataParallel):
        return contextlib.nullcontext()
    return module.no_sync()


def shard(rows: int, ctx: DistContext) -> range:
    """This rank's contiguous share of a global batch of ``rows`` (which must split evenly)."""
    if rows % ctx.world_size:
        raise ExitbenchError(
            f"global batch batch_size*grad_accum = {rows} does not split over {ctx.world_size} processes"
        )
    size = rows // ctx.world_size
    return range(ctx.rank * size, (ctx.rank + 1) * size)


def all_reduce_sum(tensor: torch.Tensor, ctx: DistContext) -> torch.Tensor:
    """Sum over ranks (in place); a no-op single-process."""
    if ctx.active:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def barrier(ctx: DistContext) -> None:
    if ctx.active:
        dist.barrier()


@contextlib.contextmanager
def session(mode: str, device: torch.device) -> Iterator[DistContext]:
    """init_distributed ... shutdown, also on errors."""
    ctx = init_distributed(mode, device)
    try:
        yield ctx
    finally:
        shutdown(ctx)
