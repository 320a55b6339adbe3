"""Static early exit: every token runs layers 0..E-1, then the model's own shared head (no extra heads).

With a fixed exit layer no token ever reads layers E..L-1, so their KV holes are never filled: the
prompt, too, runs through E layers only (LayerSkip §4.2 "early exit inference"). Per-token exits with
hole filling are the `calm` method. With E = L this is exactly `autoregressive`.
"""

from __future__ import annotations

import time

from pydantic import Field

from exitbench.decoding.base import DecodeResult, DecodingMethod, MethodOptions, StopRule, register
from exitbench.decoding.steps import draft_hidden, finish, greedy, new_cache_for, prefill


class EarlyExitOptions(MethodOptions):
    exit_layer: int = Field(..., ge=1, description="number of layers run before the shared head")


@register
class EarlyExit(DecodingMethod):
    name = "early_exit"
    Options = EarlyExitOptions

    def _generate(self, prompt_ids: list[int], max_new_tokens: int, stop: StopRule) -> DecodeResult:
        model, exit_layer = self.model, self.options.exit_layer
        start = time.perf_counter()
        cache = new_cache_for(model, len(prompt_ids), max_new_tokens)
        tokens = [greedy(prefill(model, cache, prompt_ids, last_layer=exit_layer))]
        prefill_time = time.perf_counter() - start
        while len(tokens) < max_new_tokens and stop.cut(tokens, len(tokens) - 1) is None:
            position = len(prompt_ids) + len(tokens) - 1
            hidden = draft_hidden(model, cache, [tokens[-1]], position, exit_layer)
            tokens.append(greedy(model.logits(hidden)))
        tokens = finish(tokens, max_new_tokens, stop)
        calls = {"exit_forwards": len(tokens), "layers_per_exit_forward": exit_layer}
        return DecodeResult(
            tokens=tokens, wall_time_s=0.0, prefill_time_s=prefill_time, layer_calls=calls,
            exit_layers=[exit_layer] * len(tokens),
        )
