"""CALM: per-token early exit by a local confidence measure and a decaying threshold (Schuster et al. 2022).

Each decoded token runs the layers one by one. After every candidate layer (``min_exit_layer``, then
every ``exit_every``-th, and always the last) the confidence ``c_t^i`` (CALM §3.5: softmax response,
hidden-state saturation or the early-exit classifier, see :mod:`exitbench.confidence`) is compared
with the decaying threshold ``lambda'(lambda, t)`` of CALM Eq. 5 (``N = max_new_tokens``); the token
exits at the first layer where ``c_t^i > lambda'``, and the shared head turns that state into the token.

A token that exits at layer ``i`` leaves holes in layers ``i..L-1`` of the KV cache, which later tokens
attend to. Three ways to fill them (``kv_strategy``):

``propagate``
    CALM §3.3.1: copy the exit state up; each skipped layer computes its own K/V from it right away
    (:meth:`EarlyExitModel.write_kv_only`).
``recompute``
    Keep the skipped positions' hidden states pending per layer. When a later token runs layer ``l``,
    the pending positions of that layer run it too, in the same batched call, and ride along as extra
    queries as deep as the current token goes; so every K/V that is cached is exactly the full model's.
    Holes left at the current token's exit stay pending. The extra work is counted in ``layer_calls``.
``monotonic``
    No token exits below the deepest exit an earlier decoded token took (exits never decrease); the
    holes a token reads below that floor are filled by propagation from the earlier exit states, just
    before it reads them.

The prompt is prefilled through every layer, so the first token is the full model's (exit layer ``L``).
:meth:`Calm.generate_from_prefill` continues a prefill made once and shared (e.g. with greedy decoding of
the same prompt, :func:`exitbench.decoding.steps.prefill_prompt`), with token-identical results.
``threshold >= 1`` never exits early: the LTT fallback ``lambda = 1`` of CALM §4 means the full model
(Eq. 5 alone would decay a threshold of 1 below 1 after the first token).
"""

from __future__ import annotations

import math
import time
from typing import Literal

import torch
from pydantic import Field

from exitbench.calibration import decaying_threshold
from exitbench.confidence import (
    classifier_confidence,
    classifier_features,
    load_exit_classifier,
    softmax_response,
    state_saturation,
)
from exitbench.decoding.base import DecodeResult, DecodingMethod, MethodOptions, StopRule, register
from exitbench.decoding.steps import ContinuesPrefill, as_ids, finish, greedy, new_cache_for, prefill
from exitbench.errors import ExitbenchError
from exitbench.models.cache import KVCache
from exitbench.models.view import EarlyExitModel

Rope = tuple[torch.Tensor, torch.Tensor]


class CalmOptions(MethodOptions):
    threshold: float = Field(..., ge=0, description="lambda in [0, 1] (CALM Eq. 5); >= 1 (e.g. inf) never exits early")
    measure: Literal["softmax", "state", "classifier"] = "softmax"
    min_exit_layer: int = Field(1, ge=1, description="the first layer count at which a token may exit")
    exit_every: int = Field(1, ge=1, description="exit checks every this many layers from min_exit_layer")
    tau: float = Field(4.0, allow_inf_nan=False, description="decay temperature of CALM Eq. 5")
    kv_strategy: Literal["propagate", "recompute", "monotonic"] = "propagate"
    classifier_file: str = Field("", description="trained early-exit classifier (measure 'classifier')")


def candidate_layers(num_layers: int, min_exit_layer: int, exit_every: int) -> frozenset[int]:
    """Layer counts where a token may exit: ``min_exit_layer``, every ``exit_every``-th after it, and ``L``."""
    return frozenset(range(min_exit_layer, num_layers + 1, exit_every)) | {num_layers}


def step_threshold(lam: float, t: int, num_tokens: int, tau: float) -> float:
    """The threshold for output position ``t``: CALM Eq. 5, or ``inf`` when ``lam >= 1`` (never exit early)."""
    return math.inf if lam >= 1.0 else decaying_threshold(lam, t, num_tokens, tau)


