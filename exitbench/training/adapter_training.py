"""Training Kangaroo's adapter on a frozen model (Liu et al. 2024, arXiv:2404.18911, §3.1).

Only the adapter learns; the model's layers, final norm and LM head stay as they are. Each step runs the model
once without gradients over a batch of training text, keeping the layer-``E`` states (the adapter's input) and
the last layer's logits (its target), and the adapter is trained to put the full model's next-token
distribution on the exit head: the loss is the cross-entropy of the adapter's distribution against the full
model's (self-distillation: the draft is rewarded for the tokens greedy verification will accept), reported as
the KL divergence (the cross-entropy less the full model's entropy: 0 at a perfect draft).

Resumable like the trainer: a checkpoint (adapter + optimizer + step) every ``checkpoint_every`` steps, written
whole or not at all; a killed run resumes from its last checkpoint with the same data order.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from exitbench.config import AdaptersConfig
from exitbench.errors import ExitbenchError
from exitbench.models.adapter import KangarooAdapter
from exitbench.models.view import EarlyExitModel
from exitbench.training.corpora import IGNORE_INDEX, DataOrder, Example, collate
from exitbench.training.schedules import lr_factor
from exitbench.training.trainer import clear_checkpoints, load_checkpoint, save_checkpoint


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


@dataclass
class AdapterRun:
    """One adapter's training: the frozen model, the adapter, its optimizer, the data and their order."""

    model: EarlyExitModel
    adapter: KangarooAdapter
    cfg: AdaptersConfig
    train: list[Example]
    held_out: list[Example]
    pad_id: int
    seed: int
    optimizer: torch.optim.AdamW = field(init=False)
    order: DataOrder = field(init=False)

    def __post_init__(self) -> None:
        self.optimizer = torch.optim.AdamW(self.adapter.parameters(), lr=self.cfg.lr, weight_decay=0.0)
        self.order = DataOrder(len(self.train), self.cfg.batch_size, self.seed)


@dataclass(frozen=True)
class HeldOut:
    """A draft's top-1 agreement with the full model and its mean KL divergence, over ``positions`` held-out
    positions."""

    agreement: float
    kl: float
    positions: int


@torch.no_grad()
def held_out(run: AdapterRun, adapter: KangarooAdapter | None) -> HeldOut:
    """The adapter's (or, without one, plain early exit's at the same layer) :class:`HeldOut` measures."""
    agree = total = 0
    kl = 0.0
    for start in range(0, len(run.held_out), run.cfg.batch_size):
        ids, labels = collate(run.held_out[start : start + run.cfg.batch_size], run.pad_id)
        batch = frozen_pass(run.model, ids, labels, run.adapter.exit_layer)
        a, t = agreement(run.model, adapter, batch)
        states = batch.states if adapter is None else adapter(batch.states, run.model.rope(batch.states, 0))
        kl += float(distillation_loss(run.model.logits(states), batch.target_logits, batch.mask)) * t
        agree, total = agree + a, total + t
    return HeldOut(agree / max(total, 1), kl / max(total, 1), total)


def train_adapter(run: AdapterRun, checkpoints: Path, progress: bool = True) -> dict[str, Any]:
    """Train ``run.adapter`` for ``cfg.steps`` steps (resuming from ``checkpoints``); returns the training report:
    the loss curve, and top-1 agreement with the full model on held-out text before and after, beside plain early
    exit at the same layer (the adapter's control). The model is frozen meanwhile (gradients reach the adapter
    only) and left as it was."""
    params = list(run.model.hf.parameters())
    trainable = [param.requires_grad for param in params]
    for param in params:
        param.requires_grad_(False)
    try:
        return _train(run, checkpoints, progress)
    finally:
        for param, flag in zip(params, trainable, strict=True):
            param.requires_grad_(flag)


def _train(run: AdapterRun, checkpoints: Path, progress: bool) -> dict[str, Any]:
    cfg, model, adapter = run.cfg, run.model, run.adapter
    payload = load_checkpoint(checkpoints)
    step, losses, seconds = 0, [], 0.0
    before = held_out(run, adapter)
    if payload is not None:
        if payload.get("exit_layer") != adapter.exit_layer or payload.get("steps") != cfg.steps:
            raise ExitbenchError(
                f"{checkpoints} holds another adapter run's checkpoint (exit layer, steps); "
                f"delete {checkpoints} to train from step 0"
            )
        adapter.load_state_dict(payload["adapter"])
        run.optimizer.load_state_dict(payload["optimizer"])
        step, losses, seconds = payload["step"], payload["losses"], payload["seconds"]
    adapter.train()
    bar = tqdm(total=cfg.steps, initial=step, disable=not progress, desc=f"adapter E={adapter.exit_layer}")
    while step < cfg.steps:
        start = time.perf_counter()
        for group in run.optimizer.param_groups:
            group["lr"] = cfg.lr * lr_factor(step, cfg.warmup_steps, cfg.steps)
        ids, labels = collate([run.train[i] for i in run.order.step_indices(step)], run.pad_id)
        loss = adapter_loss(model, adapter, frozen_pass(model, ids, labels, adapter.exit_layer))
        run.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(adapter.parameters(), 1.0)
        run.optimizer.step()
        step += 1
        losses.append(round(loss.item(), 5))
        seconds += time.perf_counter() - start
        bar.update(1)
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
        if step % cfg.checkpoint_every == 0 and step < cfg.steps:
            save_checkpoint(
                checkpoints,
                {
                    "adapter": adapter.state_dict(),
                    "optimizer": run.optimizer.state_dict(),
                    "step": step,
                    "losses": losses,
                    "seconds": seconds,
                    "exit_layer": adapter.exit_layer,
                    "steps": cfg.steps,
                },
            )
    bar.close()
    adapter.eval()
    after, control = held_out(run, adapter), held_out(run, None)
    clear_checkpoints(checkpoints)
    return {
        "exit_layer": adapter.exit_layer,
        "steps": cfg.steps,
        "train_examples": len(run.train),
        "held_out_examples": len(run.held_out),
        "held_out_positions": after.positions,
        "losses": losses,
        "seconds": round(seconds, 1),
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
