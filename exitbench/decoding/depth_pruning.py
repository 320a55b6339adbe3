"""Depth pruning: drop the n most redundant consecutive layers once, decode greedily with the rest.

Gromov et al. 2024 ("The Unreasonable Ineffectiveness of the Deeper Layers", arXiv:2403.17887): with
x^(l) the input of layer l (x^(L) the last layer's output, before the final norm), the angular distance

    d(x^(l), x^(l+n)) = (1 / pi) arccos( x^(l) . x^(l+n) / (|x^(l)| |x^(l+n)|) )

at the last token of each calibration sequence, averaged over the sequences, is smallest for the block
l*..l*+n-1 whose removal changes the representation least; that block is dropped. Static and lossy: every
token runs the same L - n layers, which is what early exit is most often confused with (early exit drops
the *last* layers, and per token in CALM). The block is chosen from ``calibration_file`` (token-id lists,
written by ``evaluate`` from the task's train split), or given as ``first_pruned``.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import torch
from pydantic import Field

from exitbench.decoding.base import DecodeResult, DecodingMethod, MethodOptions, StopRule, register
from exitbench.decoding.steps import as_ids, finish, greedy, new_cache_for
from exitbench.errors import ExitbenchError
from exitbench.models.cache import KVCache
from exitbench.models.view import EarlyExitModel


class DepthPruningOptions(MethodOptions):
    num_pruned: int = Field(..., ge=1, description="n: consecutive layers removed")
    first_pruned: int | None = Field(None, ge=0, description="l*: the block's first layer; None = by calibration")
    calibration_file: str = Field("", description="JSON list of token-id lists to choose l* on (evaluate sets it)")
    max_calibration: int = Field(32, ge=1, description="the most calibration sequences used")


def angular_distances(hidden_inputs: list[torch.Tensor], num_pruned: int) -> list[float]:
    """d(x^(l), x^(l+n)) for l = 0..L-n, averaged over sequences (Gromov et al. 2024).

    ``hidden_inputs[l]`` is [N, H]: x^(l) at the last token of each of N sequences, l = 0..L.
    """
    distances = []
    for first in range(len(hidden_inputs) - num_pruned):
        cosine = torch.nn.functional.cosine_similarity(
            hidden_inputs[first].double(), hidden_inputs[first + num_pruned].double(), dim=-1
        )
        distances.append(float((torch.arccos(cosine.clamp(-1.0, 1.0)) / math.pi).mean()))
    return distances


@torch.no_grad()
def layer_inputs_at_last_token(model: EarlyExitModel, sequences: list[list[int]]) -> list[torch.Tensor]:
    """x^(l) at each sequence's last token, for l = 0..L: a list of L + 1 tensors [N, H] (float32)."""
    per_layer: list[list[torch.Tensor]] = [[] for _ in range(model.num_layers + 1)]
    for tokens in sequences:
        hidden = model.embed(as_ids(model, tokens))
        rope = model.rope(hidden, 0)
        per_layer[0].append(hidden[0, -1].float())
        for layer in range(model.num_layers):
            hidden = model.layer_forward(layer, hidden, rope)
            per_layer[layer + 1].append(hidden[0, -1].float())
    return [torch.stack(states) for states in per_layer]


def choose_block(model: EarlyExitModel, sequences: list[list[int]], num_pruned: int) -> tuple[int, list[float]]:
    """l* = argmin_l d(x^(l), x^(l+n)) (the first on a tie), and every l's distance."""
    distances = angular_distances(layer_inputs_at_last_token(model, sequences), num_pruned)
    return min(range(len(distances)), key=distances.__getitem__), distances


@register
class DepthPruning(DecodingMethod):
    name = "depth_pruning"
    Options = DepthPruningOptions

    def __init__(
        self, model: EarlyExitModel, options: DepthPruningOptions, draft_model: EarlyExitModel | None = None
    ) -> None:
        super().__init__(model, options, draft_model)
        if options.num_pruned >= model.num_layers:
            raise ExitbenchError(
                f"depth_pruning: num_pruned {options.num_pruned} must be below the model's {model.num_layers} layers"
            )
        self._block: tuple[int, list[float] | None] | None = None

    def block(self) -> tuple[int, list[float] | None]:
        """(l*, the calibration distances or None), computed once."""
        if self._block is None:
            opts, layers = self.options, self.model.num_layers
            if opts.first_pruned is not None:
                if opts.first_pruned + opts.num_pruned > layers:
                    raise ExitbenchError(
                        f"depth_pruning: layers {opts.first_pruned}..{opts.first_pruned + opts.num_pruned - 1} are "
                        f"not all among the model's 0..{layers - 1}; lower first_pruned or num_pruned"
                    )
                self._block = (opts.first_pruned, None)
            elif not opts.calibration_file:
                raise ExitbenchError(
                    "depth_pruning: no calibration text (the task has no train split) and no first_pruned; "
                    "set first_pruned, or leave the method out for this task"
                )
            else:
                path = Path(opts.calibration_file)
                if not path.exists():
                    raise ExitbenchError(f"depth_pruning: calibration_file {path} not found")
                sequences = [seq for seq in json.loads(path.read_text()) if seq][: opts.max_calibration]
                if not sequences:
                    raise ExitbenchError(f"depth_pruning: calibration_file {path} holds no token sequence")
                self._block = choose_block(self.model, sequences, opts.num_pruned)
        return self._block

    def kept_layers(self) -> list[int]:
        first, _ = self.block()
        return [layer for layer in range(self.model.num_layers) if not first <= layer < first + self.options.num_pruned]

    def _forward(self, cache: KVCache, tokens: list[int], position: int) -> torch.Tensor:
        model = self.model
        hidden = model.embed(as_ids(model, tokens))
        rope = model.rope(hidden, position)
        for layer in self.kept_layers():
            hidden = model.layer_forward(layer, hidden, rope, position, cache)
        return model.logits(hidden[:, -1:])

    def _generate(self, prompt_ids: list[int], max_new_tokens: int, stop: StopRule) -> DecodeResult:
        self.block()  # chosen before the clock starts: a one-off cost per model and task, not per prompt
        start = time.perf_counter()
        cache = new_cache_for(self.model, len(prompt_ids), max_new_tokens)
        tokens = [greedy(self._forward(cache, prompt_ids, 0))]
        prefill_time = time.perf_counter() - start
        while len(tokens) < max_new_tokens and stop.cut(tokens, len(tokens) - 1) is None:
            tokens.append(greedy(self._forward(cache, [tokens[-1]], len(prompt_ids) + len(tokens) - 1)))
        tokens = finish(tokens, max_new_tokens, stop)
        first, _ = self.block()
        calls = {"forwards": len(tokens), "layers_per_forward": len(self.kept_layers()), "first_pruned": first}
        return DecodeResult(tokens=tokens, wall_time_s=0.0, prefill_time_s=prefill_time, layer_calls=calls)
