"""Data-parallel training under ``torchrun``: process group, DDP / FSDP wrapping, sharding of the global batch.

The same entry point runs single-process or under ``torchrun --nproc_per_node N`` (``distributed: ddp`` or
``fsdp``). Every rank builds the same global batch (batch_size * grad_accum examples per optimizer step) and
the same layer-dropout mask, and takes its contiguous share of the rows; the loss is normalised by the global
loss-token count, so the update equals the single-process one up to float rounding.

FSDP is PyTorch's FSDP2 (``fully_shard``, Zhao et al. 2023, arXiv:2304.11277; the per-parameter sharding of
https://pytorch.org/docs/stable/distributed.fsdp.fully_shard.html): one shard group per decoder layer, and
the root group (embedding, final norm, LM head, tied to the embedding in tied configs) on the objective, so
the shared exit head stays gathered for the whole forward and every exit. The early-exit forward calls a
layer's submodules directly (:meth:`EarlyExitModel.layer_forward`), not the layer's ``forward``; each layer's
early-exit forward is therefore registered with ``register_fsdp_forward_method``, which runs FSDP's pre- and
post-forward hooks (gather, free, backward hooks) around it. All ranks must call the same sharded layers in
the same order: see ``must_run`` in :class:`EarlyExitObjective`. Checkpoints hold full (gathered) state dicts
in the single-process format.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard, register_fsdp_forward_method
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.nn.parallel import DistributedDataParallel

from exitbench.errors import ExitbenchError
from exitbench.training.early_exit_loss import EarlyExitObjective

_LAYER_METHOD = "early_exit_forward"  # the name a sharded layer's early-exit forward is registered under
# After the last barrier, how long the main thread sleeps (holding no GIL) before the group can be freed: see
# ``shutdown``. scripts/ddp_teardown_stress.py counts the jobs that hang without it.
_DRAIN_S = 0.5


@dataclass(frozen=True)
class DistContext:
    """This process's place in the job; ``world_size`` 1 = plain single-process training."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    sharded: bool = False  # FSDP: parameters, gradients and optimizer state sharded over the ranks

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
    """Join the process group for ``mode`` ('none', 'ddp', 'fsdp'); gloo on CPU, NCCL on CUDA.

    One process (no ``torchrun``) trains plainly whatever the mode.
    """
    world = launched_world_size()
    if mode == "none":
        if world > 1:
            raise ExitbenchError(
                f"launched with torchrun (WORLD_SIZE={world}) but the variant has distributed: none; set ddp or fsdp"
            )
        return DistContext()
    if world == 1:
        return DistContext()
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    return DistContext(dist.get_rank(), dist.get_world_size(), local_rank, sharded=mode == "fsdp")


def shutdown(ctx: DistContext, clean: bool = True) -> None:
    """Leave the process group.

    On a clean exit every rank first meets at a barrier, so no rank tears the group down while another still
    talks to it (gloo's ``destroy_process_group`` can hang otherwise: pytorch/pytorch#75097). Then the main
    thread sleeps, holding no GIL, for ``_DRAIN_S``: gloo's worker thread frees the barrier's work after the
    barrier returns, and with it the earlier works the barrier waited on; one of those (a sum over ranks) can
    hold the last reference to a Python tensor, so the worker needs the GIL. If the group is freed first (the
    DDP wrapper's reducer holds it until the garbage collector or the interpreter's exit frees it), its
    destructor joins that worker while holding the GIL, and the rank never exits: measured in about 1 job in
    6 before this sleep. After an error the other ranks may never arrive, so the group is left to the
    process's exit instead of a collective teardown.
    """
    if not (ctx.active and dist.is_initialized()):
        return
    if clean:
        dist.barrier()
        time.sleep(_DRAIN_S)
        dist.destroy_process_group()


def wrap(module: EarlyExitObjective, ctx: DistContext, find_unused: bool) -> nn.Module:
    """DDP around ``module``, or FSDP on it (in place), when distributed.

    ``find_unused`` (DDP) when layer dropout can skip a whole layer. FSDP replaces the parameters by
    sharded ones: build the optimizer after this.
    """
    if not ctx.active:
        return module
    if ctx.sharded:
        return fully_shard_objective(module, ctx)
    device_ids = [ctx.local_rank] if next(module.parameters()).device.type == "cuda" else None
    return DistributedDataParallel(module, device_ids=device_ids, find_unused_parameters=find_unused)


def fully_shard_objective(objective: EarlyExitObjective, ctx: DistContext) -> EarlyExitObjective:
    """FSDP2 per decoder layer, then on the objective (root group: embedding, final norm, shared head).

    Each layer's early-exit forward (``objective.layer_forwards``) becomes a method of the sharded layer that
    runs FSDP's forward hooks, and the objective calls it from then on.
    """
    device = next(objective.parameters()).device
    mesh = init_device_mesh(device.type, (ctx.world_size,))
    for index, layer in enumerate(objective.view.layers):
        fully_shard(layer, mesh=mesh)
        setattr(layer, _LAYER_METHOD, objective.layer_forwards[index])
        register_fsdp_forward_method(layer, _LAYER_METHOD)
        objective.layer_forwards[index] = getattr(layer, _LAYER_METHOD)
    fully_shard(objective, mesh=mesh)
    return objective


