"""SWIFT: its sub-layer-set search (matchness, the search's rules) and its exactness, on the tiny seeded models."""

from __future__ import annotations

import json

import pytest
import torch

from exitbench.decoding import build_method
from exitbench.decoding.layer_skip_draft import SkipSet
from exitbench.decoding.swift import SwiftOptions, build_contexts, matchness, search_skip_set
from exitbench.errors import ExitbenchError
from exitbench.models.tiny import random_llama
from exitbench.models.view import EarlyExitModel
from tests.decoding_helpers import prompts

MAX_NEW = 20


@pytest.fixture(scope="module")
def deep_model() -> EarlyExitModel:
    return EarlyExitModel(random_llama(num_layers=8, seed=5))


def texts(count: int = 4, length: int = 24) -> list[list[int]]:
    gen = torch.Generator().manual_seed(11)
    return [torch.randint(3, 128, (length,), generator=gen).tolist() for _ in range(count)]


@pytest.fixture()
def calibration(tmp_path):
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps(texts()))
    return str(path)


def test_every_layer_kept_matches_the_full_model_everywhere(deep_model):
    contexts = build_contexts(deep_model, texts(), window=8)
    assert [c.start for c in contexts] == [16] * 4
    assert matchness(deep_model, contexts, SkipSet.of_layers([])) == 1.0
    # scoring leaves each context's cache as it was: the same set scores the same twice
    skip = SkipSet.of_layers([1, 3, 5, 6])
    assert matchness(deep_model, contexts, skip) == matchness(deep_model, contexts, skip)


def test_matchness_counts_agreeing_positions(deep_model):
    """A kept set that is a prefix of the layers (0..j-1) sees the same K/V for the context as the full model, so its
    matchness is computable without a cache: layers 0..j-1 over the whole text, the last ``window`` positions."""
    contexts = build_contexts(deep_model, texts(), window=8)
    fractions = []
    with torch.inference_mode():
        for depth in range(1, 8):
            agree = 0
            for text in texts():
                hidden = deep_model.embed(torch.tensor([text]))
                full = deep_model.logits(deep_model.forward_layers(hidden, 0, 8))[0, -8:].argmax(-1)
                draft = deep_model.logits(deep_model.forward_layers(hidden, 0, depth))[0, -8:].argmax(-1)
                agree += int((draft == full).sum())
            skip = SkipSet.of_layers(range(depth, 8))
            assert matchness(deep_model, contexts, skip) == pytest.approx(agree / 32), depth
            fractions.append(agree / 32)
    assert any(0 < f < 1 for f in fractions)  # cases that can tell a wrong count from a right one


@pytest.mark.parametrize("first", [2, 5])
def test_matchness_of_a_sub_layer_set_equals_the_cache_free_definition(deep_model, first):
    """Sub-layers left out from layer ``first`` on (its MLP, then the attention of every later layer, whose MLPs
    run): the attention that runs sees the full model's inputs, so the window's tokens are computable without a
    cache; with the cache, matchness must count the same agreements."""
    skip = SkipSet(attention=frozenset(range(first + 1, 8)), mlp=frozenset([first]))
    contexts = build_contexts(deep_model, texts(), window=8)
    agree = 0
    with torch.inference_mode():
        for text in texts():
            hidden = deep_model.embed(torch.tensor([text]))
            full = deep_model.logits(deep_model.forward_layers(hidden, 0, 8))[0, -8:].argmax(-1)
            rope = deep_model.rope(hidden, 0)
            draft = deep_model.attention_block(first, deep_model.forward_layers(hidden, 0, first), rope)
            for layer in range(first + 1, 8):
                draft = deep_model.mlp_block(layer, draft)
            agree += int((deep_model.logits(draft)[0, -8:].argmax(-1) == full).sum())
    assert 0 < agree < 32
    assert matchness(deep_model, contexts, skip) == pytest.approx(agree / 32)


@pytest.mark.parametrize("granularity", ["sublayer", "layer"])
def test_search_keeps_first_and_last_layers_and_never_ends_worse_than_it_started(deep_model, granularity):
    contexts = build_contexts(deep_model, texts(), window=8)
    opts = SwiftOptions(num_speculations=4, max_opt_iter=12, bayes_interval=4, skip_ratio=0.5, granularity=granularity)
    result = search_skip_set(deep_model, contexts, opts)
    skipped = result.skipped
    if granularity == "layer":  # whole layers: int(0.5 * 6) of layers 1..6
        assert skipped.attention == skipped.mlp and len(skipped.attention) == 3
    else:  # int(0.5 * 12) of the 12 sub-layers of layers 1..6
        assert len(skipped.attention) + len(skipped.mlp) == 6
    assert skipped.attention | skipped.mlp <= set(range(1, 7))
    assert result.matchness >= result.initial_matchness
    assert result.matchness == matchness(deep_model, contexts, skipped)
    assert 1 <= result.iterations <= 12
    again = search_skip_set(deep_model, contexts, opts)  # seeded: the same proposals, the same set
    assert again.skipped == result.skipped and again.iterations == result.iterations


