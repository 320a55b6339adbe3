"""Greedy autoregressive decoding with a KV cache, batch size 1: the baseline of every speed-up."""

from __future__ import annotations

import time

from exitbench.decoding.base import DecodeResult, DecodingMethod, MethodOptions, StopRule, register
from exitbench.decoding.steps import finish, full_step, greedy, new_cache_for, prefill


class AutoregressiveOptions(MethodOptions):
    pass


@register
class Autoregressive(DecodingMethod):
    name = "autoregressive"
    Options = AutoregressiveOptions
    exact = True

    def _generate(self, prompt_ids: list[int], max_new_tokens: int, stop: StopRule) -> DecodeResult:
        model = self.model
        start = time.perf_counter()
        cache = new_cache_for(model, len(prompt_ids), max_new_tokens)
        tokens = [greedy(prefill(model, cache, prompt_ids))]
        prefill_time = time.perf_counter() - start
        while len(tokens) < max_new_tokens and stop.cut(tokens, len(tokens) - 1) is None:
            position = len(prompt_ids) + len(tokens) - 1
            tokens.append(greedy(full_step(model, cache, tokens[-1], position)))
        tokens = finish(tokens, max_new_tokens, stop)
        calls = {"full_forwards": len(tokens), "layers_per_full_forward": model.num_layers}
        return DecodeResult(tokens=tokens, wall_time_s=0.0, prefill_time_s=prefill_time, layer_calls=calls)
