"""Every method that claims exactness equals greedy decoding token for token at the edges the per-method tests
miss: a budget smaller than d, an EOS a draft proposes and verification rejects, an EOS accepted inside a draft,
E = 1 and E = L - 1, a one-token prompt, and a model of another depth than the 4-layer fixture.

The reference is always `autoregressive` under the same stop rule on the same model. A newly registered exact
method fails here until it has an entry in OPTIONS (its options at a given exit layer E and draft length d).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from exitbench.decoding import REGISTRY, StopRule, build_method
from exitbench.models.tiny import random_llama
from exitbench.models.view import EarlyExitModel
from tests.decoding_helpers import prompts

MAX_NEW = 16

# options of each exact method at exit layer E and draft length d, on a model of L layers
OPTIONS: dict[str, Callable[[int, int, int], dict[str, Any]]] = {
    "autoregressive": lambda e, d, n: {},
    "self_speculative": lambda e, d, n: {"exit_layer": e, "num_speculations": d},
    "adaptive_self_speculative": lambda e, d, n: {"exit_layer": e, "num_speculations": d, "min_confidence": 0.3},
    "self_speculative_lookup": lambda e, d, n: {"exit_layer": e, "num_speculations": d, "ngram_size": 2,
                                                "lookup_speculations": d},
    "speculative": lambda e, d, n: {"num_speculations": d, "draft_layers": e},
    "layer_skip_draft": lambda e, d, n: {"skip_layers": list(range(e, n)), "num_speculations": d},
    "prompt_lookup": lambda e, d, n: {"ngram_size": 2, "num_speculations": d},
    "swift": lambda e, d, n: {"skip_layers": list(range(e, n)), "num_speculations": d, "min_confidence": 0.0},
    "kangaroo": lambda e, d, n: {"exit_layer": e, "num_speculations": d, "min_confidence": 0.0},
    "hf_early_exit": lambda e, d, n: {"exit_layer": e, "num_speculations": d},
    "hf_greedy": lambda e, d, n: {},
    "hf_prompt_lookup": lambda e, d, n: {"ngram_size": 2, "num_speculations": d},
}
EXACT = sorted(name for name, cls in REGISTRY.items() if cls.exact)


@pytest.fixture(scope="module", params=[4, 6], ids=["4-layer", "6-layer"])
def model(request, tiny_model) -> EarlyExitModel:
    return tiny_model if request.param == 4 else EarlyExitModel(random_llama(num_layers=6, seed=3))


def edge_prompts() -> list[list[int]]:
    """The shared seeded prompts and a one-token prompt (a repeat-heavy one lets prompt lookup draft)."""
    return [*prompts(), [17], [5, 9, 5, 9, 5, 9, 5]]


def generate(name: str, model: EarlyExitModel, options: dict, prompt: list[int], budget: int,
             stop: StopRule | None = None) -> list[int]:
    with torch.inference_mode():
        return build_method(name, model, options).generate(prompt, budget, stop).tokens


def test_every_exact_method_has_edge_options():
    assert set(EXACT) <= set(OPTIONS), f"add options for {sorted(set(EXACT) - set(OPTIONS))} to OPTIONS"


@pytest.mark.parametrize("name", EXACT)
@pytest.mark.parametrize("depth", ["E=1", "E=L-1"])
@pytest.mark.parametrize("d", [1, 3])
def test_exact_at_the_shallowest_and_deepest_exit(model, name, depth, d):
    layers = model.num_layers
    exit_layer = 1 if depth == "E=1" else layers - 1
    options = OPTIONS[name](exit_layer, d, layers)
    for prompt in edge_prompts():
        assert generate(name, model, options, prompt, MAX_NEW) == generate("autoregressive", model, {}, prompt,
                                                                          MAX_NEW), (name, prompt)


@pytest.mark.parametrize("name", EXACT)
@pytest.mark.parametrize("budget", [1, 2, 3])
def test_exact_when_the_budget_is_smaller_than_d(model, name, budget):
    options = OPTIONS[name](1, 8, model.num_layers)
    for prompt in edge_prompts():
        assert generate(name, model, options, prompt, budget) == generate("autoregressive", model, {}, prompt,
                                                                         budget), (name, prompt, budget)


def stop_tokens(model: EarlyExitModel, prompt: list[int]) -> dict[str, int]:
    """EOS choices for ``prompt``: the first token a one-layer draft proposes where greedy writes another (a
    draft's EOS that verification rejects), and greedy's own 2nd and 6th tokens (an EOS accepted early and one
    accepted inside a later draft)."""
    greedy = generate("autoregressive", model, {}, prompt, MAX_NEW)
    shallow = generate("early_exit", model, {"exit_layer": 1}, prompt, MAX_NEW)
    choices = {"greedy[1]": greedy[1], "greedy[5]": greedy[5]}
    differing = [i for i, (a, b) in enumerate(zip(greedy, shallow, strict=True)) if a != b]
    if differing:
        choices["rejected draft"] = shallow[differing[0]]
    return choices


@pytest.mark.parametrize("name", EXACT)
def test_exact_when_eos_is_drafted_rejected_or_accepted_inside_a_draft(model, name):
    layers = model.num_layers
    checked = 0
    for prompt in edge_prompts():
        for why, eos in stop_tokens(model, prompt).items():
            stop = StopRule(eos_token_ids=frozenset({eos}))
            reference = generate("autoregressive", model, {}, prompt, MAX_NEW, stop)
            for exit_layer in (1, layers - 1):
                ours = generate(name, model, OPTIONS[name](exit_layer, 4, layers), prompt, MAX_NEW, stop)
                assert ours == reference, (name, why, prompt, exit_layer)
                checked += 1
    assert checked >= 2 * len(edge_prompts()) * 2
