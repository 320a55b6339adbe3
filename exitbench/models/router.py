"""Routers that decide, per prompt, which layers' attention runs (Router-Tuning / MindSkip, He et al. 2024,
arXiv:2410.13184).

One router per routed layer ``l``: a linear map of the mean, over the sequence, of the layer's normalised input
``x = Norm_l(h)``, through a sigmoid: ``R_l(h) = sigmoid(w_l . mean_t x_t + b_l)`` (§3, Figure 1: the layer's
attention runs only when ``R_l >= tau``). The decision is made once per sequence, at the prompt, and holds for
every token generated after it: a layer whose attention is skipped writes no keys and values and no later token
reads any, so nothing is recomputed or approximated. The routed layers are the ``n`` before the last (the released
code's choice: the last layer always runs).

Granularity ``attention`` skips the attention sub-layer only (MindSkip's main setting: the MLP still runs);
``layer`` skips the whole decoder layer (the paper's "Block" row of Table 1).

Where this differs from the paper, and why: each router has a bias, started at ``init_bias`` with zero weights,
so an untrained router runs every layer (the paper's bias-free router starts at a coin flip); see
:mod:`exitbench.training.router_training` for the training objective.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from exitbench.errors import ExitbenchError
from exitbench.models.addon_io import load_state, read_module, save_module
from exitbench.models.cache import KVCache
from exitbench.models.view import EarlyExitModel

ROUTER_FORMAT = 1
ROUTER_FILE = "routers.pt"  # <models>/routers/<model>/ROUTER_FILE, written by train_routers
Granularity = Literal["attention", "layer"]


def routed_layer_indices(num_layers: int, num_routed: int) -> list[int]:
    """The ``num_routed`` layers before the last one: ``L-1-n .. L-2``."""
    if not 1 <= num_routed <= num_layers - 1:
        raise ExitbenchError(
            f"routers: num_routed {num_routed} must be in 1..{num_layers - 1} (the model has {num_layers} layers; "
            "the last one always runs)"
        )
    return list(range(num_layers - 1 - num_routed, num_layers - 1))


class DepthRouters(nn.Module):
    """``R_l(h) = sigmoid(w_l . mean_t Norm_l(h)_t + b_l)`` for each routed layer ``l``."""

    def __init__(
        self,
        model: EarlyExitModel,
        num_routed: int,
        granularity: Granularity = "attention",
        threshold: float = 0.5,
        init_bias: float = 1.0,
    ) -> None:
        super().__init__()
        self.layers = routed_layer_indices(model.num_layers, num_routed)
        self.granularity: Granularity = granularity
        self.threshold = threshold
        self.routers = nn.ModuleList(nn.Linear(model.shape.hidden_size, 1) for _ in self.layers)
        for router in self.routers:
            nn.init.zeros_(router.weight)
            nn.init.constant_(router.bias, init_bias)
        #: the control's fixed skip set (train_routers: the layers routed off most often on held-out text)
        self.static_skip: list[int] = []

    def score(self, layer: int, normed: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """``R_layer`` for each sequence of ``normed`` ``[B, S, H]`` (padding left out by ``mask`` ``[B, S]``): ``[B]``."""
        if mask is None:
            pooled = normed.mean(dim=1)
        else:
            weights = mask.to(normed.dtype).unsqueeze(-1)
            pooled = (normed * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)
        return torch.sigmoid(self.routers[self.layers.index(layer)](pooled)).squeeze(-1)


def skipped_layer_forward(
    model: EarlyExitModel, index: int, hidden: torch.Tensor, granularity: Granularity
) -> torch.Tensor:
    """Layer ``index`` with its attention skipped (``attention``: ``h + MLP(Norm(h))``) or whole (``layer``: ``h``)."""
    return hidden if granularity == "layer" else model.mlp_block(index, hidden)


def decide(routers: DepthRouters, model: EarlyExitModel, index: int, hidden: torch.Tensor) -> bool:
    """Whether layer ``index``'s attention runs for the sequence ``hidden`` ``[1, S, H]`` (its input)."""
    normed = model.layers[index].input_layernorm(hidden)
    return bool(routers.score(index, normed)[0] >= routers.threshold)


def routed_forward(
    model: EarlyExitModel,
    routers: DepthRouters,
    hidden: torch.Tensor,
    rope: tuple[torch.Tensor, torch.Tensor],
    start: int,
    cache: KVCache,
    skipped: set[int] | None,
) -> tuple[torch.Tensor, set[int]]:
    """Every layer over ``hidden`` at ``start..``, skipping ``skipped`` (None: decided now, layer by layer, from this
    input, as at the prompt); returns the last layer's states and the set skipped."""
    deciding = skipped is None
    skipped = set() if skipped is None else skipped
    for index in range(model.num_layers):
        if deciding and index in routers.layers and not decide(routers, model, index, hidden):
            skipped.add(index)
        if index in skipped:
            hidden = skipped_layer_forward(model, index, hidden, routers.granularity)
        else:
            hidden = model.layer_forward(index, hidden, rope, start, cache)
    return hidden, skipped


def save_routers(routers: DepthRouters, path: Path, info: dict[str, Any]) -> None:
    """The routers' weights and settings and ``info`` (what they were trained on), written whole or not at all."""
    payload = {
        "format": ROUTER_FORMAT,
        "num_routed": len(routers.layers),
        "granularity": routers.granularity,
        "threshold": routers.threshold,
        "static_skip": list(routers.static_skip),
        "state_dict": routers.state_dict(),
    }
    save_module(path, {**payload, "info": info})


def load_routers(model: EarlyExitModel, path: str | Path) -> DepthRouters:
    """The routers saved at ``path`` for ``model`` (on its device and dtype); one clear error when they do not fit."""
    path = Path(path)
    payload = read_module(path, ROUTER_FORMAT, "routers", "train_routers", "routers")
    if int(payload["num_routed"]) > model.num_layers - 1:
        raise ExitbenchError(
            f"{path} routes {payload['num_routed']} layers, more than this {model.num_layers}-layer model has; "
            "rerun `dvc repro train_routers`"
        )
    routers = DepthRouters(model, int(payload["num_routed"]), payload["granularity"], float(payload["threshold"]))
    load_state(routers, payload["state_dict"], path, "train_routers")
    routers.static_skip = [int(layer) for layer in payload.get("static_skip", [])]
    return routers.to(device=model.device, dtype=model.dtype).eval()
