"""Self-speculation with prompt lookup: copy a draft from the text when it can, draft with the early exit when not.

A combination the two lines of work suggest and neither measures. Each round first looks the sequence's last
n-gram up in the text itself (:func:`~exitbench.decoding.prompt_lookup.lookup_draft`, free); when it matches,
the copied tokens are verified by one full-model forward (:func:`~exitbench.decoding.prompt_lookup.verify_round`);
when nothing matches, the round is a LayerSkip self-speculative round (layers 0..E-1 draft ``d`` tokens,
layers E..L-1 verify them; :class:`~exitbench.decoding.self_speculative.SelfSpeculative`). Both kinds of
round leave the one shared cache holding exactly the committed tokens, and both verify greedily, so the
output is identical to greedy decoding.

``layer_calls`` counts the two kinds apart: ``lookup_rounds`` (each one full-model forward) /
``lookup_drafted`` / ``lookup_accepted`` beside the self-speculative rounds' ``draft_forwards`` (layers
0..E-1) / ``verify_forwards`` (layers E..L-1).
"""

from __future__ import annotations

import time

from pydantic import Field

from exitbench.decoding.base import DecodeResult, StopRule, register
from exitbench.decoding.prompt_lookup import lookup_draft, verify_round
from exitbench.decoding.self_speculative import DraftHead, SelfSpeculative, SelfSpeculativeOptions
from exitbench.decoding.steps import finish, greedy, new_cache_for, prefill


class SelfSpeculativeLookupOptions(SelfSpeculativeOptions):
    ngram_size: int = Field(3, ge=1, description="n: the longest suffix looked up (then n-1, ..., 1)")
    lookup_speculations: int = Field(10, ge=1, description="the most tokens copied per lookup round")


@register
class SelfSpeculativeLookup(SelfSpeculative):
    name = "self_speculative_lookup"
    Options = SelfSpeculativeLookupOptions
    exact = True

    def _generate(self, prompt_ids: list[int], max_new_tokens: int, stop: StopRule) -> DecodeResult:
        model, opts = self.model, self.options
        head = DraftHead(model, opts.draft_vocab_file)
        longest = max(opts.num_speculations, opts.lookup_speculations)
        start = time.perf_counter()
        cache = new_cache_for(model, len(prompt_ids), max_new_tokens, slack=longest + 2)
        tokens = [greedy(prefill(model, cache, prompt_ids))]
        result = DecodeResult(tokens=tokens, wall_time_s=0.0, prefill_time_s=time.perf_counter() - start)
        result.acceptance_histogram = [0] * (longest + 1)
        calls = {"draft_forwards": 0, "verify_forwards": 0, "lookup_rounds": 0, "lookup_drafted": 0,
                 "lookup_accepted": 0}
        result.layer_calls = calls
        checked = 0
        while len(tokens) < max_new_tokens and stop.cut(tokens, checked) is None:
            checked = len(tokens)
            remaining = max_new_tokens - len(tokens) - 1
            position = len(prompt_ids) + len(tokens) - 1
            copied = lookup_draft(prompt_ids + tokens, opts.ngram_size, min(opts.lookup_speculations, remaining),
                                  stop.eos_token_ids)
            if copied or remaining == 0:  # no budget left for drafts: one full step
                accepted_before = result.num_accepted
                tokens.extend(verify_round(model, cache, position, tokens[-1], copied, result))
                calls["lookup_rounds"] += bool(copied)
                calls["lookup_drafted"] += len(copied)
                calls["lookup_accepted"] += result.num_accepted - accepted_before
            else:
                budget = min(opts.num_speculations, remaining)
                tokens.extend(self._round(cache, head, position, tokens[-1], budget, stop, result))
        result.tokens = finish(tokens, max_new_tokens, stop)
        return result