def test_the_sub_layer_search_finds_sets_whole_layers_cannot_express(deep_model):
    contexts = build_contexts(deep_model, texts(), window=8)
    opts = SwiftOptions(num_speculations=4, max_opt_iter=30, max_tolerance_iter=30, skip_ratio=0.5, max_score=1.0)
    result = search_skip_set(deep_model, contexts, opts)
    assert result.skipped.attention != result.skipped.mlp


def test_search_stops_at_the_score_it_was_asked_for(deep_model):
    contexts = build_contexts(deep_model, texts(), window=8)
    result = search_skip_set(deep_model, contexts, SwiftOptions(num_speculations=1, max_score=0.01, max_opt_iter=50))
    assert result.stopped_because == "max_score" and result.iterations < 50 and result.matchness > 0.01


@pytest.mark.parametrize(("confidence", "granularity"), [(0.0, "sublayer"), (0.8, "sublayer"), (0.0, "layer")])
def test_swift_with_its_searched_set_equals_greedy(deep_model, calibration, confidence, granularity):
    options = {
        "num_speculations": 4,
        "calibration_file": calibration,
        "max_opt_iter": 8,
        "bayes_interval": 3,
        "min_confidence": confidence,
        "granularity": granularity,
    }
    method = build_method("swift", deep_model, options)
    summary = method.calibration_summary()
    assert summary["skipped_attention"] == sorted(method.skipped.attention)
    assert summary["skipped_mlp"] == sorted(method.skipped.mlp) and summary["iterations"] >= 1
    greedy = build_method("autoregressive", deep_model)
    for prompt in prompts():
        with torch.inference_mode():
            ours = method.generate(prompt, MAX_NEW)
            reference = greedy.generate(prompt, MAX_NEW)
        assert ours.tokens == reference.tokens
        assert ours.layer_calls["sublayers_per_draft"] == 16 - len(method.skipped.attention) - len(method.skipped.mlp)
        assert ours.num_drafted >= ours.num_rounds - 1


def test_a_confidence_floor_shortens_the_drafts(deep_model):
    fixed = {"num_speculations": 6, "skip_layers": [2, 3, 4, 5]}
    drafted = {}
    for floor in (0.0, 0.99):
        method = build_method("swift", deep_model, {**fixed, "min_confidence": floor})
        with torch.inference_mode():
            results = [method.generate(p, MAX_NEW) for p in prompts()]
        drafted[floor] = sum(r.num_drafted for r in results) / sum(r.num_rounds for r in results)
    assert drafted[0.99] < drafted[0.0]


def test_swift_refuses_what_it_cannot_run(deep_model, tmp_path):
    with pytest.raises(ExitbenchError, match="no calibration text"):
        build_method("swift", deep_model, {"num_speculations": 2})
    with pytest.raises(ExitbenchError, match="skip_layers"):
        build_method("swift", deep_model, {"num_speculations": 2, "skip_layers": [8]})
    with pytest.raises(ExitbenchError, match="skip_attention/skip_mlp"):
        build_method("swift", deep_model, {"num_speculations": 2, "skip_attention": [-1]})
    with pytest.raises(ExitbenchError, match="skip_attention/skip_mlp"):
        build_method(
            "swift", deep_model, {"num_speculations": 2, "skip_attention": list(range(8)), "skip_mlp": list(range(8))}
        )
    with pytest.raises(ExitbenchError, match="not both"):
        build_method("swift", deep_model, {"num_speculations": 2, "skip_layers": [1], "skip_mlp": [2]})
    with pytest.raises(ExitbenchError, match="not found"):
        build_method("swift", deep_model, {"num_speculations": 2, "calibration_file": str(tmp_path / "none.json")})


@pytest.mark.parametrize(
    ("attention", "mlp"), [([1, 2, 3], [4, 5]), ([], [0, 7]), ([0, 7], []), (list(range(8)), list(range(7)))]
)
def test_a_fixed_sub_layer_set_equals_greedy(deep_model, attention, mlp):
    method = build_method("swift", deep_model, {"num_speculations": 3, "skip_attention": attention, "skip_mlp": mlp})
    greedy = build_method("autoregressive", deep_model)
    for prompt in prompts():
        with torch.inference_mode():
            assert method.generate(prompt, MAX_NEW).tokens == greedy.generate(prompt, MAX_NEW).tokens
