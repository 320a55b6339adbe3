"""Greedy autoregressive decoding with a KV cache, batch size 1: the baseline of every speed-up.

``projection: linear`` runs it with every projection through ``F.linear``, as transformers' own forward
does, instead of the form measured fastest on this machine (:func:`exitbench.models.view.project`). Beside
the default it isolates the kernel: ``autoregressive@linear`` against ``autoregressive`` is the kernel's
share of a speed-up, ``hf_greedy`` against ``autoregressive@linear`` the engine's.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Literal

from pydantic import Field

from exitbench.decoding.base import DecodeResult, DecodingMethod, MethodOptions, StopRule, register
from exitbench.decoding.steps import (
    ContinuesPrefill,
    finish,
    full_step,
    greedy,
    new_cache_for,
    prefill,
)
from exitbench.models.cache import KVCache


class AutoregressiveOptions(MethodOptions):
    projection: Literal["measured", "linear"] = Field(
        "measured", description="measured: the faster projection form of this machine; linear: F.linear always"
    )


@register
class Autoregressive(ContinuesPrefill, DecodingMethod):
    name = "autoregressive"
    Options = AutoregressiveOptions
    exact = True

    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int, stop: StopRule | None = None) -> DecodeResult:
        if self.options.projection == "measured":
            return super().generate(prompt_ids, max_new_tokens, stop)
        measured, self.model.skinny_rows = self.model.skinny_rows, 0
        try:
            return super().generate(prompt_ids, max_new_tokens, stop)
        finally:
            self.model.skinny_rows = measured

    def _generate(self, prompt_ids: list[int], max_new_tokens: int, stop: StopRule) -> DecodeResult:
        model = self.model
        start = time.perf_counter()
        cache = new_cache_for(model, len(prompt_ids), max_new_tokens)
        first = greedy(prefill(model, cache, prompt_ids))
        prefill_time = time.perf_counter() - start
        result = self._decode(cache, len(prompt_ids), first, max_new_tokens, stop)
        result.prefill_time_s = prefill_time
        return result

    def _decode(self, cache: KVCache, prompt_len: int, first: int, max_new_tokens: int, stop: StopRule) -> DecodeResult:
        """Every token after the prefill's ``first``, one full step each."""
        model = self.model
        tokens = [first]
        while len(tokens) < max_new_tokens and stop.cut(tokens, len(tokens) - 1) is None:
            position = prompt_len + len(tokens) - 1
            tokens.append(greedy(full_step(model, cache, tokens[-1], position)))
        tokens = finish(tokens, max_new_tokens, stop)
        calls = {"full_forwards": len(tokens), "layers_per_full_forward": model.num_layers}
        return DecodeResult(tokens=tokens, wall_time_s=0.0, layer_calls=calls)
