"""The forward passes every method is built from: prefill, one full step, one draft step, verification.

Each is a small function over an :class:`EarlyExitModel` and its :class:`KVCache`, in the style of
gpt-fast's ``prefill`` / ``decode_one_token``. Shapes: hidden ``[1, S, H]``, logits ``[1, S, V]``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from exitbench.decoding.base import DecodeResult, StopRule
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


def accept_drafts(drafts: Sequence[int], full_choice: Sequence[int], result: DecodeResult) -> list[int]:
    """One verification round's committed tokens: the longest prefix of ``drafts`` equal to the full model's
    greedy choices ``full_choice`` (y_0..y_k at the draft positions) plus its next choice; the round is
    counted into ``result`` (rounds, drafted, accepted, acceptance histogram). Greedy acceptance keeps the
    output identical to greedy decoding."""
    accepted = 0
    while accepted < len(drafts) and drafts[accepted] == full_choice[accepted]:
        accepted += 1
    result.num_rounds += 1
    result.num_drafted += len(drafts)
    result.num_accepted += accepted
    result.acceptance_histogram[accepted] += 1
    return [*drafts[:accepted], full_choice[accepted]]


def new_cache_for(model: EarlyExitModel, prompt_len: int, max_new_tokens: int, slack: int = 16) -> KVCache:
    """A cache sized for the whole generation (plus draft overshoot), so no step reallocates."""
    return model.new_cache(prompt_len + max_new_tokens + slack)


def finish(tokens: list[int], max_new_tokens: int, stop: StopRule) -> list[int]:
    """Truncate to the budget and to the first stop point (the same rule for every method)."""
    tokens = tokens[:max_new_tokens]
    cut = stop.cut(tokens)
    return tokens if cut is None else tokens[:cut]


# ------------------------------------------------------------------------------------- shared prefill


@dataclass(frozen=True)
class Prefill:
    """The full model's prefill of one prompt, shared by every generation that continues it.

    ``cache`` holds the prompt's K/V in every layer (allocated like :func:`new_cache_for` for
    ``max_new_tokens``); ``first_token`` is the greedy token of its last position, which is every
    prefill-first method's first output token; ``time_s`` the prefill's wall time. Generations continue
    a private copy (:meth:`KVCache.clone`), so the shared cache is never written.
    """

    prompt_len: int
    max_new_tokens: int
    cache: KVCache
    first_token: int
    time_s: float


def synchronize(model: EarlyExitModel) -> None:
    """Wait for queued device work (CUDA), so wall-clock timings cover it."""
    if model.device.type == "cuda":
        torch.cuda.synchronize()


@torch.inference_mode()
def prefill_prompt(model: EarlyExitModel, prompt: Sequence[int], max_new_tokens: int) -> Prefill:
    """Prefill ``prompt`` through every layer once, for :meth:`generate_from_prefill` of several methods."""
    start = time.perf_counter()
    cache = new_cache_for(model, len(prompt), max_new_tokens)
    first = greedy(prefill(model, cache, prompt))
    synchronize(model)
    return Prefill(len(prompt), max_new_tokens, cache, first, time.perf_counter() - start)


@torch.inference_mode()
def decode_from_prefill(
    model: EarlyExitModel, prefilled: Prefill, decode: Callable[[KVCache], DecodeResult]
) -> DecodeResult:
    """Run ``decode`` on a copy of the shared prefill's cache, timing the decode phase only.

    The copy is made before the clock starts; ``wall_time_s`` of the result is the decode phase (every
    token after the first) and ``prefill_time_s`` is 0: this call ran no prefill.
    """
    cache = prefilled.cache.clone()
    synchronize(model)
    start = time.perf_counter()
    result = decode(cache)
    synchronize(model)
    result.wall_time_s = time.perf_counter() - start
    result.prefill_time_s = 0.0
    return result


class ContinuesPrefill:
    """For a method whose decode phase is ``_decode(cache, prompt_len, first, max_new_tokens, stop)``: runs
    that phase on a shared full-model prefill (see :func:`decode_from_prefill`)."""

    model: EarlyExitModel

    def _decode(self, cache: KVCache, prompt_len: int, first: int, max_new_tokens: int, stop: StopRule) -> DecodeResult:
        raise NotImplementedError

    def generate_from_prefill(
        self, prefilled: Prefill, max_new_tokens: int, stop: StopRule | None = None
    ) -> DecodeResult:
        """``generate``'s output, continuing a shared full-model prefill (left as it is); times decode only."""

        def decode(cache: KVCache) -> DecodeResult:
            return self._decode(cache, prefilled.prompt_len, prefilled.first_token, max_new_tokens, stop or StopRule())

        return decode_from_prefill(self.model, prefilled, decode)
