"""Step-dependent schedules of the training recipe: layer-dropout rates, exit curricula, learning rate.

All pure functions of the step ``t`` (0-based optimizer step), the total number of steps ``T`` and the
number of layers ``L``. Equations from LayerSkip (Elhoushi et al. 2024, arXiv:2404.16710) §4.1.
"""

from __future__ import annotations

import math
from enum import Enum


class DropoutSchedule(str, Enum):
    """S(t): ``continual`` (continual pretraining / finetuning) or ``scratch`` (pretraining from scratch)."""

    CONTINUAL = "continual"
    SCRATCH = "scratch"


class Curriculum(str, Enum):
    """C(t, l): which exits get the early-exit loss at step t (LayerSkip §4.1.2)."""

    ROTATIONAL = "rotational"
    GRADUAL = "gradual"
    NONE = "none"


def depth_scale(layer: int, num_layers: int) -> float:
    """D(l) = e^{l ln2 / (L-1)} - 1, rising from D(0) = 0 to D(L-1) = 1 (LayerSkip §4.1.1).

    A one-layer model never drops its only layer (D = 0).
    """
    if num_layers <= 1:
        return 0.0
    return math.exp(layer * math.log(2) / (num_layers - 1)) - 1.0


def time_scale(step: int, total_steps: int, schedule: DropoutSchedule | str) -> float:
    """S(t) = 1 (continual) or e^{t ln2 / (T-1)} - 1 (from scratch: S(0) = 0, S(T-1) = 1) (LayerSkip §4.1.1)."""
    if DropoutSchedule(schedule) is DropoutSchedule.CONTINUAL or total_steps <= 1:
        return 1.0
    return math.exp(step * math.log(2) / (total_steps - 1)) - 1.0


def dropout_rates(
    step: int, total_steps: int, num_layers: int, p_max: float, schedule: DropoutSchedule | str
) -> list[float]:
    """p_{l,t} = S(t) D(l) p_max for l = 0..L-1 (LayerSkip §4.1.1, the layer-dropout rate per layer)."""
    scale = time_scale(step, total_steps, schedule) * p_max
    return [scale * depth_scale(layer, num_layers) for layer in range(num_layers)]


def rotational_exits(step: int, num_layers: int, rotation: int) -> list[int]:
    """C_rot,R(t, l) = 1 where (l + t) mod R == 0, plus the last layer always (LayerSkip §4.1.2).

    Every R-th layer, shifted by one layer each step, so every layer is enabled once within R steps and
    a step evaluates the head ceil(L/R) (+1 for the last layer) times instead of L.
    """
    enabled = {layer for layer in range(num_layers) if (layer + step) % rotation == 0}
    enabled.add(num_layers - 1)
    return sorted(enabled)


def gradual_exits(step: int, total_steps: int, num_layers: int) -> list[int]:
    """C_grad(t, l): exits enabled from layer L-1 downwards, one more every T/(2L) steps (LayerSkip §4.1.2).

    At t = 0 only the last layer; from t ~ T/2 on, every layer.
    """
    count = min(num_layers, 1 + (step * 2 * num_layers) // max(total_steps, 1))
    return list(range(num_layers - count, num_layers))


def enabled_exits(
    curriculum: Curriculum | str, step: int, total_steps: int, num_layers: int, rotation: int
) -> list[int]:
    """The layers l with C(t, l) = 1 at step t (``none``: every layer, every step)."""
    kind = Curriculum(curriculum)
    if kind is Curriculum.ROTATIONAL:
        return rotational_exits(step, num_layers, rotation)
    if kind is Curriculum.GRADUAL:
        return gradual_exits(step, total_steps, num_layers)
    return list(range(num_layers))


def lr_factor(step: int, warmup_steps: int, total_steps: int) -> float:
    """Learning-rate multiplier: linear warm-up to 1 over ``warmup_steps``, then cosine decay to 0."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    decay_steps = max(total_steps - warmup_steps, 1)
    progress = min((step - warmup_steps) / decay_steps, 1.0)
    return 0.5 * (1.0 + math.cos(math.pi * progress))
