"""Two-model speculative decoding, greedy (Leviathan et al. 2023, arXiv:2211.17192; Chen et al. 2023).

A separate, smaller draft model (in the pipeline the first layers of the main model, ``models/draft``)
proposes ``d`` tokens greedily with its own KV cache; the main model scores the last committed token and
the ``d`` drafts in ONE forward over ``d + 1`` positions with its own cache. The longest prefix on which
both agree is accepted, plus the main model's token after it (Leviathan et al., Algorithm 1 with greedy
acceptance), and each cache is cropped to the tokens it holds that were committed. Greedy verification
makes the output identical to greedy decoding of the main model.

Unlike LayerSkip's self-speculation (:mod:`exitbench.decoding.self_speculative`) nothing is shared
between draft and verify: the verifier recomputes all L layers for the drafted positions.

The draft cache lags by design: it holds only tokens the draft model has read. When every draft was
accepted, the last draft was never fed to the draft model, so the next round's first draft forward reads
the pending tokens (the last draft and the main model's token) together in one forward.
"""

from __future__ import annotations

import time
from typing import ClassVar

import torch
from pydantic import Field

from exitbench.decoding.base import DecodeResult, DecodingMethod, MethodOptions, StopRule, register
from exitbench.decoding.steps import accept_drafts, as_ids, finish, greedy, new_cache_for, prefill
from exitbench.errors import ExitbenchError
from exitbench.models.cache import KVCache
from exitbench.models.view import EarlyExitModel


class SpeculativeOptions(MethodOptions):
    num_speculations: int = Field(..., ge=1, description="d: tokens the draft model proposes per round")


def forward_all(model: EarlyExitModel, cache: KVCache, tokens: list[int], position: int) -> torch.Tensor:
    """Tokens at ``position..`` through every layer of ``model`` (K/V cached); logits ``[1, S, V]``."""
    hidden = model.forward_layers(model.embed(as_ids(model, tokens)), 0, model.num_layers, position, cache)
    return model.logits(hidden)


@register
class Speculative(DecodingMethod):
    name = "speculative"
    Options = SpeculativeOptions
    exact = True
    needs_draft: ClassVar[bool] = True  # the benchmark sweep gives it a draft model of E layers

    def _check_draft(self) -> EarlyExitModel:
        draft = self.draft_model
        if draft is None:
            raise ExitbenchError("speculative: no draft model; pass draft_model= (the pipeline loads models/draft)")
        if draft.shape.vocab_size != self.model.shape.vocab_size:
            raise ExitbenchError(
                f"speculative: draft vocabulary ({draft.shape.vocab_size}) differs from the main model's "
                f"({self.model.shape.vocab_size}); use a draft with the same tokenizer"
            )
        return draft

    def _generate(self, prompt_ids: list[int], max_new_tokens: int, stop: StopRule) -> DecodeResult:
        model, d = self.model, self.options.num_speculations
        draft = self._check_draft()
        start = time.perf_counter()
        cache = new_cache_for(model, len(prompt_ids), max_new_tokens, slack=d + 2)
        draft_cache = new_cache_for(draft, len(prompt_ids), max_new_tokens, slack=d + 2)
        tokens = [greedy(prefill(model, cache, prompt_ids))]
        prefill(draft, draft_cache, prompt_ids)
        result = DecodeResult(tokens=tokens, wall_time_s=0.0, prefill_time_s=time.perf_counter() - start)
        result.acceptance_histogram = [0] * (d + 1)
        result.layer_calls = {"draft_forwards": 0, "verify_forwards": 0}
        checked = 0
        while len(tokens) < max_new_tokens and stop.cut(tokens, checked) is None:
            checked = len(tokens)
            budget = min(d, max_new_tokens - len(tokens) - 1)
            tokens.extend(self._round(cache, draft_cache, prompt_ids + tokens, budget, stop, result))
        result.tokens = finish(tokens, max_new_tokens, stop)
        return result

    def _round(
        self, cache: KVCache, draft_cache: KVCache, sequence: list[int], budget: int, stop: StopRule,
        result: DecodeResult,
    ) -> list[int]:
        """One draft-then-verify round over the committed ``sequence`` (its last token not yet cached)."""
        model, draft = self.model, self._check_draft()
        position = len(sequence) - 1  # of the last committed token, which neither model has read yet
        drafts: list[int] = []
        pending = sequence[draft_cache.lengths[0]:]  # 1 token, or 2 after a fully accepted round
        for _ in range(budget):
            start = draft_cache.lengths[0]
            token = greedy(forward_all(draft, draft_cache, pending, start))
            drafts.append(token)
            pending = [token]
            if token in stop.eos_token_ids:
                break
        verified = forward_all(model, cache, [sequence[-1], *drafts], position)
        committed = accept_drafts(drafts, verified[0].argmax(-1).tolist(), result)
        cache.crop(position + len(committed))  # `last` and the accepted drafts
        draft_cache.crop(position + len(committed))  # what the draft read of them (all but the last draft)
        result.layer_calls["draft_forwards"] += len(drafts)
        result.layer_calls["verify_forwards"] += 1
        return committed
