"""Two-model speculative decoding, greedy (Leviathan et al. 2023, arXiv:2211.17192; Chen et al. 2023).

A separate, smaller draft model proposes ``d`` tokens greedily with its own KV cache; the main model scores
the last committed token and the ``d`` drafts in ONE forward over ``d + 1`` positions with its own cache.
The longest prefix on which both agree is accepted, plus the main model's token after it (Leviathan et al.,
Algorithm 1 with greedy acceptance), and each cache is cropped to the tokens it holds that were committed.
Greedy verification makes the output identical to greedy decoding of the main model.

Unlike LayerSkip's self-speculation (:mod:`exitbench.decoding.self_speculative`) nothing is shared
between draft and verify: the verifier recomputes all L layers for the drafted positions.

Where the draft comes from (``draft_layers``): 0 takes the model the caller passes (the pipeline's
``models/draft``: the base model's first ``model.draft_layers`` layers, never trained to draft); E >= 1 makes a
standalone copy of the evaluated model's own first E layers with its final norm and LM head: its own weights
and its own KV cache, as a separate draft model has. For a LayerSkip-trained model those layers and the
shared head are the early exit its training taught to predict the next token (Elhoushi et al. 2024, §4.1),
so the draft is trained for its target, and its drafts are the ones self-speculation at E makes: the two
differ only in what they cost (a copy of E layers and the head in memory, a second cache, and no reuse of
the draft's computation by the verification). :meth:`Speculative.extra_memory` reports the copy's size.
With ``draft_vocab_file`` the draft head proposes from a sub-vocabulary only, as self-speculation's may.

The draft cache lags by design: it holds only tokens the draft model has read. When every draft was
accepted, the last draft was never fed to the draft model, so the next round's first draft forward reads
the pending tokens (the last draft and the main model's token) together in one forward.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, ClassVar

from pydantic import Field
from torch import nn

from exitbench.decoding.base import MethodOptions, register
from exitbench.decoding.draft_verify import Draft, DraftHead, DraftVerifyMethod, Proposer, Round
from exitbench.decoding.steps import as_ids, new_cache_for, prefill
from exitbench.errors import ExitbenchError
from exitbench.models.view import EarlyExitModel


class SpeculativeOptions(MethodOptions):
    num_speculations: int = Field(..., ge=1, description="d: tokens the draft model proposes per round")
    draft_layers: int = Field(
        0,
        ge=0,
        description="0: the draft model passed in (models/draft); E: a standalone copy of the evaluated "
        "model's first E layers, final norm and head",
    )
    draft_vocab_file: str = Field("", description="JSON list of token ids the draft head may propose")


def own_layers_draft(model: EarlyExitModel, num_layers: int) -> EarlyExitModel:
    """A separate draft model: a copy (own weights) of ``model``'s first ``num_layers`` layers, norm and head."""
    if not 1 <= num_layers < model.num_layers:
        raise ExitbenchError(
            f"speculative: draft_layers is {num_layers} but the model has {model.num_layers} layers; "
            f"set it between 1 and {model.num_layers - 1} (0: the prepared draft model)"
        )
    draft = copy.copy(model)  # the view: shape, rotary embedding (no weights) and projection choice
    # one deepcopy of all four keeps a tied head tied to the copied embeddings
    modules = copy.deepcopy((model.embed_tokens, model.layers[:num_layers], model.norm, model.lm_head))
    draft.embed_tokens, draft.layers, draft.norm, draft.lm_head = modules
    draft.shape = dataclasses.replace(model.shape, num_layers=num_layers)
    draft.hf = nn.ModuleList(modules)  # what num_parameters and model_bytes count: the copy's own weights
    return draft


def model_bytes(model: EarlyExitModel) -> int:
    """Bytes of ``model``'s parameters (tied embeddings counted once)."""
    return sum(param.numel() * param.element_size() for param in model.hf.parameters())


class DraftModelProposer(Proposer):
    """Drafts with a separate model and its own cache, which lags the committed tokens by what it has not read."""

    def __init__(
        self, draft: EarlyExitModel, head: DraftHead, num_speculations: int, prompt_ids: list[int], max_new_tokens: int
    ) -> None:
        self.draft, self.head, self.d = draft, head, num_speculations
        self.cache = new_cache_for(draft, len(prompt_ids), max_new_tokens, slack=num_speculations + 2)
        prefill(draft, self.cache, prompt_ids)

    def propose(self, round_: Round) -> Draft:
        draft, cache = self.draft, self.cache
        drafts: list[int] = []
        pending = round_.sequence[cache.lengths[0] :]  # 1 token, or 2 after a fully accepted round
        for _ in range(min(self.d, round_.room)):
            start = cache.lengths[0]
            hidden = draft.forward_layers(draft.embed(as_ids(draft, pending)), 0, draft.num_layers, start, cache)
            token = self.head.propose(hidden[:, -1:])
            drafts.append(token)
            pending = [token]
            if token in round_.stop.eos_token_ids:
                break
        calls = round_.result.layer_calls
        calls["draft_forwards"] += len(drafts)
        calls["verify_forwards"] += 1
        return Draft(drafts)

    def settle(self, round_: Round, draft: Draft, committed: list[int]) -> None:
        self.cache.crop(round_.position + len(committed))  # what the draft read of them (all but the last draft)


@register
class Speculative(DraftVerifyMethod):
    name = "speculative"
    Options = SpeculativeOptions
    exact = True
    needs_draft: ClassVar[bool] = True  # the benchmark sweep gives it a draft model of E layers

    def __init__(
        self, model: EarlyExitModel, options: SpeculativeOptions, draft_model: EarlyExitModel | None = None
    ) -> None:
        if options.draft_layers:
            draft_model = own_layers_draft(model, options.draft_layers)
        super().__init__(model, options, draft_model)
        self.head = DraftHead(draft_model, options.draft_vocab_file) if draft_model is not None else None

    def extra_memory(self) -> dict[str, Any] | None:
        """What the draft model holds beside the evaluated model: its parameters, their bytes, and its KV cache's
        bytes per token (self-speculation needs none of it: its draft is the model's own first layers)."""
        draft = self.draft_model
        if draft is None:
            return None
        s = draft.shape
        return {
            "what": f"draft model: {'own copy of the first' if self.options.draft_layers else 'passed in,'} "
            f"{draft.num_layers} layers, norm and head",
            "num_parameters": draft.num_parameters,
            "bytes": model_bytes(draft),
            "fraction_of_model": model_bytes(draft) / model_bytes(self.model),
            "kv_cache_bytes_per_token": 2 * s.num_layers * s.num_kv_heads * s.head_dim * draft.dtype.itemsize,
        }

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

    def counters(self) -> dict[str, int]:
        return {"draft_forwards": 0, "verify_forwards": 0}

    def proposer(self, prompt_ids: list[int], max_new_tokens: int) -> Proposer:
        draft, head = self._check_draft(), self.head
        assert head is not None
        return DraftModelProposer(draft, head, self.options.num_speculations, prompt_ids, max_new_tokens)
