"""Greedy autoregressive decoding with a KV cache, batch size 1: the baseline of every speed-up."""

from __future__ import annotations

import time

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
    pass


@register
class Autoregressive(ContinuesPrefill, DecodingMethod):
    name = "autoregressive"
    Options = AutoregressiveOptions
    exact = True

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
