"""CALM decoding on the tiny seeded model: equalities that must hold, KV-hole strategies, measures, classifier."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from exitbench.calibration import decaying_threshold
from exitbench.confidence import (
    classifier_confidence,
    classifier_loss,
    collect_classifier_data,
    load_exit_classifier,
    oracle_labels,
    save_exit_classifier,
    softmax_response,
    state_saturation,
    train_exit_classifier,
)
from exitbench.decoding import build_method
from exitbench.decoding import calm as calm_module
from exitbench.decoding.calm import candidate_layers, step_threshold
from exitbench.decoding.steps import draft_hidden, greedy, new_cache_for, prefill, prefill_prompt
from exitbench.errors import ExitbenchError

NUM_LAYERS = 4
MAX_NEW = 24
STRATEGIES = ["propagate", "recompute", "monotonic"]


def prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(7)
    return [torch.randint(3, 128, (n,), generator=gen).tolist() for n in (5, 12, 17)]


@pytest.fixture(scope="module")
def greedy_outputs(tiny_model):
    method = build_method("autoregressive", tiny_model)
    return [method.generate(p, MAX_NEW).tokens for p in prompts()]


def capture_cache(monkeypatch) -> list:
    """Record the KV cache each CALM generation allocates."""
    seen: list = []
    original = calm_module.new_cache_for

    def spy(model, prompt_len, max_new_tokens, slack=16):
        cache = original(model, prompt_len, max_new_tokens, slack)
        seen.append(cache)
        return cache

    monkeypatch.setattr(calm_module, "new_cache_for", spy)
    return seen


# ------------------------------------------------------------------------------------------ equalities


@pytest.mark.parametrize("kv_strategy", STRATEGIES)
@pytest.mark.parametrize("measure", ["softmax", "state"])
def test_infinite_threshold_equals_greedy(tiny_model, greedy_outputs, kv_strategy, measure):
    method = build_method("calm", tiny_model, {"threshold": math.inf, "measure": measure, "kv_strategy": kv_strategy})
    for prompt, expected in zip(prompts(), greedy_outputs, strict=True):
        result = method.generate(prompt, MAX_NEW)
        assert result.tokens == expected
        assert result.exit_layers == [NUM_LAYERS] * len(expected)
        assert result.layer_calls["confidence_evaluations"] == 0
        assert result.layer_calls["token_layers"] == NUM_LAYERS * (len(expected) - 1)


def static_exit_on_full_prefill(model, prompt: list[int], exit_layer: int, max_new: int) -> list[int]:
    """Static early exit at ``exit_layer`` after a full prefill (CALM's prefill): the reference for calm."""
    with torch.inference_mode():
        cache = new_cache_for(model, len(prompt), max_new)
        tokens = [greedy(prefill(model, cache, prompt))]
        while len(tokens) < max_new:
            hidden = draft_hidden(model, cache, [tokens[-1]], len(prompt) + len(tokens) - 1, exit_layer)
            tokens.append(greedy(model.logits(hidden)))
    return tokens


@pytest.mark.parametrize("kv_strategy", STRATEGIES)
@pytest.mark.parametrize("exit_layer", [1, 2, NUM_LAYERS])
def test_always_exiting_at_one_layer_equals_static_early_exit(tiny_model, kv_strategy, exit_layer):
    # threshold 0 with a huge tau: lambda'(t) = 0 for t >= 1, and a softmax response is > 0 barring exact ties.
    options = {
        "threshold": 0.0, "tau": 1e6, "min_exit_layer": exit_layer, "exit_every": 100, "kv_strategy": kv_strategy,
    }
    method = build_method("calm", tiny_model, options)
    static = build_method("early_exit", tiny_model, {"exit_layer": exit_layer})
    for prompt in prompts():
        result = method.generate(prompt, MAX_NEW)
        assert result.exit_layers == [NUM_LAYERS] + [exit_layer] * (MAX_NEW - 1)
        assert result.tokens == static_exit_on_full_prefill(tiny_model, prompt, exit_layer, MAX_NEW)
        # The prompt's K/V in layers < exit_layer do not depend on deeper layers, so after the first token
        # (the full model's with calm, layer exit_layer's with static early exit) both continue identically.
        reference = static.generate(prompt, MAX_NEW).tokens
        if reference[0] == result.tokens[0]:
            assert reference == result.tokens


# ---------------------------------------------------------------------------------------- shared prefill


def test_shared_prefill_gives_the_same_outputs_for_greedy_and_every_kv_strategy(tiny_model):
    """One prefill per prompt, continued by greedy and every calm setting, equals each method's own prefill."""
    settings = [{"threshold": t, "kv_strategy": k, "measure": m} for t in (0.0, 0.3, 0.6, math.inf)
                for k in STRATEGIES for m in ("softmax", "state")]
    methods = [build_method("autoregressive", tiny_model)] + [build_method("calm", tiny_model, o) for o in settings]
    exited = 0
    for prompt in prompts():
        shared = prefill_prompt(tiny_model, prompt, MAX_NEW)
        keys, lengths = shared.cache.keys.clone(), list(shared.cache.lengths)
        for method in methods:
            normal = method.generate(prompt, MAX_NEW)
            continued = method.generate_from_prefill(shared, MAX_NEW)
            assert continued.tokens == normal.tokens and continued.exit_layers == normal.exit_layers
            assert continued.layer_calls == normal.layer_calls
            assert continued.prefill_time_s == 0.0 and normal.prefill_time_s > 0.0
            exited += sum(layer < NUM_LAYERS for layer in continued.exit_layers)
        assert shared.first_token == normal.tokens[0]
        assert torch.equal(shared.cache.keys, keys) and shared.cache.lengths == lengths  # never written
    assert exited > 0, "no token exited early: the check exercised nothing"


def test_cloned_cache_is_independent(tiny_model):
    shared = prefill_prompt(tiny_model, prompts()[0], 4)
    copy = shared.cache.clone()
    assert copy.capacity == shared.cache.capacity and copy.lengths == shared.cache.lengths
    copy.crop(1)
    copy.keys.zero_()
    assert shared.cache.lengths == [5] * NUM_LAYERS and shared.cache.keys.abs().sum() > 0


# --------------------------------------------------------------------------------------- KV strategies


def full_model_cache(model, tokens: list[int]):
    with torch.inference_mode():
        cache = model.new_cache(len(tokens))
        prefill(model, cache, tokens)
    return cache


def cache_matches_full_model(cache, reference, tol: float = 1e-4) -> bool:
    """Cached K/V equal the full model's at every cached position, up to float32 rounding.

    One-token-at-a-time vs whole-sequence matmuls round differently: even greedy decoding's own cache
    differs from a prefill of the same tokens by ~1e-5 in the deepest layer of the tiny model (keys up
    to ~6), so the tolerance is 1e-4; state propagation's K/V differ by ~1 (see the next test).
    """
    for layer, length in enumerate(cache.lengths):
        keys, values = cache.layer_view(layer)
        ref_keys, ref_values = reference.keys[layer, :, :, :length], reference.values[layer, :, :, :length]
        same_keys = torch.allclose(keys, ref_keys, rtol=tol, atol=tol)
        if not (same_keys and torch.allclose(values, ref_values, rtol=tol, atol=tol)):
            return False
    return True


@pytest.mark.parametrize("threshold", [0.0, 0.2, 0.5])
@pytest.mark.parametrize("measure", ["softmax", "state"])
def test_recompute_leaves_the_full_models_cache(tiny_model, monkeypatch, threshold, measure):
    caches = capture_cache(monkeypatch)
    method = build_method("calm", tiny_model, {"threshold": threshold, "measure": measure, "kv_strategy": "recompute"})
    recomputed = 0
    for prompt in prompts():
        result = method.generate(prompt, MAX_NEW)
        cache = caches[-1]
        processed = prompt + result.tokens[:-1]  # the last token is never fed back
        assert max(cache.lengths) == len(processed)
        assert min(cache.lengths) >= len(prompt)
        assert cache_matches_full_model(cache, full_model_cache(tiny_model, processed))
        recomputed += result.layer_calls["recomputed_token_layers"]
    assert recomputed > 0, "no token ever recomputed a hole: the test exercised nothing"


def test_propagated_cache_differs_from_the_full_models(tiny_model, monkeypatch):
    """The check above has teeth: state propagation leaves K/V that are not the full model's."""
    caches = capture_cache(monkeypatch)
    method = build_method("calm", tiny_model, {"threshold": 0.2, "kv_strategy": "propagate"})
    prompt = prompts()[1]
    result = method.generate(prompt, MAX_NEW)
    cache = caches[-1]
    assert any(layer < NUM_LAYERS for layer in result.exit_layers)
    assert cache.lengths == [len(prompt) + len(result.tokens) - 1] * NUM_LAYERS  # no holes left
    assert not cache_matches_full_model(cache, full_model_cache(tiny_model, prompt + result.tokens[:-1]))


def test_recompute_counts_extra_work_and_keeps_a_suffix_of_holes(tiny_model, monkeypatch):
    caches = capture_cache(monkeypatch)
    method = build_method("calm", tiny_model, {"threshold": 0.0, "kv_strategy": "recompute"})
    result = method.generate(prompts()[0], MAX_NEW)
    lengths = caches[-1].lengths
    assert lengths == sorted(lengths, reverse=True)  # deeper layers hold no more than shallower ones
    calls = result.layer_calls
    assert calls["token_layers"] == sum(result.exit_layers[1:])
    assert calls["kv_only_token_layers"] == 0


def test_monotonic_exits_never_decrease(tiny_model, monkeypatch):
    caches = capture_cache(monkeypatch)
    method = build_method("calm", tiny_model, {"threshold": 0.0, "measure": "state", "kv_strategy": "monotonic"})
    for prompt in prompts():
        result = method.generate(prompt, MAX_NEW)
        decoded = result.exit_layers[1:]
        assert decoded == sorted(decoded)
        assert min(decoded) < NUM_LAYERS
        # Holes were filled up to the deepest exit; deeper layers were never read nor written.
        deepest = max(decoded)
        processed = len(prompt) + len(result.tokens) - 1
        assert caches[-1].lengths[:deepest] == [processed] * deepest


def test_propagate_fills_every_hole(tiny_model):
    method = build_method("calm", tiny_model, {"threshold": 0.0, "kv_strategy": "propagate"})
    result = method.generate(prompts()[2], MAX_NEW)
    skipped = sum(NUM_LAYERS - layer for layer in result.exit_layers[1:])
    assert result.layer_calls["kv_only_token_layers"] == skipped > 0


# ------------------------------------------------------------------------------------ threshold and rule


def test_candidate_layers():
    assert candidate_layers(8, 2, 3) == {2, 5, 8}
    assert candidate_layers(8, 9, 1) == {8}
    assert candidate_layers(4, 1, 1) == {1, 2, 3, 4}


def test_step_threshold_decays_and_one_means_never():
    values = [step_threshold(0.5, t, 20, 4.0) for t in range(21)]
    assert values[0] == pytest.approx(0.55)
    assert all(a > b for a, b in itertools.pairwise(values))
    assert values[-1] == pytest.approx(0.45 + 0.1 * math.exp(-4.0))
    assert values == [decaying_threshold(0.5, t, 20, 4.0) for t in range(21)]
    assert step_threshold(1.0, 5, 20, 4.0) == math.inf
    assert step_threshold(math.inf, 5, 20, 4.0) == math.inf


def test_generation_follows_the_decaying_threshold(tiny_model, monkeypatch):
    """With a constant confidence c, token t exits at the first candidate iff c > 0.9 lam + 0.1 exp(-tau t / N)."""
    monkeypatch.setattr(calm_module.Confidence, "__call__", lambda self, hidden, previous: (0.5, None))
    lam, tau = 0.5, 4.0
    method = build_method("calm", tiny_model, {"threshold": lam, "tau": tau, "min_exit_layer": 2})
    result = method.generate(prompts()[0], MAX_NEW)
    expected = [NUM_LAYERS] + [
        2 if 0.5 > decaying_threshold(lam, t, MAX_NEW, tau) else NUM_LAYERS for t in range(1, MAX_NEW)
    ]
    assert result.exit_layers == expected
    assert NUM_LAYERS in expected[1:] and 2 in expected  # the crossing happens mid-sequence


def test_stop_rule_cuts_calm_like_greedy(tiny_model, greedy_outputs):
    from exitbench.decoding import StopRule

    prompt, expected = prompts()[2], greedy_outputs[2]
    eos = expected[6]
    cut = expected.index(eos) + 1
    method = build_method("calm", tiny_model, {"threshold": math.inf, "kv_strategy": "recompute"})
    result = method.generate(prompt, MAX_NEW, StopRule(eos_token_ids=frozenset({eos})))
    assert result.tokens == expected[:cut]
    assert len(result.exit_layers) == cut


def test_bad_options_are_one_line_errors(tiny_model, tmp_path):
    with pytest.raises(ExitbenchError, match="option 'threshold'"):
        build_method("calm", tiny_model, {"threshold": -0.1})
    with pytest.raises(ExitbenchError, match="option 'kv_strategy'"):
        build_method("calm", tiny_model, {"threshold": 0.5, "kv_strategy": "lazy"})
    with pytest.raises(ExitbenchError, match="needs option 'classifier_file'"):
        build_method("calm", tiny_model, {"threshold": 0.5, "measure": "classifier"})
    with pytest.raises(ExitbenchError, match="exit classifier not found"):
        build_method("calm", tiny_model, {"threshold": 0.5, "measure": "classifier", "classifier_file": "nope.pt"})


# ------------------------------------------------------------------------------------------- measures


def test_softmax_response_on_hand_made_logits():
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.1], [1 / 3, 1 / 3, 1 / 3], [1.0, 1e-9, 1e-9]]))
    assert softmax_response(logits).tolist() == pytest.approx([0.5, 0.0, 1.0], abs=1e-6)
    assert softmax_response(torch.tensor([2.0, 0.0, 2.0])).item() == pytest.approx(0.0)


