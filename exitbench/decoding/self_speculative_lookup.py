"""Self-speculation with prompt lookup: copy a draft from the text when it can, draft with the early exit when not.

A combination the two lines of work suggest and neither measures. Each round first looks the sequence's last
n-gram up in the text itself (:func:`~exitbench.decoding.prompt_lookup.lookup_draft`, free); when it matches,
the copied tokens are verified by one full-model forward (:func:`~exitbench.decoding.draft_verify.verify`);
when nothing matches, the round is a LayerSkip self-speculative round (layers 0..E-1 draft ``d`` tokens,
layers E..L-1 verify them; :class:`~exitbench.decoding.self_speculative.SelfSpeculative`). Both kinds of
round leave the one shared cache holding exactly the committed tokens, and both verify greedily, so the
output is identical to greedy decoding.

``layer_calls`` counts the two kinds apart: ``lookup_rounds`` (each one full-model forward) /
``lookup_drafted`` / ``lookup_accepted`` beside the self-speculative rounds' ``draft_forwards`` (layers
0..E-1) / ``verify_forwards`` (layers E..L-1).
"""

from __future__ import annotations

from pydantic import Field

from exitbench.decoding.base import register
from exitbench.decoding.draft_verify import Draft, Proposer, Round
from exitbench.decoding.prompt_lookup import lookup_draft
from exitbench.decoding.self_speculative import EarlyExitProposer, SelfSpeculative, SelfSpeculativeOptions


class SelfSpeculativeLookupOptions(SelfSpeculativeOptions):
    ngram_size: int = Field(3, ge=1, description="n: the longest suffix looked up (then n-1, ..., 1)")
    lookup_speculations: int = Field(10, ge=1, description="the most tokens copied per lookup round")


class LookupThenExitProposer(Proposer):
    """A copied draft when the text has one (or when no draft fits the budget: then one full step), else the
    early exit's."""

    def __init__(self, ngram_size: int, lookup_speculations: int, early_exit: EarlyExitProposer) -> None:
        self.ngram_size, self.lookup_d, self.early_exit = ngram_size, lookup_speculations, early_exit

    def propose(self, round_: Round) -> Draft:
        copied = lookup_draft(
            round_.sequence, self.ngram_size, min(self.lookup_d, round_.room), round_.stop.eos_token_ids
        )
        if not copied and round_.room > 0:
            return self.early_exit.propose(round_)
        calls = round_.result.layer_calls
        calls["lookup_rounds"] += bool(copied)
        calls["lookup_drafted"] += len(copied)
        return Draft(copied)

    def settle(self, round_: Round, draft: Draft, committed: list[int]) -> None:
        if draft.states is None:  # a lookup round (or a full step): its accepted drafts
            round_.result.layer_calls["lookup_accepted"] += len(committed) - 1


@register
class SelfSpeculativeLookup(SelfSpeculative):
    name = "self_speculative_lookup"
    Options = SelfSpeculativeLookupOptions
    exact = True

    def longest_draft(self) -> int:
        return max(self.options.num_speculations, self.options.lookup_speculations)

    def counters(self) -> dict[str, int]:
        return {
            "draft_forwards": 0,
            "verify_forwards": 0,
            "lookup_rounds": 0,
            "lookup_drafted": 0,
            "lookup_accepted": 0,
        }

    def proposer(self, prompt_ids: list[int], max_new_tokens: int) -> Proposer:
        opts = self.options
        early_exit = EarlyExitProposer(
            self.model, opts.exit_layer, opts.num_speculations, self.head, self.min_confidence()
        )
        return LookupThenExitProposer(opts.ngram_size, opts.lookup_speculations, early_exit)
