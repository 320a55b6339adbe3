"""Prompt-lookup decoding (PLD), greedy and exact: drafts copied from the text itself, no draft model.

Saxena (2023), github.com/apoorvumang/prompt-lookup-decoding: each round, the last ``n`` tokens of the
sequence (prompt + tokens generated so far) are looked up earlier in the same sequence, for ``n`` from
``ngram_size`` down to 1; the tokens that followed the first (leftmost) match, at most ``d`` of them and
cut before an EOS, are the draft (:func:`lookup_draft`, the rule of transformers'
``PromptLookupCandidateGenerator.get_candidates``, so the peer ``hf_prompt_lookup`` drafts the same
tokens). The full model reads the last committed token and the draft in ONE forward over ``d + 1``
positions and keeps the longest prefix it agrees with plus its own next token, as in
:mod:`exitbench.decoding.speculative`; the cache is cropped to the committed tokens. A round with no match
is an ordinary greedy step (counted in ``layer_calls["lookup_misses"]``). Greedy verification makes the
output identical to greedy decoding.

It needs no training and no second model: the free baseline a user would try first, strongest where
the output copies the input (summaries quote their article).
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence

from pydantic import Field

from exitbench.decoding.base import DecodeResult, DecodingMethod, MethodOptions, StopRule, register
from exitbench.decoding.speculative import forward_all
from exitbench.decoding.steps import accept_drafts, finish, greedy, new_cache_for, prefill
from exitbench.models.cache import KVCache


class PromptLookupOptions(MethodOptions):
    ngram_size: int = Field(3, ge=1, description="n: the longest suffix looked up (then n-1, ..., 1)")
    num_speculations: int = Field(10, ge=1, description="d: the most tokens copied per round")


def lookup_draft(
    sequence: Sequence[int], ngram_size: int, num_tokens: int, eos_token_ids: Collection[int] = ()
) -> list[int]:
    """The tokens after the leftmost earlier occurrence of the sequence's last ``n``-gram, longest ``n`` first.

    At most ``num_tokens``, cut before the first EOS id; [] when nothing matches (or the match is followed by
    an EOS at once: transformers' rule, where that round then drafts nothing).
    """
    length = len(sequence)
    if num_tokens < 1:
        return []
    for n in range(min(ngram_size, length - 1), 0, -1):
        tail = list(sequence[length - n :])
        first = tail[0]
        for start in range(length - n):  # the window at length - n is the tail itself
            if sequence[start] != first or list(sequence[start : start + n]) != tail:
                continue
            draft = list(sequence[start + n : min(start + n + num_tokens, length)])
            for index, token in enumerate(draft):
                if token in eos_token_ids:
                    return draft[:index]
            return draft
    return []


def verify_round(
    model, cache: KVCache, position: int, last: int, drafts: list[int], result: DecodeResult
) -> list[int]:
    """The full model over ``[last, *drafts]`` at ``position``: the accepted drafts plus its own next token.

    ``last`` is committed but not yet in ``cache``; afterwards the cache holds it and the accepted drafts.
    """
    full_choice = forward_all(model, cache, [last, *drafts], position)[0].argmax(-1).tolist()
    committed = accept_drafts(drafts, full_choice, result)
    cache.crop(position + len(committed))
    return committed


@register
class PromptLookup(DecodingMethod):
    name = "prompt_lookup"
    Options = PromptLookupOptions
    exact = True

    def _generate(self, prompt_ids: list[int], max_new_tokens: int, stop: StopRule) -> DecodeResult:
        model, opts = self.model, self.options
        start = time.perf_counter()
        cache = new_cache_for(model, len(prompt_ids), max_new_tokens, slack=opts.num_speculations + 2)
        tokens = [greedy(prefill(model, cache, prompt_ids))]
        result = DecodeResult(tokens=tokens, wall_time_s=0.0, prefill_time_s=time.perf_counter() - start)
        result.acceptance_histogram = [0] * (opts.num_speculations + 1)
        result.layer_calls = {"verify_forwards": 0, "lookup_misses": 0}
        checked = 0
        while len(tokens) < max_new_tokens and stop.cut(tokens, checked) is None:
            checked = len(tokens)
            budget = min(opts.num_speculations, max_new_tokens - len(tokens) - 1)
            drafts = lookup_draft(prompt_ids + tokens, opts.ngram_size, budget, stop.eos_token_ids)
            result.layer_calls["lookup_misses"] += not drafts
            result.layer_calls["verify_forwards"] += 1
            tokens.extend(verify_round(model, cache, len(prompt_ids) + len(tokens) - 1, tokens[-1], drafts, result))
        result.tokens = finish(tokens, max_new_tokens, stop)
        return result
