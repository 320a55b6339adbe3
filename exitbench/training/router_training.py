"""Router-Tuning: training only the routers of a frozen model (He et al. 2024, arXiv:2410.13184, §3).

Each step runs the frozen model twice over a batch of training text: once whole, without gradients (the target:
its next-token distribution), and once routed, where each routed layer's attention (or the whole layer) runs for a
sequence only when its router's score, pooled over the sequence's prompt as at decoding (:func:`routing_context`),
clears the threshold. The gate is hard in the forward pass, as at inference,
and straight-through in the backward pass (the released code's estimator: ``d gate / d score = 1``).

The loss is ``KL(p_full || p_routed) + lambda * max(0, capacity - target_capacity)``, with ``capacity`` the share
of (sequence, routed layer) pairs whose attention ran. Where this differs from the paper, and why: the paper
trains on instruction data with the language-model loss plus ``lambda * capacity``; here the target is the frozen
model's own distribution (the routers are rewarded for keeping the model's outputs, which is what "quality kept at
the skip rate" asks) and the capacity term is a hinge at the target (the paper's Table 1 runs at 50% capacity), so
the skip rate is a setting rather than a by-product of ``lambda``. The gradient reaching a gate is
``<dL/d out, out_on - out_off>`` (the layer's output with its attention minus without it), not the paper's
derivative through the attention output's scale: the forward pass is the same.

Resumable like the trainer (:mod:`exitbench.training.frozen`): a killed run resumes from its last checkpoint with
the same data order. The report holds the
loss and capacity curves and, on held-out text, the routed model's top-1 agreement with the full model and its KL,
beside the control: the same number of layers skipped for every sequence, the ones the routers skip most often
("attention drop" at the same skip rate, the paper's Figure 2 comparison).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from exitbench.config import RoutersConfig
from exitbench.models.router import DepthRouters, skipped_layer_forward
from exitbench.models.view import EarlyExitModel
from exitbench.training.adapter_training import distillation_loss
from exitbench.training.corpora import IGNORE_INDEX
from exitbench.training.frozen import FrozenRun, train_loop


class StraightThrough(torch.autograd.Function):
    """``1[x > 0]`` forward, the identity backward (a straight-through estimator)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return (x > 0).to(x.dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad


def capacity_penalty(gates: torch.Tensor, target: float) -> torch.Tensor:
    """``max(0, mean(gates) - target)``: zero once no more than ``target`` of the routed attention runs."""
    return torch.relu(gates.mean() - target)


def routing_context(labels: torch.Tensor) -> torch.Tensor:
    """The positions ``[B, S]`` a router pools over: each example's prompt, as at decoding.

    MindSkip decides once per prompt, from the prompt's states, for the prompt and every token after it
    (:mod:`exitbench.decoding.mindskip`), so training decides from the same positions: with :func:`collate`'s
    shifted labels, the prompt's tokens are the positions up to and including the first one with a target (the
    prompt's last token, which predicts the first target). An example without a prompt (a target at position
    0) is routed on its target positions. Pooling over the targets instead, as a language-model batch would,
    trains routers on text they never see at decoding: on TOPv2 they skipped 17% of the routed attention on
    held-out parses and 4% at the prompts."""
    targets = labels != IGNORE_INDEX
    before = torch.cumsum(targets.long(), dim=1) - targets.long()  # targets strictly before each position
    return torch.where(targets[:, :1], targets, before == 0)


def routed_pass(
    model: EarlyExitModel,
    routers: DepthRouters,
    ids: torch.Tensor,
    context: torch.Tensor,
    skip: list[int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits ``[B, S, V]`` of the model with its routed layers gated per sequence, and the gates ``[B, n]``.

    Each router scores the mean of its layer's normed input over ``context`` (:func:`routing_context`). With
    ``skip`` the routers are not asked: those layers are skipped for every sequence (the control)."""
    hidden = model.embed(ids)
    rope = model.rope(hidden, 0)
    gates = []
    for index in range(model.num_layers):
        if index not in routers.layers:
            hidden = model.layer_forward(index, hidden, rope)
            continue
        if skip is None:
            score = routers.score(index, model.layers[index].input_layernorm(hidden), context)
            gate = StraightThrough.apply(score - routers.threshold)
        else:
            gate = torch.full((ids.shape[0],), float(index not in skip), device=hidden.device, dtype=hidden.dtype)
        gates.append(gate)
        on = model.layer_forward(index, hidden, rope)
        off = skipped_layer_forward(model, index, hidden, routers.granularity)
        hidden = off + gate.view(-1, 1, 1) * (on - off)
    return model.logits(hidden), torch.stack(gates, dim=1)


@torch.no_grad()
def full_logits(model: EarlyExitModel, ids: torch.Tensor) -> torch.Tensor:
    hidden = model.embed(ids)
    return model.logits(model.forward_layers(hidden, 0, model.num_layers))


@dataclass(frozen=True)
class HeldOutRouting:
    """On held-out text: top-1 agreement with the full model, mean KL, the share of routed attention that ran,
    and how often each routed layer was skipped."""

    agreement: float
    kl: float
    capacity: float
    positions: int
    skipped: dict[int, float]


@torch.no_grad()
def held_out(run: FrozenRun, skip: list[int] | None = None) -> HeldOutRouting:
    """The routed model's (or, with ``skip``, the fixed skip set's) :class:`HeldOutRouting`."""
    agree = total = 0
    kl = 0.0
    gate_rows = []
    for ids, labels in run.held_out_batches():
        device = run.model.device
        ids, mask, context = ids.to(device), (labels != IGNORE_INDEX).to(device), routing_context(labels).to(device)
        target = full_logits(run.model, ids)
        logits, gates = routed_pass(run.model, run.module, ids, context, skip)
        positions = int(mask.sum())
        agree += int(((logits.argmax(-1) == target.argmax(-1)) & mask).sum())
        kl += float(distillation_loss(logits, target, mask)) * positions
        total += positions
        gate_rows.append(gates.float())
    gates = torch.cat(gate_rows)
    skipped = {layer: round(float(1 - gates[:, k].mean()), 4) for k, layer in enumerate(run.module.layers)}
    return HeldOutRouting(agree / max(total, 1), kl / max(total, 1), float(gates.mean()), total, skipped)


def static_skip_set(routed: HeldOutRouting) -> list[int]:
    """The control's skip set: as many layers as the routers skip on average, the ones they skip most often."""
    count = round(sum(routed.skipped.values()))
    ranked = sorted(routed.skipped, key=lambda layer: (-routed.skipped[layer], layer))
    return sorted(ranked[:count])


def train_routers(run: FrozenRun, checkpoints: Path, progress: bool = True) -> dict[str, Any]:
    """Train the routers ``run.module`` for ``cfg.steps`` steps (resuming from ``checkpoints``) on the frozen model;
    sets their control skip set and returns the training report. The model is left as it was."""
    model, routers = run.model, run.module
    cfg: RoutersConfig = run.cfg  # type: ignore[assignment]

    def step_loss(ids: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        ids, mask, context = ids.to(model.device), (labels != IGNORE_INDEX).to(model.device), routing_context(labels)
        target = full_logits(model, ids)
        logits, gates = routed_pass(model, routers, ids, context.to(model.device))
        penalty = capacity_penalty(gates, cfg.target_capacity)
        loss = distillation_loss(logits, target, mask) + cfg.capacity_weight * penalty
        return loss, {"capacity": float(gates.detach().mean())}

    identity = {"layers": routers.layers, "granularity": routers.granularity, "steps": cfg.steps}
    curves = train_loop(run, step_loss, checkpoints, identity, f"routers ({routers.granularity})", progress)
    routed = held_out(run)
    routers.static_skip = static_skip_set(routed)
    control = held_out(run, routers.static_skip)
    return {
        "routed_layers": routers.layers,
        "granularity": routers.granularity,
        "routing_context": "prompt",  # the positions a router pools over (routing_context)
        "threshold": routers.threshold,
        "target_capacity": cfg.target_capacity,
        "steps": cfg.steps,
        "train_examples": len(run.train),
        "held_out_examples": len(run.held_out),
        "held_out_positions": routed.positions,
        "losses": curves.losses,
        "capacities": curves.values.get("capacity", []),
        "seconds": round(curves.seconds, 1),
        "routed": {
            "capacity": round(routed.capacity, 4),
            "agreement": round(routed.agreement, 4),
            "kl": round(routed.kl, 4),
            "skipped_by_layer": {str(layer): share for layer, share in routed.skipped.items()},
        },
        "static_control": {
            "skip": routers.static_skip,
            "capacity": round(control.capacity, 4),
            "agreement": round(control.agreement, 4),
            "kl": round(control.kl, 4),
        },
    }
