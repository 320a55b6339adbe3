"""Draft & Verify: self-speculation whose draft skips intermediate layers (Zhang et al. 2023, arXiv:2309.08168).

The draft model is the model itself with a fixed set of decoder layers left out (Draft & Verify §3.2 picks
the set by Bayesian optimisation on a development set; here it is the ``skip_layers`` option). Each round
drafts ``d`` tokens greedily through the kept layers and the shared head (their attention reads the K/V the
full model wrote for every committed token, and writes the draft positions' K/V in the layers it runs), then
verifies them in ONE forward of all ``L`` layers over ``d + 1`` positions. That forward rewrites the draft
positions in every layer, and the cache is cropped to the accepted length, so committed K/V are always the
full model's. Greedy verification makes the output exactly greedy decoding's.

Unlike LayerSkip's draft (layers 0..E-1, whose K/V and exit state verification reuses), a skipping draft
feeds its kept layers other inputs than the full model does, so nothing it computes can be reused: the
verification runs every layer, and the draft costs ``(L - |skip|) / L`` of a full step per token.

A draft may also leave out a layer's attention and MLP sub-layers separately (:class:`SkipSet`, as SWIFT's
search does, :mod:`exitbench.decoding.swift`): a sub-layer is a residual step, ``h + Attn(Norm(h))`` or
``h + MLP(Norm(h))``, so leaving one out passes ``h`` on; a left-out attention writes no K/V.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from pydantic import Field

from exitbench.decoding.base import MethodOptions, register
from exitbench.decoding.draft_verify import Draft, DraftVerifyMethod, Proposer, Round
from exitbench.decoding.steps import as_ids, greedy
from exitbench.errors import ExitbenchError
from exitbench.models.cache import KVCache
from exitbench.models.view import EarlyExitModel


class LayerSkipDraftOptions(MethodOptions):
    skip_layers: list[int] = Field(..., min_length=1, description="0-based decoder layers the draft leaves out")
    num_speculations: int = Field(..., ge=1, description="d: tokens drafted per round")


@dataclass(frozen=True)
class SkipSet:
    """The sub-layers a draft leaves out: the layers whose attention, and those whose MLP, it does not run."""

    attention: frozenset[int]
    mlp: frozenset[int]

    @classmethod
    def of_layers(cls, layers: Iterable[int]) -> SkipSet:
        """Whole layers left out: attention and MLP both."""
        skipped = frozenset(layers)
        return cls(skipped, skipped)

    def sublayers_run(self, num_layers: int) -> int:
        """How many of the model's ``2 L`` sub-layers a draft token runs."""
        return 2 * num_layers - len(self.attention) - len(self.mlp)

    def forward(
        self,
        model: EarlyExitModel,
        hidden: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        start: int,
        cache: KVCache,
    ) -> torch.Tensor:
        """Every layer over ``hidden`` at ``start..``, each sub-layer in the set passed over."""
        for layer in range(model.num_layers):
            if layer not in self.attention:
                hidden = model.attention_block(layer, hidden, rope, start, cache)
            if layer not in self.mlp:
                hidden = model.mlp_block(layer, hidden)
        return hidden


class SkippingProposer(Proposer):
    """Drafts through the sub-layers ``skip`` keeps (attention over the full model's committed K/V) and the shared
    head.

    With a confidence floor (> 0) a round's drafting also stops after the first draft whose probability under the
    head is below it (that draft is still verified: it costs the verification one more position only).
    """

    def __init__(self, model: EarlyExitModel, skip: SkipSet, num_speculations: int, min_confidence: float = 0.0):
        self.model, self.skip, self.d, self.floor = model, skip, num_speculations, min_confidence

    def draft_logits(self, round_: Round, token: int, position: int) -> torch.Tensor:
        """The head's logits ``[1, 1, V]`` after ``token`` (at ``position``) ran through the kept sub-layers."""
        model = self.model
        hidden = model.embed(as_ids(model, [token]))
        return model.logits(self.skip.forward(model, hidden, model.rope(hidden, position), position, round_.cache))

    def propose(self, round_: Round) -> Draft:
        drafts: list[int] = []
        token = round_.last
        for step in range(min(self.d, round_.room)):
            logits = self.draft_logits(round_, token, round_.position + step)
            token = greedy(logits)
            drafts.append(token)
            if token in round_.stop.eos_token_ids:
                break
            if self.floor > 0 and float(torch.softmax(logits[0, -1].float(), dim=-1).max()) < self.floor:
                break
        calls = round_.result.layer_calls
        calls["draft_forwards"] += len(drafts)
        calls["verify_forwards"] += 1
        return Draft(drafts)  # verified by every layer, which rewrites the draft positions' K/V


@register
class LayerSkipDraft(DraftVerifyMethod):
    name = "layer_skip_draft"
    Options = LayerSkipDraftOptions
    exact = True

    def __init__(self, model, options, draft_model=None) -> None:
        super().__init__(model, options, draft_model)
        skip, layers = set(options.skip_layers), model.num_layers
        if not all(0 <= layer < layers for layer in skip) or len(skip) >= layers:
            raise ExitbenchError(
                f"layer_skip_draft: skip_layers {sorted(skip)} must be distinct layers in 0..{layers - 1} of this "
                f"{layers}-layer model, leaving at least one; set skip_layers within that range"
            )
        self.skip = SkipSet.of_layers(skip)

    def counters(self) -> dict[str, int]:
        layers_per_draft = self.model.num_layers - len(self.skip.attention)
        return {"draft_forwards": 0, "verify_forwards": 0, "layers_per_draft": layers_per_draft}

    def proposer(self, prompt_ids: list[int], max_new_tokens: int) -> Proposer:
        return SkippingProposer(self.model, self.skip, self.options.num_speculations)
