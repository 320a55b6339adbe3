"""SWIFT: self-speculation through a searched set of skipped layers, no training (Xia et al., ICLR 2025,
arXiv:2410.06916; reference code github.com/hemingkx/SWIFT).

The draft is the model itself with some intermediate layers left out, as in Draft & Verify
(:mod:`exitbench.decoding.layer_skip_draft`), but the set is searched on the fly instead of chosen on a
development set with a trained-for-purpose budget. SWIFT's two phases:

- **Optimization.** The search space is the ``2 (L - 2)`` sub-layers of layers ``1..L-2``, attention and MLP
  separately (the first and the last layer always run whole); a candidate skips ``k = int(r * 2 (L - 2))`` of
  them (r the skip ratio, 0.45 in the reference code), and the search starts from the attention and the MLP of
  every other layer (1, 3, 5, ...). Each iteration proposes a candidate uniformly at random, or, every
  ``bayes_interval``-th iteration, by Bayesian optimisation (a Gaussian process over one score in [0, 1] per
  sub-layer, upper-confidence-bound acquisition with kappa 2.5, GP noise alpha 1e-2; the ``k`` highest scores
  are skipped), and scores its *matchness*: over a
  window of ``context_window`` tokens of context, in one parallel forward of the skipping model over the full
  model's K/V of what precedes the window, the fraction of positions where its greedy token equals the full
  model's. The best set so far is kept; the search stops when matchness exceeds ``max_score`` (0.95), after
  ``max_tolerance_iter`` iterations without improvement, or after ``max_opt_iter``.
- **Acceleration.** Each round drafts through the kept sub-layers until ``d`` drafts or a draft whose top-1
  probability is below ``min_confidence`` (0.8: SWIFT's confidence-aware drafting, ``stop_threshold``), then the
  full model verifies them in one forward (:mod:`exitbench.decoding.draft_verify`); greedy acceptance keeps the
  output exactly greedy decoding's.

Where this differs from the reference code, and why:

- ``granularity: layer`` searches over whole layers instead (``int(r * (L - 2))`` of them; Draft & Verify's
  space), a control for what the finer space buys.
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
from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field

from exitbench.decoding.base import MethodOptions, register
from exitbench.decoding.draft_verify import DraftVerifyMethod, Proposer
from exitbench.decoding.layer_skip_draft import SkippingProposer, SkipSet
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
    granularity: Literal["sublayer", "layer"] = Field(
        "sublayer", description="what the search skips: attention and MLP sub-layers apart (the reference) or layers"
    )
    skip_layers: list[int] | None = Field(None, description="a fixed set of whole layers to skip instead of the search")
    skip_attention: list[int] | None = Field(None, description="a fixed set of attention sub-layers to skip")
    skip_mlp: list[int] | None = Field(None, description="a fixed set of MLP sub-layers to skip")
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
def matchness(model: EarlyExitModel, contexts: list[Context], skip: SkipSet) -> float:
    """The fraction of window positions where the model without the sub-layers in ``skip`` chooses what the full
    model does (SWIFT's layer-set objective); each context's cache is left as it was."""
    agree = total = 0
    for context in contexts:
        hidden = model.embed(as_ids(model, context.window))
        hidden = skip.forward(model, hidden, model.rope(hidden, context.start), context.start, context.cache)
        context.cache.crop(context.start)
        agree += int((model.logits(hidden)[0].argmax(-1) == context.target).sum())
        total += len(context.window)
    return agree / max(total, 1)


@dataclass(frozen=True)
class Candidate:
    """One element of the search space: layer ``layer``'s attention, its MLP, or (whole layers) both."""

    layer: int
    attention: bool
    mlp: bool


def search_space(num_layers: int, granularity: str) -> list[Candidate]:
    """Layers ``1..L-2`` whole, or their attention sub-layers followed by their MLP sub-layers (the reference
    code's order of its Bayesian-optimisation coordinates)."""
    layers = range(1, num_layers - 1)
    if granularity == "layer":
        return [Candidate(layer, True, True) for layer in layers]
    return [Candidate(layer, True, False) for layer in layers] + [Candidate(layer, False, True) for layer in layers]


def skip_set(chosen: list[Candidate]) -> SkipSet:
    return SkipSet(frozenset(c.layer for c in chosen if c.attention), frozenset(c.layer for c in chosen if c.mlp))


@dataclass
class SearchResult:
    skipped: SkipSet
    matchness: float
    initial_matchness: float
    iterations: int
    improvements: int
    seconds: float
    stopped_because: str


def search_skip_set(model: EarlyExitModel, contexts: list[Context], opts: SwiftOptions) -> SearchResult:
    """SWIFT's optimization phase (random search with interleaved Bayesian optimisation) over the sets of
    ``int(r * n)`` of the ``n`` sub-layers (or layers) of ``1..L-2``; see the module docstring."""
    try:  # imported here: only the search needs it
        from bayes_opt import BayesianOptimization, acquisition
    except ImportError:
        raise ExitbenchError(
            "swift: the layer-set search needs the bayesian-optimization package (in requirements/cpu.lock.txt): "
            "run bash scripts/setup.sh, or set skip_layers"
        ) from None

    start_time = time.perf_counter()
    layers = model.num_layers
    candidates = search_space(layers, opts.granularity)
    if not candidates:
        raise ExitbenchError(f"swift: a {layers}-layer model has no intermediate layer to skip; set skip_layers")
    k = max(1, int(opts.skip_ratio * len(candidates)))
    best = skip_set([c for c in candidates if c.layer % 2 == 1])  # the reference's start: every other layer
    best_score = initial = matchness(model, contexts, best)
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
            chosen = {int(i) for i in np.argsort(-scores, kind="stable")[:k]}
        else:
            chosen = {int(i) for i in rng.choice(len(candidates), size=k, replace=False)}
        point = {key: float(i in chosen) for i, key in enumerate(keys)}
        skipped = skip_set([candidates[i] for i in sorted(chosen)])
        score = matchness(model, contexts, skipped)
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


def fixed_skip_set(opts: SwiftOptions, num_layers: int) -> SkipSet | None:
    """The set given in the options instead of a search (``skip_layers`` whole, or ``skip_attention`` and
    ``skip_mlp``), checked against the model; None when none is given."""
    if opts.skip_layers is None and opts.skip_attention is None and opts.skip_mlp is None:
        return None
    if opts.skip_layers is not None and (opts.skip_attention is not None or opts.skip_mlp is not None):
        raise ExitbenchError("swift: set skip_layers or skip_attention/skip_mlp, not both")
    if opts.skip_layers is not None:
        skip = SkipSet.of_layers(opts.skip_layers)
        given = "skip_layers"
    else:
        skip = SkipSet(frozenset(opts.skip_attention or ()), frozenset(opts.skip_mlp or ()))
        given = "skip_attention/skip_mlp"
    inside = all(0 <= layer < num_layers for layer in skip.attention | skip.mlp)
    if not inside or not 0 < skip.sublayers_run(num_layers) < 2 * num_layers:
        raise ExitbenchError(
            f"swift: {given} {sorted(skip.attention)}/{sorted(skip.mlp)} must be layers in 0..{num_layers - 1} of "
            f"this {num_layers}-layer model, skipping at least one sub-layer and leaving at least one"
        )
    return skip


# ----------------------------------------------------------------------------------------------- the method


@register
class Swift(DraftVerifyMethod):
    name = "swift"
    Options = SwiftOptions
    exact = True

    def __init__(self, model: EarlyExitModel, options: SwiftOptions, draft_model: Any = None) -> None:
        super().__init__(model, options, draft_model)
        self.search: SearchResult | None = None
        fixed = fixed_skip_set(options, model.num_layers)
        if fixed is not None:
            self.skipped = fixed
        elif not options.calibration_file:
            raise ExitbenchError("swift: no calibration text to search on (the task has none): set skip_layers")
        else:
            texts = read_calibration(options.calibration_file, options.max_calibration)
            contexts = build_contexts(model, texts, options.context_window)
            if not contexts:
                raise ExitbenchError(f"swift: calibration_file {options.calibration_file} has no text of 2+ tokens")
            self.search = search_skip_set(model, contexts, options)
            self.skipped = self.search.skipped

    def counters(self) -> dict[str, int]:
        return {"draft_forwards": 0, "verify_forwards": 0, "sublayers_per_draft": self.sublayers_per_draft}

    @property
    def sublayers_per_draft(self) -> int:
        return self.skipped.sublayers_run(self.model.num_layers)

    def proposer(self, prompt_ids: list[int], max_new_tokens: int) -> Proposer:
        opts = self.options
        return SkippingProposer(self.model, self.skipped, opts.num_speculations, opts.min_confidence)

    def calibration_summary(self) -> dict[str, Any]:
        """What the optimization phase chose and what it cost (the per-prompt times leave it out)."""
        summary: dict[str, Any] = {
            "granularity": self.options.granularity,
            "skipped_attention": sorted(self.skipped.attention),
            "skipped_mlp": sorted(self.skipped.mlp),
            "sublayers_per_draft": self.sublayers_per_draft,
        }
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
