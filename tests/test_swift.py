"""SWIFT: its layer-set search (matchness, the search's rules) and its exactness, on the tiny seeded models."""

from __future__ import annotations

import json

import pytest
import torch

from exitbench.decoding import build_method
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
    assert matchness(deep_model, contexts, list(range(deep_model.num_layers))) == 1.0
    # scoring leaves each context's cache as it was: the same set scores the same twice
    kept = [0, 2, 4, 7]
    assert matchness(deep_model, contexts, kept) == matchness(deep_model, contexts, kept)


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
            assert matchness(deep_model, contexts, list(range(depth))) == pytest.approx(agree / 32), depth
            fractions.append(agree / 32)
    assert any(0 < f < 1 for f in fractions)  # cases that can tell a wrong count from a right one


def test_search_keeps_first_and_last_layers_and_never_ends_worse_than_it_started(deep_model):
    contexts = build_contexts(deep_model, texts(), window=8)
    opts = SwiftOptions(num_speculations=4, max_opt_iter=12, bayes_interval=4, skip_ratio=0.5)
    result = search_skip_set(deep_model, contexts, opts)
    assert len(result.skipped) == int(0.5 * 6)
    assert set(result.skipped) <= set(range(1, 7))
    assert result.matchness >= result.initial_matchness
    kept = [layer for layer in range(8) if layer not in result.skipped]
    assert result.matchness == matchness(deep_model, contexts, kept)
    assert 1 <= result.iterations <= 12
    again = search_skip_set(deep_model, contexts, opts)  # seeded: the same proposals, the same set
    assert again.skipped == result.skipped and again.iterations == result.iterations


def test_search_stops_at_the_score_it_was_asked_for(deep_model):
    contexts = build_contexts(deep_model, texts(), window=8)
    result = search_skip_set(deep_model, contexts, SwiftOptions(num_speculations=1, max_score=0.01, max_opt_iter=50))
    assert result.stopped_because == "max_score" and result.iterations < 50 and result.matchness > 0.01


@pytest.mark.parametrize("confidence", [0.0, 0.8])
def test_swift_with_its_searched_set_equals_greedy(deep_model, calibration, confidence):
    options = {
        "num_speculations": 4,
        "calibration_file": calibration,
        "max_opt_iter": 8,
        "bayes_interval": 3,
        "min_confidence": confidence,
    }
    method = build_method("swift", deep_model, options)
    summary = method.calibration_summary()
    assert summary["skipped_layers"] == method.skipped and summary["iterations"] >= 1
    greedy = build_method("autoregressive", deep_model)
    for prompt in prompts():
        with torch.inference_mode():
            ours = method.generate(prompt, MAX_NEW)
            reference = greedy.generate(prompt, MAX_NEW)
        assert ours.tokens == reference.tokens
        assert ours.layer_calls["layers_per_draft"] == 8 - len(method.skipped)
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
    with pytest.raises(ExitbenchError, match="not found"):
        build_method("swift", deep_model, {"num_speculations": 2, "calibration_file": str(tmp_path / "none.json")})
