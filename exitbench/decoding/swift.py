"""SWIFT: self-speculation through a searched set of skipped layers, no training (Xia et al., ICLR 2025,
arXiv:2410.06916; reference code github.com/hemingkx/SWIFT).

The draft is the model itself with some intermediate layers left out, as in Draft & Verify
(:mod:`exitbench.decoding.layer_skip_draft`), but the set is searched on the fly instead of chosen on a
development set with a trained-for-purpose budget. SWIFT's two phases:

- **Optimization.** Candidates skip ``int(r * (L - 2))`` of the layers ``1..L-2`` (the first and the last always
  run; r the skip ratio, 0.45 in the reference code); the search starts from every other layer (1, 3, 5, ...).
  Each iteration proposes a candidate uniformly at random, or, every ``bayes_interval``-th iteration, by Bayesian
  optimisation (a Gaussian process over one score in [0, 1] per layer, upper-confidence-bound acquisition with
  kappa 2.5, GP noise alpha 1e-2; the ``k`` highest scores are skipped), and scores its *matchness*: over a
  window of ``context_window`` tokens of context, in one parallel forward of the skipping model over the full
  model's K/V of what precedes the window, the fraction of positions where its greedy token equals the full
  model's. The best set so far is kept; the search stops when matchness exceeds ``max_score`` (0.95), after
  ``max_tolerance_iter`` iterations without improvement, or after ``max_opt_iter``.
- **Acceleration.** Each round drafts through the kept layers until ``d`` drafts or a draft whose top-1
  probability is below ``min_confidence`` (0.8: SWIFT's confidence-aware drafting, ``stop_threshold``), then the
  full model verifies them in one forward (:mod:`exitbench.decoding.draft_verify`); greedy acceptance keeps the
  output exactly greedy decoding's.

Where this differs from the reference code, and why:

- The search runs over whole layers, not attention and MLP sub-layers separately (a space twice as large):
  a sub-layer draft needs the decoder layer split in two, and the layer code keys every stored generation.
- The optimization phase runs once per model and task, before any timed generation, on the task's calibration
  text (train-split prompts and references; evaluate writes it, as for depth pruning), with the full model's own
  greedy choices at each window position as the ground truth. The reference code optimises during the first
  instances of the stream and keeps the state for the ones after; a benchmark whose records are resumable and
  independent of their order cannot let one prompt's timing depend on the prompts before it. The per-prompt
  speed-ups are therefore SWIFT's acceleration phase; the search's own cost is reported beside them
  (:meth:`Swift.calibration_summary`).
- The verification checks one chain of drafts (greedy, as every method here), not a tree of top-k candidates.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pydantic import Field

from exitbench.decoding.base import MethodOptions, register
from exitbench.decoding.draft_verify import DraftVerifyMethod, Proposer
from exitbench.decoding.layer_skip_draft import SkippingProposer
from exitbench.decoding.steps import as_ids
from exitbench.errors import ExitbenchError
from exitbench.models.cache import KVCache
from exitbench.models.view import EarlyExitModel


class SwiftOptions(MethodOptions):
    num_speculations: int = Field(..., ge=1, description="d: the most tokens drafted per round (reference: 25)")
    min_confidence: float = Field(0.8, ge=0, lt=1, description="drafting stops after a draft less probable than this")
    skip_ratio: float = Field(0.45, gt=0, lt=1, description="r: the fraction of layers 1..L-2 the draft skips")
    context_window: int = Field(32, ge=2, description="window positions each calibration text is scored on")
    max_opt_iter: int = Field(200, ge=0, description="the most search iterations (reference: 1000 over a stream)")
    max_tolerance_iter: int = Field(60, ge=1, description="stop after this many iterations without improvement")
    bayes_interval: int = Field(25, ge=1, description="every n-th candidate comes from Bayesian optimisation")
    max_score: float = Field(0.95, gt=0, le=1, description="stop once a candidate's matchness exceeds this")
    calibration_file: str = Field("", description="JSON list of token-id lists to search on (evaluate sets it)")
    max_calibration: int = Field(8, ge=1, description="the most calibration texts used")
    skip_layers: list[int] | None = Field(None, description="a fixed set to skip instead of the search")
    seed: int = Field(0, description="seed of the random and Bayesian proposals")


# ----------------------------------------------------------------------------------------------- the search


@dataclass
class Context:
    """One calibration text: the full model's K/V of ``tokens[:start]`` and its greedy choice after each window
    token (``target``: the ground truth a draft is scored against)."""

    cache: KVCache
    start: int
    window: list[int]
    target: torch.Tensor


@torch.inference_mode()
def build_contexts(model: EarlyExitModel, texts: list[list[int]], window: int) -> list[Context]:
    """A :class:`Context` of the last ``window`` tokens of each text (texts of fewer than 2 tokens are left out)."""
    contexts = []
    for tokens in texts:
        if len(tokens) < 2:
            continue
        start = max(1, len(tokens) - window)
        cache = model.new_cache(len(tokens) + 1)
        model.forward_layers(model.embed(as_ids(model, tokens[:start])), 0, model.num_layers, 0, cache)
        hidden = model.forward_layers(model.embed(as_ids(model, tokens[start:])), 0, model.num_layers, start, cache)
        cache.crop(start)
        contexts.append(Context(cache, start, tokens[start:], model.logits(hidden)[0].argmax(-1)))
    return contexts


@torch.inference_mode()
def matchness(model: EarlyExitModel, contexts: list[Context], kept: list[int]) -> float:
    """The fraction of window positions where the model through ``kept`` layers chooses what the full model does
    (SWIFT's layer-set objective); each context's cache is left as it was."""
    agree = total = 0
    for context in contexts:
        hidden = model.embed(as_ids(model, context.window))
        rope = model.rope(hidden, context.start)
        for layer in kept:
            hidden = model.layer_forward(layer, hidden, rope, context.start, context.cache)
        context.cache.crop(context.start)
        agree += int((model.logits(hidden)[0].argmax(-1) == context.target).sum())
        total += len(context.window)
    return agree / max(total, 1)


@dataclass
class SearchResult:
    skipped: list[int]
    matchness: float
    initial_matchness: float
    iterations: int
    improvements: int
    seconds: float
    stopped_because: str


def search_skip_set(model: EarlyExitModel, contexts: list[Context], opts: SwiftOptions) -> SearchResult:
    """SWIFT's optimization phase (random search with interleaved Bayesian optimisation) over the sets of
    ``int(r * (L - 2))`` layers among ``1..L-2``; see the module docstring."""
    try:  # imported here: only the search needs it
        from bayes_opt import BayesianOptimization, acquisition
    except ImportError:
        raise ExitbenchError(
            "swift: the layer-set search needs the bayesian-optimization package (in requirements/cpu.lock.txt): "
            "run bash scripts/setup.sh, or set skip_layers"
        ) from None

    start_time = time.perf_counter()
    layers = model.num_layers
    candidates = list(range(1, layers - 1))
    if not candidates:
        raise ExitbenchError(f"swift: a {layers}-layer model has no intermediate layer to skip; set skip_layers")
    k = max(1, int(opts.skip_ratio * len(candidates)))
    best = candidates[::2]  # the reference code's start: every other layer, first and last kept
    best_score = initial = matchness(model, contexts, [i for i in range(layers) if i not in best])
    keys = [f"x{index:03d}" for index in range(len(candidates))]
    optimizer = BayesianOptimization(
        f=None,
        pbounds=dict.fromkeys(keys, (0.0, 1.0)),
        random_state=opts.seed,
        verbose=0,
        acquisition_function=acquisition.UpperConfidenceBound(kappa=2.5),  # seeded by random_state
        allow_duplicate_points=True,
    )
    optimizer.set_gp_params(alpha=1e-2)
    rng = np.random.default_rng(opts.seed)
    tolerance = improvements = iteration = 0
    stopped = "max_opt_iter"
    for iteration in range(1, opts.max_opt_iter + 1):
        if iteration % opts.bayes_interval == 0:
            point = optimizer.suggest()
            scores = np.array([float(point[key]) for key in keys])
            skipped = sorted(candidates[i] for i in np.argsort(-scores, kind="stable")[:k])
        else:
            skipped = sorted(int(i) for i in rng.choice(candidates, size=k, replace=False))
        point = {key: float(layer in skipped) for key, layer in zip(keys, candidates, strict=True)}
        score = matchness(model, contexts, [i for i in range(layers) if i not in skipped])
        optimizer.register(params=point, target=score)
        if score > best_score:
            best, best_score, tolerance = skipped, score, 0
            improvements += 1
            if score > opts.max_score:
                stopped = "max_score"
                break
        else:
            tolerance += 1
            if tolerance > opts.max_tolerance_iter:
                stopped = "max_tolerance_iter"
                break
    return SearchResult(best, best_score, initial, iteration, improvements, time.perf_counter() - start_time, stopped)


def read_calibration(path: str, limit: int) -> list[list[int]]:
    file = Path(path)
    if not file.exists():
        raise ExitbenchError(f"swift: calibration_file {file} not found; evaluate writes it, or set skip_layers")
    texts = json.loads(file.read_text())
    if not isinstance(texts, list) or not all(isinstance(t, list) for t in texts):
        raise ExitbenchError(f"swift: calibration_file {file} is not a JSON list of token-id lists")
    return [[int(t) for t in text] for text in texts[:limit]]


# ----------------------------------------------------------------------------------------------- the method


@register
class Swift(DraftVerifyMethod):
    name = "swift"
    Options = SwiftOptions
    exact = True

    def __init__(self, model: EarlyExitModel, options: SwiftOptions, draft_model: Any = None) -> None:
        super().__init__(model, options, draft_model)
        layers = model.num_layers
        self.search: SearchResult | None = None
        if options.skip_layers is not None:
            skipped = sorted(set(options.skip_layers))
            if not all(0 <= layer < layers for layer in skipped) or not 0 < len(skipped) < layers:
                raise ExitbenchError(
                    f"swift: skip_layers {skipped} must be distinct layers in 0..{layers - 1} of this {layers}-layer "
                    "model, at least one and leaving at least one"
                )
        elif not options.calibration_file:
            raise ExitbenchError("swift: no calibration text to search on (the task has none): set skip_layers")
        else:
            texts = read_calibration(options.calibration_file, options.max_calibration)
            contexts = build_contexts(model, texts, options.context_window)
            if not contexts:
                raise ExitbenchError(f"swift: calibration_file {options.calibration_file} has no text of 2+ tokens")
            self.search = search_skip_set(model, contexts, options)
            skipped = self.search.skipped
        self.skipped = skipped
        self.kept = [layer for layer in range(layers) if layer not in skipped]

    def counters(self) -> dict[str, int]:
        return {"draft_forwards": 0, "verify_forwards": 0, "layers_per_draft": len(self.kept)}

    def proposer(self, prompt_ids: list[int], max_new_tokens: int) -> Proposer:
        opts = self.options
        return SkippingProposer(self.model, self.kept, opts.num_speculations, opts.min_confidence)

    def calibration_summary(self) -> dict[str, Any]:
        """What the optimization phase chose and what it cost (the per-prompt times leave it out)."""
        summary: dict[str, Any] = {"skipped_layers": self.skipped, "layers_per_draft": len(self.kept)}
        if self.search is not None:
            s = self.search
            summary.update(
                matchness=s.matchness,
                initial_matchness=s.initial_matchness,
                iterations=s.iterations,
                improvements=s.improvements,
                search_seconds=s.seconds,
                stopped_because=s.stopped_because,
            )
        return summary
