"""LayerSkip self-speculative decoding with one shared KV cache (Elhoushi et al. 2024, §4.3).

Each round drafts ``d`` tokens greedily through layers 0..E-1 and the shared head, then verifies them in
ONE forward of layers E..L-1 over ``d + 1`` positions, resuming from the exit-layer hidden states kept
while drafting (the exit-query cache) and reading the K/V that drafting wrote for layers 0..E-1 (one
cache for draft and verify). The longest prefix on which draft and full model agree is accepted, plus
the full model's token after it; every layer's cache is then cropped to the accepted length. Greedy
verification makes the output identical to greedy decoding of the full model.

Optionally the draft head is restricted to a sub-vocabulary (``draft_vocab_file``: a JSON list of token
ids, e.g. the most frequent tokens of the task's training data): drafting gets cheaper, and since the
full model decides every token, the output stays exact. The loop and the verification are
:mod:`exitbench.decoding.draft_verify`'s; this module is the proposer.
"""

from __future__ import annotations

import torch
from pydantic import Field

from exitbench.decoding.base import MethodOptions, register
from exitbench.decoding.draft_verify import Draft, DraftHead, DraftVerifyMethod, Proposer, Round
from exitbench.decoding.steps import draft_hidden
from exitbench.models.view import EarlyExitModel


class SelfSpeculativeOptions(MethodOptions):
    exit_layer: int = Field(..., ge=1, description="E: layers used to draft")
    num_speculations: int = Field(..., ge=1, description="d: tokens drafted per round")
    draft_vocab_file: str = Field("", description="JSON list of token ids the draft head may propose")


class EarlyExitProposer(Proposer):
    """Drafts through layers 0..E-1 and the shared head, keeping each position's exit state for the verification.

    With a confidence floor (> 0) drafting also stops at the first draft whose probability is below it: that
    draft is dropped, and the exit state just computed (of the last kept token) is the one the verification
    starts from, so the round saves that forward too.
    """

    def __init__(
        self,
        model: EarlyExitModel,
        exit_layer: int,
        num_speculations: int,
        head: DraftHead,
        min_confidence: float = 0.0,
    ) -> None:
        self.model, self.exit_layer, self.d, self.head = model, exit_layer, num_speculations, head
        self.floor = min_confidence

    def propose(self, round_: Round) -> Draft:
        model, exit_layer, head, floor = self.model, self.exit_layer, self.head, self.floor
        position, stop = round_.position, round_.stop
        drafts: list[int] = []
        exit_states = []
        token = round_.last
        unsure = False
        for step in range(min(self.d, round_.room)):
            hidden = draft_hidden(model, round_.cache, [token], position + step, exit_layer)  # [1, 1, H]
            exit_states.append(hidden)
            if floor > 0:
                proposed, confidence = head.propose_with_confidence(hidden)
                if unsure := confidence < floor:
                    break
                token = proposed
            else:
                token = head.propose(hidden)
            drafts.append(token)
            if token in stop.eos_token_ids:
                break
        if not unsure:  # the last draft still needs layers 0..E-1 (no head); then all k+1 positions verify at once
            exit_states.append(draft_hidden(model, round_.cache, [token], position + len(drafts), exit_layer))
        calls = round_.result.layer_calls
        calls["draft_forwards"] += len(drafts) + 1
        calls["verify_forwards"] += 1
        return Draft(drafts, torch.cat(exit_states, dim=1), exit_layer)  # [1, k+1, H] at position..position+k


@register
class SelfSpeculative(DraftVerifyMethod):
    name = "self_speculative"
    Options = SelfSpeculativeOptions
    exact = True

    def __init__(self, model: EarlyExitModel, options: SelfSpeculativeOptions, draft_model=None) -> None:
        super().__init__(model, options, draft_model)
        self.head = DraftHead(model, options.draft_vocab_file)

    def min_confidence(self) -> float:
        """Drafting stops at a draft less probable than this (0: never; d drafts a round)."""
        return 0.0

    def counters(self) -> dict[str, int]:
        return {"draft_forwards": 0, "verify_forwards": 0}

    def proposer(self, prompt_ids: list[int], max_new_tokens: int) -> Proposer:
        opts = self.options
        return EarlyExitProposer(self.model, opts.exit_layer, opts.num_speculations, self.head, self.min_confidence())
