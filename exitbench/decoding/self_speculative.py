"""LayerSkip self-speculative decoding with one shared KV cache (Elhoushi et al. 2024, §4.3).

Each round drafts ``d`` tokens greedily through layers 0..E-1 and the shared head, then verifies them in
ONE forward of layers E..L-1 over ``d + 1`` positions, resuming from the exit-layer hidden states kept
while drafting (the exit-query cache) and reading the K/V that drafting wrote for layers 0..E-1 (one
cache for draft and verify). The longest prefix on which draft and full model agree is accepted, plus
the full model's token after it; every layer's cache is then cropped to the accepted length. Greedy
verification makes the output identical to greedy decoding of the full model.

Optionally the draft head is restricted to a sub-vocabulary (``draft_vocab_file``: a JSON list of token
ids, e.g. the most frequent tokens of the task's training data): drafting gets cheaper, and since the
full model decides every token, the output stays exact.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from pydantic import Field

from exitbench.decoding.base import DecodeResult, DecodingMethod, MethodOptions, StopRule, register
from exitbench.decoding.steps import accept_drafts, draft_hidden, finish, greedy, new_cache_for, prefill
from exitbench.errors import ExitbenchError
from exitbench.models.cache import KVCache


class SelfSpeculativeOptions(MethodOptions):
    exit_layer: int = Field(..., ge=1, description="E: layers used to draft")
    num_speculations: int = Field(..., ge=1, description="d: tokens drafted per round")
    draft_vocab_file: str = Field("", description="JSON list of token ids the draft head may propose")


class DraftHead:
    """The shared head g, over the whole vocabulary or a sub-vocabulary."""

    def __init__(self, model, vocab_file: str) -> None:
        self.model = model
        self.ids: torch.Tensor | None = None
        if vocab_file:
            path = Path(vocab_file)
            if not path.exists():
                raise ExitbenchError(f"self_speculative: draft_vocab_file {path} not found")
            ids = torch.tensor(sorted(set(json.loads(path.read_text()))), dtype=torch.long, device=model.device)
            self.ids = ids
            self.weight = model.lm_head.weight[ids].contiguous()  # [V_sub, H]

    def propose(self, hidden: torch.Tensor) -> int:
        if self.ids is None:
            return greedy(self.model.logits(hidden))
        return int(self.ids[greedy(self.model.logits_subset(hidden, self.weight))])

    def propose_with_confidence(self, hidden: torch.Tensor) -> tuple[int, float]:
        """The greedy draft and its probability under the draft head's softmax (over the sub-vocabulary, if any)."""
        logits = self.model.logits(hidden) if self.ids is None else self.model.logits_subset(hidden, self.weight)
        probability, index = torch.softmax(logits[0, -1].float(), dim=-1).max(dim=-1)
        token = int(index) if self.ids is None else int(self.ids[index])
        return token, float(probability)


@register
class SelfSpeculative(DecodingMethod):
    name = "self_speculative"
    Options = SelfSpeculativeOptions
    exact = True

    def _generate(self, prompt_ids: list[int], max_new_tokens: int, stop: StopRule) -> DecodeResult:
        model, opts = self.model, self.options
        head = DraftHead(model, opts.draft_vocab_file)
        start = time.perf_counter()
        cache = new_cache_for(model, len(prompt_ids), max_new_tokens, slack=opts.num_speculations + 2)
        tokens = [greedy(prefill(model, cache, prompt_ids))]
        result = DecodeResult(tokens=tokens, wall_time_s=0.0, prefill_time_s=time.perf_counter() - start)
        result.acceptance_histogram = [0] * (opts.num_speculations + 1)
        result.layer_calls = {"draft_forwards": 0, "verify_forwards": 0}
        checked = 0
        while len(tokens) < max_new_tokens and stop.cut(tokens, checked) is None:
            checked = len(tokens)
            budget = min(opts.num_speculations, max_new_tokens - len(tokens) - 1)
            tokens.extend(self._round(cache, head, len(prompt_ids) + len(tokens) - 1, tokens[-1], budget, stop, result))
        result.tokens = finish(tokens, max_new_tokens, stop)
        return result

    def min_confidence(self) -> float:
        """Drafting stops at a draft less probable than this (0: never; d drafts a round)."""
        return 0.0

    def _round(
        self, cache: KVCache, head: DraftHead, position: int, last: int, budget: int, stop: StopRule,
        result: DecodeResult,
    ) -> list[int]:
        """One draft-then-verify round; ``last`` (at ``position``) is committed but not yet in the cache.

        With a confidence floor (:meth:`min_confidence` > 0) drafting also stops at the first draft whose
        probability is below it: that draft is dropped, and the exit state just computed (of the last kept
        token) is the one the verification starts from, so the round saves that forward too.
        """
        model, exit_layer = self.model, self.options.exit_layer
        floor = self.min_confidence()
        drafts: list[int] = []
        exit_states = []
        token = last
        unsure = False
        for step in range(budget):
            hidden = draft_hidden(model, cache, [token], position + step, exit_layer)  # [1, 1, H]
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
            exit_states.append(draft_hidden(model, cache, [token], position + len(drafts), exit_layer))
        verify_in = torch.cat(exit_states, dim=1)  # [1, k+1, H], positions position..position+k
        verified = model.logits(model.forward_layers(verify_in, exit_layer, model.num_layers, position, cache))
        committed = accept_drafts(drafts, verified[0].argmax(-1).tolist(), result)
        cache.crop(position + len(committed))  # keep `last` and the accepted drafts, in every layer
        result.layer_calls["draft_forwards"] += len(drafts) + 1
        result.layer_calls["verify_forwards"] += 1
        return committed
