"""Prompt-lookup decoding (PLD), greedy and exact: drafts copied from the text itself, no draft model.

Saxena (2023), github.com/apoorvumang/prompt-lookup-decoding: each round, the last ``n`` tokens of the
sequence (prompt + tokens generated so far) are looked up earlier in the same sequence, for ``n`` from
``ngram_size`` down to 1; the tokens that followed the first (leftmost) match, at most ``d`` of them and
cut before an EOS, are the draft (:func:`lookup_draft`, the rule of transformers'
``PromptLookupCandidateGenerator.get_candidates``, so the peer ``hf_prompt_lookup`` drafts the same
tokens). The full model reads the last committed token and the draft in ONE forward over ``d + 1``
positions and keeps the longest prefix it agrees with plus its own next token (the round of
:mod:`exitbench.decoding.draft_verify`); the cache is cropped to the committed tokens. A round with no match
is an ordinary greedy step (counted in ``layer_calls["lookup_misses"]``). Greedy verification makes the
output identical to greedy decoding.

It needs no training and no second model: the free baseline a user would try first, strongest where
the output copies the input (summaries quote their article).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from pydantic import Field

from exitbench.decoding.base import MethodOptions, register
from exitbench.decoding.draft_verify import Draft, DraftVerifyMethod, Proposer, Round


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


class LookupProposer(Proposer):
    """Drafts what followed the last n-gram's leftmost earlier match (:func:`lookup_draft`); nothing on a miss."""

    def __init__(self, ngram_size: int, num_speculations: int) -> None:
        self.ngram_size, self.d = ngram_size, num_speculations

    def propose(self, round_: Round) -> Draft:
        drafts = lookup_draft(round_.sequence, self.ngram_size, min(self.d, round_.room), round_.stop.eos_token_ids)
        calls = round_.result.layer_calls
        calls["lookup_misses"] += not drafts
        calls["verify_forwards"] += 1
        return Draft(drafts)


@register
class PromptLookup(DraftVerifyMethod):
    name = "prompt_lookup"
    Options = PromptLookupOptions
    exact = True

    def counters(self) -> dict[str, int]:
        return {"verify_forwards": 0, "lookup_misses": 0}

    def proposer(self, prompt_ids: list[int], max_new_tokens: int) -> Proposer:
        return LookupProposer(self.options.ngram_size, self.options.num_speculations)
