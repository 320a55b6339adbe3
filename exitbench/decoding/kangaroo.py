"""Kangaroo: self-speculation through a shallow sub-network and a trained adapter (Liu et al. 2024,
arXiv:2404.18911).

The draft is the model's own first ``E`` layers followed by a small adapter
(:class:`exitbench.models.adapter.KangarooAdapter`, trained on the frozen model by the ``train_adapters``
stage) and the shared exit head. Drafting stops at the first draft whose top-1 probability is below
``min_confidence`` (the paper's "double early exit": the first exit is the shallow sub-network, the second
stops drafting early), or after ``d`` drafts. Because the shallow sub-network IS the model's layers ``0..E-1``,
the K/V it writes are the ones the verification reads, and the verification resumes at layer ``E`` from the
states drafting computed (:mod:`exitbench.decoding.draft_verify`); greedy acceptance keeps the output exactly
greedy decoding's.

Where this differs from the paper: the adapter's output normalisation is the model's final norm (see
:mod:`exitbench.models.adapter`); the verification checks one chain of drafts (greedy, as every method here).
"""

from __future__ import annotations

import torch
from pydantic import Field

from exitbench.decoding.base import MethodOptions, register
from exitbench.decoding.draft_verify import Draft, DraftHead, DraftVerifyMethod, Proposer, Round
from exitbench.decoding.steps import as_ids, draft_hidden
from exitbench.errors import ExitbenchError
from exitbench.models.adapter import KangarooAdapter, load_adapter
from exitbench.models.view import EarlyExitModel


class KangarooOptions(MethodOptions):
    num_speculations: int = Field(..., ge=1, description="d: the most tokens drafted per round")
    min_confidence: float = Field(0.6, ge=0, lt=1, description="drafting stops at a draft less probable than this")
    adapter_file: str = Field(
        "",
        description="the trained adapter (evaluate fills in the model's own, made by "
        "train_adapters); empty = an untrained adapter copied from layer E (tests)",
    )
    exit_layer: int | None = Field(None, ge=1, description="E; left out = the adapter file's (required without one)")
    draft_vocab_file: str = Field("", description="JSON list of token ids the draft head may propose")


class AdapterProposer(Proposer):
    """Drafts through layers ``0..E-1``, the adapter and the exit head; keeps each position's layer-``E`` state for
    the verification, and the adapter's own K/V cache in step with the model's."""

    def __init__(
        self,
        model: EarlyExitModel,
        adapter: KangarooAdapter,
        head: DraftHead,
        num_speculations: int,
        min_confidence: float,
        prompt_ids: list[int],
        max_new_tokens: int,
    ) -> None:
        self.model, self.adapter, self.head = model, adapter, head
        self.d, self.floor, self.exit_layer = num_speculations, min_confidence, adapter.exit_layer
        self.cache = adapter.new_cache(model, len(prompt_ids) + max_new_tokens + num_speculations + 2)
        # the prompt's layer-E states, for the adapter's K/V (layers 0..E-1 again: E/L of a prefill)
        states = model.forward_layers(model.embed(as_ids(model, prompt_ids)), 0, self.exit_layer)
        adapter(states, model.rope(states, 0), 0, self.cache)

    def _adapt(self, state: torch.Tensor, position: int) -> torch.Tensor:
        return self.adapter(state, self.model.rope(state, position), position, self.cache)

    def propose(self, round_: Round) -> Draft:
        model, head, floor, exit_layer = self.model, self.head, self.floor, self.exit_layer
        position, stop = round_.position, round_.stop
        drafts: list[int] = []
        exit_states = []
        token = round_.last
        unsure = False
        for step in range(min(self.d, round_.room)):
            state = draft_hidden(model, round_.cache, [token], position + step, exit_layer)  # [1, 1, H]
            exit_states.append(state)
            adapted = self._adapt(state, position + step)
            if floor > 0:
                proposed, confidence = head.propose_with_confidence(adapted)
                if unsure := confidence < floor:
                    break
                token = proposed
            else:
                token = head.propose(adapted)
            drafts.append(token)
            if token in stop.eos_token_ids:
                break
        if not unsure:  # the last draft's layer-E state (and the adapter's K/V of it); then all k+1 verify at once
            state = draft_hidden(model, round_.cache, [token], position + len(drafts), exit_layer)
            exit_states.append(state)
            self._adapt(state, position + len(drafts))
        calls = round_.result.layer_calls
        calls["draft_forwards"] += len(drafts) + 1
        calls["verify_forwards"] += 1
        return Draft(drafts, torch.cat(exit_states, dim=1), exit_layer)

    def settle(self, round_: Round, draft: Draft, committed: list[int]) -> None:
        self.cache.crop(round_.position + len(committed))  # as the model's: the last token and the accepted drafts


@register
class Kangaroo(DraftVerifyMethod):
    name = "kangaroo"
    Options = KangarooOptions
    exact = True

    def __init__(self, model: EarlyExitModel, options: KangarooOptions, draft_model=None) -> None:
        super().__init__(model, options, draft_model)
        if options.adapter_file:
            adapter = load_adapter(model, options.adapter_file)
            if options.exit_layer and options.exit_layer != adapter.exit_layer:
                raise ExitbenchError(
                    f"kangaroo: exit_layer {options.exit_layer} but {options.adapter_file} was trained at layer "
                    f"{adapter.exit_layer}; leave exit_layer out, or set adapters.exit_layer and retrain"
                )
        elif options.exit_layer:
            adapter = KangarooAdapter(model, options.exit_layer).to(device=model.device, dtype=model.dtype).eval()
        else:
            raise ExitbenchError("kangaroo: give adapter_file (evaluate gives the model's trained one) or exit_layer")
        self.adapter = adapter
        self.head = DraftHead(model, options.draft_vocab_file)

    def counters(self) -> dict[str, int]:
        return {"draft_forwards": 0, "verify_forwards": 0}

    def proposer(self, prompt_ids: list[int], max_new_tokens: int) -> Proposer:
        opts = self.options
        return AdapterProposer(
            self.model, self.adapter, self.head, opts.num_speculations, opts.min_confidence, prompt_ids, max_new_tokens
        )

    def calibration_summary(self) -> dict[str, object]:
        """The adapter this run drafted with: its input layer and (when trained here) what it was trained for."""
        return {"exit_layer": self.adapter.exit_layer, "adapter_file": self.options.adapter_file or None}