def unwrap(module: nn.Module) -> nn.Module:
    return module.module if isinstance(module, DistributedDataParallel) else module


def grad_sync(module: nn.Module, sync: bool) -> contextlib.AbstractContextManager:
    """Skip DDP's all-reduce / FSDP's reduce-scatter of gradients on every micro-batch but the last of a step.

    FSDP keeps the unsharded gradients of such micro-batches and reduces their sum with the last one's.
    """
    if sync:
        return contextlib.nullcontext()
    if isinstance(module, FSDPModule):
        return _fsdp_no_sync(module)
    if isinstance(module, DistributedDataParallel):
        return module.no_sync()
    return contextlib.nullcontext()


@contextlib.contextmanager
def _fsdp_no_sync(module: FSDPModule) -> Iterator[None]:
    module.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        module.set_requires_gradient_sync(True)


_FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)  # gathered on rank 0, in CPU memory


def full_model_state(model: nn.Module, ctx: DistContext) -> dict[str, Any]:
    """``model.state_dict()``; under FSDP gathered to rank 0 (collective; the other ranks get an empty dict)."""
    if not ctx.sharded:
        return model.state_dict()
    state = get_model_state_dict(model, options=_FULL)
    _retie(state, model)
    return state


def full_state(
    model: nn.Module, optimizer: torch.optim.Optimizer, ctx: DistContext
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(model, optimizer) state dicts in the single-process format (``state_dict()``).

    Under FSDP the full tensors are gathered to rank 0 (collective: every rank calls this; the other ranks
    get empty dicts). The optimizer state is gathered tensor by tensor from ``Optimizer.state_dict`` rather
    than with ``get_optimizer_state_dict``, which keys it by parameter name instead of number.
    """
    if not ctx.sharded:
        return model.state_dict(), optimizer.state_dict()
    model_state = full_model_state(model, ctx)
    optimizer_state = optimizer.state_dict()
    state = {}
    for number, entry in sorted(optimizer_state["state"].items()):  # the same order on every rank
        gathered = {key: _gathered(value) for key, value in entry.items()}
        if ctx.is_main:  # the other ranks drop each full tensor at once
            state[number] = gathered
    if not ctx.is_main:
        return {}, {}
    return model_state, {"state": state, "param_groups": optimizer_state["param_groups"]}


def load_full_state(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    model_state: dict[str, Any],
    optimizer_state: dict[str, Any],
    ctx: DistContext,
) -> None:
    """Load state dicts of :func:`full_state`'s format; under FSDP every rank keeps its shard of them.

    The optimizer state is sliced here rather than by ``set_optimizer_state_dict``, which would also give
    parameters without state (a layer that layer dropout skipped in every step so far) a fresh one, with
    step 1: a single-process run starts theirs at the first gradient, so the trajectories would part.
    """
    if not ctx.sharded:
        model.load_state_dict(model_state)
        optimizer.load_state_dict(optimizer_state)
        return
    set_model_state_dict(model, model_state, options=StateDictOptions(full_state_dict=True))
    params = [param for group in optimizer.param_groups for param in group["params"]]
    state = {
        number: {key: _sharded_like(value, params[number]) for key, value in entry.items()}
        for number, entry in optimizer_state["state"].items()
    }
    optimizer.load_state_dict({"state": state, "param_groups": optimizer_state["param_groups"]})


def _gathered(value: Any) -> Any:
    """The full tensor of a sharded one (collective), on the CPU; anything else as it is."""
    return value.full_tensor().cpu() if isinstance(value, DTensor) else value


def _sharded_like(value: Any, param: torch.Tensor) -> Any:
    """This rank's shard of ``value``, a full tensor shaped like the sharded ``param`` (sliced locally)."""
    if not (isinstance(param, DTensor) and isinstance(value, torch.Tensor) and value.shape == param.shape):
        return value
    return distribute_tensor(value.to(param.device), param.device_mesh, param.placements, src_data_rank=None)


def _retie(state: dict[str, torch.Tensor], model: nn.Module) -> None:
    """Point the entries of a tied parameter (embedding and LM head) at one tensor: saved once, as in one process."""
    first: dict[int, str] = {}
    for key, value in model.state_dict(keep_vars=True).items():
        owner = first.setdefault(id(value), key)
        if owner != key and key in state:
            state[key] = state[owner]


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
    """init_distributed ... shutdown (after an error, without the collective teardown)."""
    ctx = init_distributed(mode, device)
    try:
        yield ctx
    except BaseException:
        shutdown(ctx, clean=False)
        raise
    shutdown(ctx)
