"""Draft & Verify: self-speculation whose draft skips intermediate layers (Zhang et al. 2023, arXiv:2309.08168).

The draft model is the model itself with a fixed set of decoder layers left out (Draft & Verify §3.2 picks
the set by Bayesian optimisation on a development set; here it is the ``skip_layers`` option). Each round
drafts ``d`` tokens greedily through the kept layers and the shared head (their attention reads the K/V the
full model wrote for every committed token, and writes the draft positions' K/V in the layers it runs), then
verifies them in ONE forward of all ``L`` layers over ``d + 1`` positions. That forward rewrites the draft
positions in every layer, and the cache is cropped to the accepted length, so committed K/V are always the
full model's. Greedy verification makes the output exactly greedy decoding's.

Unlike LayerSkip's draft (layers 0..E-1, whose K/V and exit state verification reuses), a skipping draft
feeds its kept layers other inputs than the full model does, so nothing it computes can be reused: the
verification runs every layer, and the draft costs ``(L - |skip|) / L`` of a full step per token.
"""

from __future__ import annotations

import time

from pydantic import Field

from exitbench.decoding.base import DecodeResult, DecodingMethod, MethodOptions, StopRule, register
from exitbench.decoding.speculative import forward_all
from exitbench.decoding.steps import accept_drafts, as_ids, finish, greedy, new_cache_for, prefill
from exitbench.errors import ExitbenchError
from exitbench.models.cache import KVCache


class LayerSkipDraftOptions(MethodOptions):
    skip_layers: list[int] = Field(..., min_length=1, description="0-based decoder layers the draft leaves out")
    num_speculations: int = Field(..., ge=1, description="d: tokens drafted per round")


@register
class LayerSkipDraft(DecodingMethod):
    name = "layer_skip_draft"
    Options = LayerSkipDraftOptions
    exact = True

    def __init__(self, model, options, draft_model=None) -> None:
        super().__init__(model, options, draft_model)
        skip, layers = set(options.skip_layers), model.num_layers
        if not all(0 <= layer < layers for layer in skip) or len(skip) >= layers:
            raise ExitbenchError(
                f"layer_skip_draft: skip_layers {sorted(skip)} must be distinct layers in 0..{layers - 1} of this "
                f"{layers}-layer model, leaving at least one; set skip_layers within that range"
            )
        self.kept = [layer for layer in range(layers) if layer not in skip]

    def _generate(self, prompt_ids: list[int], max_new_tokens: int, stop: StopRule) -> DecodeResult:
        model, d = self.model, self.options.num_speculations
        start = time.perf_counter()
        cache = new_cache_for(model, len(prompt_ids), max_new_tokens, slack=d + 2)
        tokens = [greedy(prefill(model, cache, prompt_ids))]
        result = DecodeResult(tokens=tokens, wall_time_s=0.0, prefill_time_s=time.perf_counter() - start)
        result.acceptance_histogram = [0] * (d + 1)
        result.layer_calls = {"draft_forwards": 0, "verify_forwards": 0, "layers_per_draft": len(self.kept)}
        checked = 0
        while len(tokens) < max_new_tokens and stop.cut(tokens, checked) is None:
            checked = len(tokens)
            budget = min(d, max_new_tokens - len(tokens) - 1)
            tokens.extend(self._round(cache, len(prompt_ids) + len(tokens) - 1, tokens[-1], budget, stop, result))
        result.tokens = finish(tokens, max_new_tokens, stop)
        return result

    def _draft(self, cache: KVCache, token: int, position: int) -> int:
        """One draft token: ``token`` (at ``position``) through the kept layers and the head."""
        model = self.model
        hidden = model.embed(as_ids(model, [token]))
        rope = model.rope(hidden, position)
        for layer in self.kept:
            hidden = model.layer_forward(layer, hidden, rope, position, cache)
        return greedy(model.logits(hidden))

    def _round(
        self, cache: KVCache, position: int, last: int, budget: int, stop: StopRule, result: DecodeResult
    ) -> list[int]:
        """Draft up to ``budget`` tokens, verify them with every layer at once; ``last`` is committed, uncached."""
        drafts: list[int] = []
        token = last
        for step in range(budget):
            token = self._draft(cache, token, position + step)
            drafts.append(token)
            if token in stop.eos_token_ids:
                break
        verified = forward_all(self.model, cache, [last, *drafts], position)  # rewrites every layer's draft K/V
        committed = accept_drafts(drafts, verified[0].argmax(-1).tolist(), result)
        cache.crop(position + len(committed))
        result.layer_calls["draft_forwards"] += len(drafts)
        result.layer_calls["verify_forwards"] += 1
        return committed
