"""Training Kangaroo's adapter on a frozen model (Liu et al. 2024, arXiv:2404.18911, §3.1).

Only the adapter learns; the model's layers, final norm and LM head stay as they are. Each step runs the model
once without gradients over a batch of training text, keeping the layer-``E`` states (the adapter's input) and
the last layer's logits (its target), and the adapter is trained to put the full model's next-token
distribution on the exit head: the loss is the cross-entropy of the adapter's distribution against the full
model's (self-distillation: the draft is rewarded for the tokens greedy verification will accept), reported as
the KL divergence (the cross-entropy less the full model's entropy: 0 at a perfect draft).

Resumable like the trainer (:mod:`exitbench.training.frozen`): a killed run resumes from its last checkpoint with
the same data order.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from exitbench.models.adapter import KangarooAdapter
from exitbench.models.view import EarlyExitModel
from exitbench.training.corpora import IGNORE_INDEX
from exitbench.training.frozen import FrozenRun, train_loop


def distillation_loss(draft_logits: torch.Tensor, target_logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over ``mask``ed positions of ``KL(p_full || p_draft) = sum_v p_full(v) (log p_full(v) - log p_draft(v))``:
    the cross-entropy of the draft's next-token distribution against the full model's, less the full model's own
    entropy (same gradients; 0 when the draft's distribution is the full model's). Logits ``[B, S, V]``, mask
    ``[B, S]`` (bool)."""
    log_target = torch.log_softmax(target_logits[mask].float(), dim=-1)
    log_draft = torch.log_softmax(draft_logits[mask].float(), dim=-1)
    return (log_target.exp() * (log_target - log_draft)).sum(-1).mean()


@dataclass
class Batch:
    """The frozen model's view of one batch: layer-``E`` states (adapter input), last-layer logits (target),
    and which positions count (not padding)."""

    states: torch.Tensor
    target_logits: torch.Tensor
    mask: torch.Tensor


@torch.no_grad()
def frozen_pass(model: EarlyExitModel, ids: torch.Tensor, labels: torch.Tensor, exit_layer: int) -> Batch:
    """Run ``ids`` ``[B, S]`` through every layer once; keep the exit layer's states and the last logits."""
    hidden = model.embed(ids.to(model.device))
    rope = model.rope(hidden, 0)
    states = model.forward_layers(hidden, 0, exit_layer, rope=rope)
    last = model.forward_layers(states, exit_layer, model.num_layers, rope=rope)
    return Batch(states, model.logits(last), (labels != IGNORE_INDEX).to(model.device))


def adapter_loss(model: EarlyExitModel, adapter: KangarooAdapter, batch: Batch) -> torch.Tensor:
    """The distillation loss of ``adapter`` on one frozen batch (gradients reach the adapter only)."""
    rope = model.rope(batch.states, 0)
    return distillation_loss(model.logits(adapter(batch.states, rope)), batch.target_logits, batch.mask)


@torch.no_grad()
def agreement(model: EarlyExitModel, adapter: KangarooAdapter | None, batch: Batch) -> tuple[int, int]:
    """How many counted positions the draft's top-1 token equals the full model's: ``(agree, total)``. Without an
    adapter, the exit head read straight off layer ``E`` (plain early exit: the adapter's control)."""
    states = batch.states if adapter is None else adapter(batch.states, model.rope(batch.states, 0))
    draft = model.logits(states).argmax(-1)
    same = (draft == batch.target_logits.argmax(-1)) & batch.mask
    return int(same.sum()), int(batch.mask.sum())


@dataclass(frozen=True)
class HeldOut:
    """A draft's top-1 agreement with the full model and its mean KL divergence, over ``positions`` held-out
    positions."""

    agreement: float
    kl: float
    positions: int


@torch.no_grad()
def held_out(run: FrozenRun, adapter: KangarooAdapter | None) -> HeldOut:
    """The adapter's (or, without one, plain early exit's at the same layer) :class:`HeldOut` measures."""
    agree = total = 0
    kl = 0.0
    for ids, labels in run.held_out_batches():
        batch = frozen_pass(run.model, ids, labels, run.module.exit_layer)
        a, t = agreement(run.model, adapter, batch)
        states = batch.states if adapter is None else adapter(batch.states, run.model.rope(batch.states, 0))
        kl += float(distillation_loss(run.model.logits(states), batch.target_logits, batch.mask)) * t
        agree, total = agree + a, total + t
    return HeldOut(agree / max(total, 1), kl / max(total, 1), total)


def train_adapter(run: FrozenRun, checkpoints: Path, progress: bool = True) -> dict[str, Any]:
    """Train the adapter ``run.module`` for ``cfg.steps`` steps (resuming from ``checkpoints``); returns the
    training report: the loss curve, and top-1 agreement with the full model on held-out text before and after,
    beside plain early exit at the same layer (the adapter's control). The model is frozen meanwhile (gradients
    reach the adapter only) and left as it was."""
    model, adapter = run.model, run.module
    before = held_out(run, adapter)

    def step_loss(ids: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        return adapter_loss(model, adapter, frozen_pass(model, ids, labels, adapter.exit_layer)), {}

    identity = {"exit_layer": adapter.exit_layer, "steps": run.cfg.steps}
    curves = train_loop(run, step_loss, checkpoints, identity, f"adapter E={adapter.exit_layer}", progress)
    after, control = held_out(run, adapter), held_out(run, None)
    return {
        "exit_layer": adapter.exit_layer,
        "steps": run.cfg.steps,
        "train_examples": len(run.train),
        "held_out_examples": len(run.held_out),
        "held_out_positions": after.positions,
        "losses": curves.losses,
        "seconds": round(curves.seconds, 1),
        "agreement": {
            "early_exit": round(control.agreement, 4),
            "adapter_untrained": round(before.agreement, 4),
            "adapter_trained": round(after.agreement, 4),
        },
        "kl": {
            "early_exit": round(control.kl, 4),
            "adapter_untrained": round(before.kl, 4),
            "adapter_trained": round(after.kl, 4),
        },
    }