def test_state_saturation_on_hand_made_states():
    h = torch.tensor([[1.0, 2.0, 3.0]])
    assert state_saturation(h, 2 * h).item() == pytest.approx(1.0)
    assert state_saturation(h, -h).item() == pytest.approx(-1.0)
    assert state_saturation(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 5.0])).item() == pytest.approx(0.0)


def test_classifier_confidence_and_oracle_labels():
    features = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    weight, bias = torch.tensor([2.0, -2.0]), torch.tensor(0.0)
    conf = classifier_confidence(features, weight, bias)
    assert conf.tolist() == pytest.approx([1 / (1 + math.exp(-2)), 1 / (1 + math.exp(2))])
    assert classifier_confidence(features, torch.zeros(2), torch.tensor(0.0)).tolist() == [0.5, 0.5]
    layer = torch.tensor([[0.1, 0.9], [0.8, 0.2]])
    final = torch.tensor([[0.0, 1.0], [0.0, 1.0]])
    assert oracle_labels(layer, final).tolist() == [1.0, 0.0]


def test_classifier_training_lowers_its_loss_and_drives_calm(tiny_model, tmp_path):
    sequences = [p * 2 for p in prompts()]
    layers = [1, 2, 3]
    features, labels = collect_classifier_data(tiny_model, sequences, layers)
    assert features.shape == (3, sum(len(s) for s in sequences), 64) and labels.shape == features.shape[:2]
    assert (labels >= 0).all() and (labels <= 1).all()
    untrained = train_exit_classifier(tiny_model, sequences, layers, steps=1, lr=1e-9, seed=0)
    trained = train_exit_classifier(tiny_model, sequences, layers, steps=200, lr=0.05, seed=0)
    before = classifier_loss(untrained["weight"], untrained["bias"], features, labels)
    after = classifier_loss(trained["weight"], trained["bias"], features, labels)
    assert after < before
    again = train_exit_classifier(tiny_model, sequences, layers, steps=200, lr=0.05, seed=0)
    assert torch.equal(trained["weight"], again["weight"])  # seeded

    path = save_exit_classifier(trained, tmp_path / "clf.pt")
    loaded = load_exit_classifier(path, hidden_size=64)
    assert torch.equal(loaded["weight"], trained["weight"]) and loaded["layers"].tolist() == layers
    with pytest.raises(ExitbenchError, match="hidden size is 32"):
        load_exit_classifier(path, hidden_size=32)
    (tmp_path / "junk.pt").write_text("not a checkpoint")
    with pytest.raises(ExitbenchError, match="not a readable exit classifier"):
        load_exit_classifier(tmp_path / "junk.pt")

    options = {"threshold": 0.3, "measure": "classifier", "classifier_file": str(path), "kv_strategy": "recompute"}
    result = build_method("calm", tiny_model, options).generate(prompts()[0], MAX_NEW)
    assert len(result.tokens) == MAX_NEW and result.layer_calls["confidence_evaluations"] > 0
    with pytest.raises(ExitbenchError, match=r"subset of 1\.\.4"):
        train_exit_classifier(tiny_model, sequences, [0, 5])