class Confidence:
    """One of CALM's §3.5 measures, evaluated on the current token's state after a layer."""

    def __init__(self, model: EarlyExitModel, measure: str, classifier: dict[str, torch.Tensor] | None) -> None:
        self.model = model
        self.measure = measure
        self.classifier = classifier

    def __call__(self, hidden: torch.Tensor, previous: torch.Tensor) -> tuple[float, torch.Tensor | None]:
        """Confidence of the state ``hidden`` (after layer i; ``previous`` after layer i-1), and the logits
        when the measure computed them (so an exit does not run the head twice)."""
        if self.measure == "softmax":
            logits = self.model.logits(hidden)
            return float(softmax_response(logits)[0, -1]), logits
        if self.measure == "state":
            return float(state_saturation(hidden, previous)[0, -1]), None
        assert self.classifier is not None
        features = classifier_features(self.model, hidden)
        return float(classifier_confidence(features, self.classifier["weight"], self.classifier["bias"])[0, -1]), None


class Propagate:
    """CALM §3.3.1 state propagation: after an exit at ``i``, layers ``i..L-1`` get K/V from the exit state."""

    def __init__(self, model: EarlyExitModel, cache: KVCache, calls: dict[str, int]) -> None:
        self.model, self.cache, self.calls = model, cache, calls

    def floor(self) -> int:
        return 0

    def run_layer(self, index: int, hidden: torch.Tensor, position: int, rope: Rope) -> torch.Tensor:
        return self.model.layer_forward(index, hidden, rope, position, self.cache)

    def exited(self, exit_layer: int, hidden: torch.Tensor, position: int, rope: Rope) -> None:
        for index in range(exit_layer, self.model.num_layers):
            self.model.write_kv_only(index, hidden, rope, position, self.cache)
        self.calls["kv_only_token_layers"] += self.model.num_layers - exit_layer


class Monotonic:
    """Exits never go below the deepest earlier exit; holes are filled by propagation when first read."""

    def __init__(self, model: EarlyExitModel, cache: KVCache, calls: dict[str, int]) -> None:
        self.model, self.cache, self.calls = model, cache, calls
        self.deepest = 0
        self.exit_states: dict[int, torch.Tensor] = {}  # position -> its exit state [1, 1, H]

    def floor(self) -> int:
        return self.deepest

    def run_layer(self, index: int, hidden: torch.Tensor, position: int, rope: Rope) -> torch.Tensor:
        start = self.cache.lengths[index]
        if start < position:
            states = torch.cat([self.exit_states[p] for p in range(start, position)], dim=1)
            self.model.write_kv_only(index, states, self.model.rope(states, start), start, self.cache)
            self.calls["kv_only_token_layers"] += position - start
        return self.model.layer_forward(index, hidden, rope, position, self.cache)

    def exited(self, exit_layer: int, hidden: torch.Tensor, position: int, rope: Rope) -> None:
        self.deepest = max(self.deepest, exit_layer)
        if exit_layer < self.model.num_layers:
            self.exit_states[position] = hidden


class Recompute:
    """Skipped positions stay pending per layer and run with the next token that reaches that layer.

    Invariant: layer ``l`` caches positions ``0..len_l-1`` exactly as the full model would, and positions
    ``len_l..`` (a suffix) are pending. ``pending[p]`` holds the input of position ``p``'s first missing layer.
    """

    def __init__(self, model: EarlyExitModel, cache: KVCache, calls: dict[str, int]) -> None:
        self.model, self.cache, self.calls = model, cache, calls
        self.pending: dict[int, torch.Tensor] = {}
        self.carry: torch.Tensor | None = None  # pending rows riding along with the current token
        self.carry_start = 0

    def floor(self) -> int:
        return 0

    def run_layer(self, index: int, hidden: torch.Tensor, position: int, rope: Rope) -> torch.Tensor:
        if self.carry is None:
            self.carry_start = position
        start = self.cache.lengths[index]
        if start == position:  # nothing pending at this layer (so nothing carried either)
            return self.model.layer_forward(index, hidden, rope, position, self.cache)
        rows = [self.pending.pop(p) for p in range(start, self.carry_start)]
        if self.carry is not None:
            rows.append(self.carry)
        batch = torch.cat([*rows, hidden], dim=1)  # positions start..position
        out = self.model.layer_forward(index, batch, self.model.rope(batch, start), start, self.cache)
        self.calls["recomputed_token_layers"] += batch.shape[1] - 1
        self.carry, self.carry_start = out[:, :-1], start
        return out[:, -1:]

    def exited(self, exit_layer: int, hidden: torch.Tensor, position: int, rope: Rope) -> None:
        if exit_layer < self.model.num_layers:
            if self.carry is not None:
                for offset in range(self.carry.shape[1]):
                    self.pending[self.carry_start + offset] = self.carry[:, offset : offset + 1]
            self.pending[position] = hidden
        self.carry = None


