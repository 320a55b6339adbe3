"""The early-exit loss: per-exit scales (LayerSkip, CALM), curriculum normalisation, and the objective.

J(X, Y, t) = sum_l e~(t, l) CE(g(x_{l+1}), Y) through the ONE shared head g (final norm + LM head)
(LayerSkip, Elhoushi et al. 2024, arXiv:2404.16710, §4.2). The head is evaluated only at exits with a
non-zero normalised weight, only at positions that carry a label, and fused with the cross-entropy
(:mod:`exitbench.training.fused_head_loss`): with a 49k vocabulary the head is the expensive part of an exit.
With a sub-vocabulary (:meth:`EarlyExitObjective.set_exit_vocab`) every exit but the last is scored over the
training corpus's most frequent target tokens only, the set a sub-vocabulary draft proposes from. With
``exit_targets = "last_layer"`` every exit but the last learns the last layer's top-1 token instead of the
label (hard self-distillation): greedy verification accepts a draft exactly when the exit's top-1 equals
the last layer's, so that is the token an exit must predict for self-speculation to accept it.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from enum import Enum
from typing import Literal

import torch
from torch import nn

from exitbench.errors import ExitbenchError
from exitbench.models.view import EarlyExitModel
from exitbench.training.fused_head_loss import cross_entropy_sum, head_cross_entropy_sum
from exitbench.training.layer_dropout import LayerFn, Rope, forward_kept_rows

IGNORE_INDEX = -100


class Recipe(str, Enum):
    """How exits are weighted: LayerSkip's quadratic scale, CALM's linear one, or the last layer only (``plain``:
    the ordinary finetune that LayerSkip is compared with, LayerSkip Table 6 "without LayerSkip")."""

    LAYERSKIP = "layerskip"
    CALM = "calm"
    PLAIN = "plain"


def layerskip_scales(num_layers: int, e_scale: float) -> list[float]:
    """e(l) = e_scale sum_{i=0}^{l} i for l < L-1; e(L-1) = L-1 + e_scale sum_{i=0}^{L-2} i (LayerSkip §4.2)."""
    scales = [e_scale * layer * (layer + 1) / 2 for layer in range(num_layers - 1)]
    last = num_layers - 1
    scales.append(last + e_scale * (last - 1) * last / 2)
    return scales


def calm_scales(num_layers: int) -> list[float]:
    """w_i = i / sum_{j=1}^{L} j for layers i = 1..L (CALM, Schuster et al. 2022, §3.4); index l = i - 1."""
    total = num_layers * (num_layers + 1) / 2
    return [(layer + 1) / total for layer in range(num_layers)]


def exit_scales(recipe: Recipe | str, num_layers: int, e_scale: float) -> list[float]:
    """The un-normalised per-exit scale of ``recipe`` for every layer."""
    if Recipe(recipe) is Recipe.CALM:
        return calm_scales(num_layers)
    if Recipe(recipe) is Recipe.PLAIN:
        return [0.0] * (num_layers - 1) + [1.0]
    return layerskip_scales(num_layers, e_scale)


def normalized_weights(scales: Sequence[float], enabled: Sequence[int]) -> dict[int, float]:
    """e~(t, l) = C(t, l) e(l) / sum_i C(t, i) e(i) over the enabled exits, dropping zero weights (§4.2)."""
    total = sum(scales[layer] for layer in enabled)
    if total <= 0:
        raise ExitbenchError(f"every enabled exit {list(enabled)} has loss weight 0; raise e_scale or use more layers")
    return {layer: scales[layer] / total for layer in sorted(enabled) if scales[layer] > 0}


#: an exit sub-vocabulary's positions [B, S], labels as positions in the set, W[S] and b[S] (or None)
ExitTargets = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]


def _weighted_zero(out: torch.Tensor) -> torch.Tensor:
    """A scalar 0 (exactly, even for inf or nan in ``out``) whose backward gives ``out`` a zero gradient."""
    return torch.where(torch.zeros((), dtype=torch.bool, device=out.device), out.sum(), 0.0)


ExitTargetKind = Literal["labels", "last_layer"]


@torch.no_grad()
def last_layer_top1(normed: torch.Tensor, head: nn.Linear, chunk: int = 256) -> torch.Tensor:
    """argmax_v (W h + b)_v for each row of ``normed`` [N, D], in row chunks (never a whole [N, V] logits).

    In float32 with autocast off, as the decoder's verification computes it, not in the training's bf16.
    """
    out = torch.empty(normed.shape[0], dtype=torch.long, device=normed.device)
    weight = head.weight.float()
    bias = None if head.bias is None else head.bias.float()
    with torch.autocast(device_type=normed.device.type, enabled=False):
        for start in range(0, normed.shape[0], chunk):
            logits = torch.nn.functional.linear(normed[start : start + chunk].float(), weight, bias)
            out[start : start + chunk] = logits.argmax(dim=-1)
    return out


class EarlyExitObjective(nn.Module):
    """The early-exit training forward as a module (so DDP / FSDP can wrap it): dropout, exits, shared head, CE.

    ``forward`` returns (loss, per-exit CE sums): loss = sum_l w_l CE_sum_l / ``num_tokens``, where
    ``num_tokens`` is the loss-token count of the whole (global) optimizer batch, so that micro-batches and
    ranks add up to the mean over the global batch exactly.
    """

    def __init__(self, causal_lm: nn.Module) -> None:
        super().__init__()
        self.lm = causal_lm
        self.view = EarlyExitModel(causal_lm)
        #: layer l's forward (hidden, rope) -> hidden; FSDP replaces each by one that gathers the layer first
        self.layer_forwards: list[LayerFn] = [
            functools.partial(self.view.layer_forward, index) for index in range(self.view.num_layers)
        ]
        self.exit_vocab: torch.Tensor | None = None  # sorted ids [K] the exits are scored over; None = all
        self._exit_index: torch.Tensor | None = None  # [V]: a token's position in exit_vocab, -1 outside it
        #: what exits but the last learn: the labels, or the last layer's top-1 (self-distillation)
        self.exit_targets: ExitTargetKind = "labels"

    def set_exit_vocab(self, token_ids: Sequence[int] | None) -> None:
        """Score every exit but the last layer over ``token_ids`` only (None or empty: the whole vocabulary).

        CE at exit l becomes -log softmax(W[S] g(x_{l+1}))_y over the set S, at the positions whose label y is
        in S; other positions carry no exit loss (a draft drawn from S cannot propose y, and the full model's
        verification rejects whatever it proposes instead). The last layer keeps the whole vocabulary, so the
        model's own output distribution is trained exactly as without the set.
        """
        if not token_ids:
            self.exit_vocab = self._exit_index = None
            return
        weight = self.view.lm_head.weight
        vocab_size = weight.shape[0]
        ids = sorted(set(int(token) for token in token_ids))
        if ids[0] < 0 or ids[-1] >= vocab_size:
            raise ExitbenchError(f"exit vocabulary: token ids must lie in 0..{vocab_size - 1}, got {ids[0]}..{ids[-1]}")
        self.exit_vocab = torch.tensor(ids, dtype=torch.long, device=weight.device)
        self._exit_index = torch.full((vocab_size,), -1, dtype=torch.long, device=weight.device)
        self._exit_index[self.exit_vocab] = torch.arange(len(ids), device=weight.device)

    def forward(
        self,
        ids: torch.Tensor,
        labels: torch.Tensor,
        keep: torch.Tensor,
        weights: dict[int, float],
        num_tokens: int,
        must_run: torch.Tensor | None = None,
        full_vocab: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """ids, labels [B, S] (labels already shifted); keep [L, B] bool (layer dropout, all True = none).

        must_run [L] bool (FSDP): layers to call even when no row here keeps them, since every rank must
        call the same sharded layers; such a layer runs on one row and its output enters with weight 0.
        ``full_vocab``: score every exit over the whole vocabulary even when an exit vocabulary is set.
        """
        view = self.view
        hidden = view.embed(ids)
        rope = view.rope(hidden, 0)
        targets = labels != IGNORE_INDEX
        flat_labels = labels[targets]
        exits = sorted(weights)
        last = view.num_layers - 1
        distill = self.exit_targets == "last_layer" and exits != [last]
        ce: dict[int, torch.Tensor] = {}
        # labels: each exit is scored as soon as it is computed (the order the committed models were trained
        # in: the backward's accumulation order, so the weights, are the same bit for bit); self-distillation
        # keeps the exits' states until the last layer has given their targets
        exit_hidden: dict[int, torch.Tensor] = {}
        subset = None
        if not distill and not full_vocab and self.exit_vocab is not None and exits != [last]:
            subset = self._exit_targets(labels)
        for layer in range(last + 1 if distill else exits[-1] + 1):
            forced = must_run is not None and bool(must_run[layer])
            hidden = self._layer(layer, hidden, rope, keep[layer], forced)
            if layer not in weights:
                continue
            if layer == last:
                ce[layer] = head_cross_entropy_sum(view.norm(hidden[targets]), view.lm_head, flat_labels)
            elif distill:
                exit_hidden[layer] = hidden
            else:
                ce[layer] = self._exit_ce(hidden, labels, targets, subset)
        if distill:
            exit_labels = torch.full_like(labels, IGNORE_INDEX)
            exit_labels[targets] = last_layer_top1(view.norm(hidden[targets].detach()), view.lm_head)
            use_subset = not full_vocab and self.exit_vocab is not None
            subset = self._exit_targets(exit_labels) if use_subset else None
            for layer, exit_state in exit_hidden.items():
                ce[layer] = self._exit_ce(exit_state, exit_labels, targets, subset)
        sums = torch.stack([ce[layer] for layer in exits])
        scale = torch.tensor([weights[layer] for layer in exits], dtype=sums.dtype, device=sums.device)
        loss = (scale * sums).sum() / num_tokens
        return loss, sums.detach()

    def _exit_ce(
        self, hidden: torch.Tensor, labels: torch.Tensor, targets: torch.Tensor, subset: ExitTargets | None
    ) -> torch.Tensor:
        """An exit's summed CE: over the exit vocabulary's positions (``subset``) or the whole head."""
        if subset is not None:
            rows, sub_labels, sub_weight, sub_bias = subset
            return cross_entropy_sum(self.view.norm(hidden[rows]), sub_weight, sub_labels, sub_bias)
        return head_cross_entropy_sum(self.view.norm(hidden[targets]), self.view.lm_head, labels[targets])

    def _exit_targets(self, labels: torch.Tensor) -> ExitTargets:
        """The exits' positions (label in the set) [B, S], their labels as positions in the set, and W[S], b[S]
        (selected once per forward and shared by every exit: the gradient of each reaches W's rows in S)."""
        position = self._exit_index[labels.clamp(min=0)]
        rows = (labels != IGNORE_INDEX) & (position >= 0)
        head = self.view.lm_head
        bias = None if head.bias is None else head.bias.index_select(0, self.exit_vocab)
        return rows, position[rows], head.weight.index_select(0, self.exit_vocab), bias

    def _layer(self, index: int, hidden: torch.Tensor, rope: Rope, keep: torch.Tensor, forced: bool) -> torch.Tensor:
        """x_{l+1} under layer dropout ``keep`` [B]; ``forced``: call the layer even if no row is kept.

        A forced layer runs on one row (its reshapes cannot take an empty batch), its output added with
        weight 0: x_{l+1} = x_l exactly, but the layer sits in the autograd graph between its neighbours as
        on the other ranks, so FSDP's backward gathers and reduce-scatters run there, in the same order.
        """
        call = self.layer_forwards[index]
        if forced and not bool(keep.any()):
            cos, sin = rope
            return hidden + _weighted_zero(call(hidden[:1], (cos[:1], sin[:1])))
        return forward_kept_rows(call, hidden, rope, keep)
