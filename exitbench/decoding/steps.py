"""The forward passes every method is built from: prefill, one full step, one draft step, verification.

Each is a small function over an :class:`EarlyExitModel` and its :class:`KVCache`, in the style of
gpt-fast's ``prefill`` / ``decode_one_token``. Shapes: hidden ``[1, S, H]``, logits ``[1, S, V]``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from exitbench.decoding.base import StopRule
from exitbench.models.cache import KVCache
from exitbench.models.view import EarlyExitModel


def as_ids(model: EarlyExitModel, tokens: Sequence[int]) -> torch.Tensor:
    """Token ids as a ``[1, S]`` tensor on the model's device."""
    return torch.tensor([list(tokens)], dtype=torch.long, device=model.device)


def greedy(logits: torch.Tensor) -> int:
    """The argmax token of the last position's logits."""
    return int(logits[0, -1].argmax())


def prefill(
    model: EarlyExitModel, cache: KVCache, prompt: Sequence[int], last_layer: int | None = None
) -> torch.Tensor:
    """Run the prompt through layers ``0..last_layer-1`` (all by default); logits of the last position."""
    last = model.num_layers if last_layer is None else last_layer
    hidden = model.forward_layers(model.embed(as_ids(model, prompt)), 0, last, 0, cache)
    return model.logits(hidden[:, -1:])


def full_step(model: EarlyExitModel, cache: KVCache, token: int, position: int) -> torch.Tensor:
    """One token through every layer; logits ``[1, 1, V]``."""
    hidden = model.forward_layers(model.embed(as_ids(model, [token])), 0, model.num_layers, position, cache)
    return model.logits(hidden)


def draft_hidden(
    model: EarlyExitModel, cache: KVCache, tokens: Sequence[int], position: int, exit_layer: int
) -> torch.Tensor:
    """Tokens through layers ``0..exit_layer-1`` only (their K/V cached); the exit hidden state."""
    return model.forward_layers(model.embed(as_ids(model, tokens)), 0, exit_layer, position, cache)


def new_cache_for(model: EarlyExitModel, prompt_len: int, max_new_tokens: int, slack: int = 16) -> KVCache:
    """A cache sized for the whole generation (plus draft overshoot), so no step reallocates."""
    return model.new_cache(prompt_len + max_new_tokens + slack)


def finish(tokens: list[int], max_new_tokens: int, stop: StopRule) -> list[int]:
    """Truncate to the budget and to the first stop point (the same rule for every method)."""
    tokens = tokens[:max_new_tokens]
    cut = stop.cut(tokens)
    return tokens if cut is None else tokens[:cut]