STRATEGIES = {"propagate": Propagate, "recompute": Recompute, "monotonic": Monotonic}


@register
class Calm(ContinuesPrefill, DecodingMethod):
    name = "calm"
    Options = CalmOptions

    def __init__(self, model: EarlyExitModel, options: CalmOptions, draft_model: EarlyExitModel | None = None):
        super().__init__(model, options, draft_model)
        classifier = None
        if options.measure == "classifier":
            if not options.classifier_file:
                raise ExitbenchError("method 'calm': measure 'classifier' needs option 'classifier_file'")
            loaded = load_exit_classifier(options.classifier_file, model.shape.hidden_size)
            classifier = {key: value.to(model.device) for key, value in loaded.items()}
        self.confidence = Confidence(model, options.measure, classifier)
        self.candidates = candidate_layers(model.num_layers, options.min_exit_layer, options.exit_every)

    def _generate(self, prompt_ids: list[int], max_new_tokens: int, stop: StopRule) -> DecodeResult:
        model = self.model
        start = time.perf_counter()
        cache = new_cache_for(model, len(prompt_ids), max_new_tokens)
        first = greedy(prefill(model, cache, prompt_ids))
        prefill_time = time.perf_counter() - start
        result = self._decode(cache, len(prompt_ids), first, max_new_tokens, stop)
        result.prefill_time_s = prefill_time
        return result

    def _decode(self, cache: KVCache, prompt_len: int, first: int, max_new_tokens: int, stop: StopRule) -> DecodeResult:
        """Every token after the prefill's ``first`` (exit layer ``L``), each exiting by the rule."""
        model = self.model
        tokens = [first]
        exit_layers = [model.num_layers]
        calls = {
            "num_layers": model.num_layers, "token_layers": 0, "recomputed_token_layers": 0,
            "kv_only_token_layers": 0, "confidence_evaluations": 0,
        }
        strategy = STRATEGIES[self.options.kv_strategy](model, cache, calls)
        while len(tokens) < max_new_tokens and stop.cut(tokens, len(tokens) - 1) is None:
            position = prompt_len + len(tokens) - 1
            threshold = step_threshold(self.options.threshold, len(tokens), max_new_tokens, self.options.tau)
            token, exit_layer = self._step(strategy, tokens[-1], position, threshold, calls)
            tokens.append(token)
            exit_layers.append(exit_layer)
        tokens = finish(tokens, max_new_tokens, stop)
        return DecodeResult(tokens=tokens, wall_time_s=0.0, layer_calls=calls, exit_layers=exit_layers[: len(tokens)])

    def _step(
        self, strategy: Propagate | Recompute | Monotonic, token: int, position: int, threshold: float,
        calls: dict[str, int],
    ) -> tuple[int, int]:
        """Run ``token`` (at ``position``) layer by layer until it exits; the next token and the exit layer."""
        model = self.model
        hidden = model.embed(as_ids(model, [token]))
        rope = model.rope(hidden, position)
        floor = strategy.floor()
        logits = None
        exit_layer = model.num_layers
        for index in range(model.num_layers):
            previous = hidden
            hidden = strategy.run_layer(index, hidden, position, rope)
            count = index + 1
            if count == model.num_layers:
                break
            if count in self.candidates and count >= floor and threshold < math.inf:
                calls["confidence_evaluations"] += 1
                confidence, logits = self.confidence(hidden, previous)
                if confidence > threshold:
                    exit_layer = count
                    break
                logits = None
        calls["token_layers"] += exit_layer
        strategy.exited(exit_layer, hidden, position, rope)
        if logits is None:
            logits = model.logits(hidden)
        return greedy(logits), exit_layer
