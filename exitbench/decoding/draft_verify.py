"""The draft-then-verify loop every drafting method shares: a method is its proposer and nothing more.

A generation prefills the prompt through every layer (the first output token is the full model's), then
runs rounds until the budget or a stop point: the method's :class:`Proposer` drafts up to ``d`` tokens after
the last committed token, and the full model verifies the last committed token and the drafts in ONE forward
over ``k + 1`` positions; the longest prefix of drafts it agrees with is accepted, plus its own next token
(Leviathan et al. 2023, arXiv:2211.17192, Algorithm 1 with greedy acceptance), and the cache is cropped to the
committed tokens. Greedy acceptance makes every such method's output identical to greedy decoding.

The verification starts from the embeddings (layer 0) unless the proposer hands over the hidden states it
already computed for these positions with layers ``0..E-1``: then it runs layers ``E..L-1`` only, reading the
K/V that drafting wrote below E (LayerSkip's exit-query cache and shared KV cache, Elhoushi et al. 2024,
§4.3). The loop is explicit, in gpt-fast's style; the proposer interface is in the spirit of transformers'
candidate generators (``get_candidates`` / ``update_candidate_strategy``).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from exitbench.decoding.base import DecodeResult, DecodingMethod, StopRule
from exitbench.decoding.steps import accept_drafts, as_ids, finish, greedy, new_cache_for, prefill
from exitbench.errors import ExitbenchError
from exitbench.models.cache import KVCache
from exitbench.models.view import EarlyExitModel


@dataclass
class Round:
    """One round's context. ``sequence`` is the prompt and every committed token; its last token, at
    ``position``, is committed but not yet in ``cache``. ``room`` is the most drafts the generation's budget
    leaves (a proposer drafts at most ``min(d, room)``)."""

    cache: KVCache
    sequence: list[int]
    room: int
    stop: StopRule
    result: DecodeResult

    @property
    def position(self) -> int:
        return len(self.sequence) - 1

    @property
    def last(self) -> int:
        return self.sequence[-1]


@dataclass
class Draft:
    """A proposer's draft of ``k`` tokens. ``states``, when set, are the inputs of layer ``from_layer`` at the
    round's ``k + 1`` positions (``[1, k + 1, H]``: the last committed token and the ``k`` drafts), computed by the
    proposer with the verifying model's layers ``0..from_layer-1``, whose K/V it left in the cache; the
    verification then runs only the layers above."""

    tokens: list[int]
    states: torch.Tensor | None = None
    from_layer: int = 0


class Proposer:
    """What a drafting method supplies: its drafts, and what it does with the verdict (crop its own state,
    count). One proposer serves one generation; it is built inside the timed prefill."""

    def propose(self, round_: Round) -> Draft:
        raise NotImplementedError

    def settle(self, round_: Round, draft: Draft, committed: list[int]) -> None:
        """Called after verification with the round's committed tokens (accepted drafts and one more)."""


def verify(model: EarlyExitModel, round_: Round, draft: Draft) -> list[int]:
    """The full model over ``[last, *drafts]``: the accepted drafts plus its own next token. Counts the round into
    the result and crops the cache to the committed tokens (``last`` and the accepted drafts)."""
    if draft.states is None:
        hidden, first_layer = model.embed(as_ids(model, [round_.last, *draft.tokens])), 0
    else:
        hidden, first_layer = draft.states, draft.from_layer
    logits = model.logits(model.forward_layers(hidden, first_layer, model.num_layers, round_.position, round_.cache))
    committed = accept_drafts(draft.tokens, logits[0].argmax(-1).tolist(), round_.result)
    round_.cache.crop(round_.position + len(committed))
    return committed


class DraftVerifyMethod(DecodingMethod):
    """A drafting method: subclasses implement :meth:`proposer` (and :meth:`longest_draft`, :meth:`counters`)."""

    exact = True

    def longest_draft(self) -> int:
        """The most tokens one round may draft (sizes the acceptance histogram and the cache's slack)."""
        return self.options.num_speculations

    def counters(self) -> dict[str, int]:
        """The ``layer_calls`` counters this method's proposer keeps, at zero."""
        return {}

    def proposer(self, prompt_ids: list[int], max_new_tokens: int) -> Proposer:
        raise NotImplementedError

    def _generate(self, prompt_ids: list[int], max_new_tokens: int, stop: StopRule) -> DecodeResult:
        model, longest = self.model, self.longest_draft()
        start = time.perf_counter()
        cache = new_cache_for(model, len(prompt_ids), max_new_tokens, slack=longest + 2)
        tokens = [greedy(prefill(model, cache, prompt_ids))]
        proposer = self.proposer(prompt_ids, max_new_tokens)
        result = DecodeResult(tokens=tokens, wall_time_s=0.0, prefill_time_s=time.perf_counter() - start)
        result.acceptance_histogram = [0] * (longest + 1)
        result.layer_calls = self.counters()
        checked = 0
        while len(tokens) < max_new_tokens and stop.cut(tokens, checked) is None:
            checked = len(tokens)
            round_ = Round(cache, prompt_ids + tokens, max_new_tokens - len(tokens) - 1, stop, result)
            draft = proposer.propose(round_)
            committed = verify(model, round_, draft)
            proposer.settle(round_, draft, committed)
            tokens.extend(committed)
        result.tokens = finish(tokens, max_new_tokens, stop)
        return result


class DraftHead:
    """The shared head g, over the whole vocabulary or a sub-vocabulary (``vocab_file``: a JSON list of token
    ids). The full model decides every token, so a sub-vocabulary only makes drafting cheaper."""

    def __init__(self, model: EarlyExitModel, vocab_file: str) -> None:
        self.model = model
        self.ids: torch.Tensor | None = None
        if vocab_file:
            path = Path(vocab_file)
            if not path.exists():
                raise ExitbenchError(f"draft_vocab_file {path} not found; run prepare_data or fix the path")
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
