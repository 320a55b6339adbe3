"""Golden tests: every exact method equals greedy decoding token for token on the tiny seeded model."""

from __future__ import annotations

import pytest
import torch

from exitbench.decoding import REGISTRY, StopRule, build_method
from exitbench.decoding.steps import new_cache_for, prefill
from exitbench.errors import ExitbenchError
from tests.decoding_helpers import greedy_tokens, prompts

NUM_LAYERS = 4
MAX_NEW = 24  # >= 2 * max d, so both accept and reject paths run


@pytest.fixture(scope="module")
def greedy_outputs(tiny_model):
    return greedy_tokens(tiny_model, MAX_NEW)


def test_autoregressive_matches_transformers_generate(tiny_model, tiny_lm, greedy_outputs):
    for prompt, ours in zip(prompts(), greedy_outputs, strict=True):
        ids = torch.tensor([prompt])
        ref = tiny_lm.generate(ids, max_new_tokens=MAX_NEW, do_sample=False, eos_token_id=None, pad_token_id=0)
        assert ours == ref[0, len(prompt) :].tolist()
    assert len({tuple(t) for t in greedy_outputs}) == len(greedy_outputs)
    assert all(len(set(t)) > 5 for t in greedy_outputs), "fixture degenerated into repeating one token"


@pytest.mark.parametrize("exit_layer", [1, NUM_LAYERS // 2, NUM_LAYERS - 1, NUM_LAYERS])
@pytest.mark.parametrize("num_speculations", [1, 2, 4, 8])
def test_self_speculative_equals_greedy(tiny_model, greedy_outputs, exit_layer, num_speculations):
    method = build_method(
        "self_speculative", tiny_model, {"exit_layer": exit_layer, "num_speculations": num_speculations}
    )
    for prompt, expected in zip(prompts(), greedy_outputs, strict=True):
        result = method.generate(prompt, MAX_NEW)
        assert result.tokens == expected
        assert result.num_accepted <= result.num_drafted
        assert sum(result.acceptance_histogram) == result.num_rounds


def test_self_speculative_accept_and_reject_regimes(tiny_model):
    prompt = prompts()[1]
    all_accept = build_method("self_speculative", tiny_model, {"exit_layer": NUM_LAYERS, "num_speculations": 4})
    result = all_accept.generate(prompt, MAX_NEW)
    assert result.acceptance_rate == 1.0
    mostly_reject = build_method("self_speculative", tiny_model, {"exit_layer": 1, "num_speculations": 4})
    result = mostly_reject.generate(prompt, MAX_NEW)
    assert result.acceptance_rate is not None and result.acceptance_rate < 0.5
    assert result.acceptance_histogram[0] > 0


def test_cache_length_after_every_crop_equals_accepted_length(tiny_model, monkeypatch):
    from exitbench.decoding import draft_verify as module

    method = build_method("self_speculative", tiny_model, {"exit_layer": 2, "num_speculations": 4})
    prompt = prompts()[0]
    seen: list[tuple[list[int], int]] = []
    original = module.verify

    def spy(model, round_, draft):
        new = original(model, round_, draft)
        seen.append((list(round_.cache.lengths), round_.position + len(new)))
        return new

    monkeypatch.setattr(module, "verify", spy)
    method.generate(prompt, MAX_NEW)
    assert seen
    for lengths, committed_minus_pending in seen:
        assert lengths == [committed_minus_pending] * NUM_LAYERS


def test_early_exit_at_last_layer_equals_greedy(tiny_model, greedy_outputs):
    method = build_method("early_exit", tiny_model, {"exit_layer": NUM_LAYERS})
    assert [method.generate(p, MAX_NEW).tokens for p in prompts()] == greedy_outputs


def test_early_exit_below_last_layer_uses_exit_logits(tiny_model):
    prompt = prompts()[0]
    method = build_method("early_exit", tiny_model, {"exit_layer": 1})
    first = method.generate(prompt, 1).tokens[0]
    with torch.inference_mode():
        cache = new_cache_for(tiny_model, len(prompt), 1)
        logits = prefill(tiny_model, cache, prompt, last_layer=1)
    assert first == int(logits[0, -1].argmax())


def test_stop_rule_truncates_identically(tiny_model, greedy_outputs):
    prompt, expected = prompts()[2], greedy_outputs[2]
    eos = expected[6]
    stop = StopRule(eos_token_ids=frozenset({eos}))
    cut = expected.index(eos) + 1
    for name, options in [("autoregressive", {}), ("self_speculative", {"exit_layer": 2, "num_speculations": 4})]:
        assert build_method(name, tiny_model, options).generate(prompt, MAX_NEW, stop).tokens == expected[:cut]


def test_stop_string_rule():
    decode = lambda ids: "".join(chr(97 + i % 26) for i in ids)  # noqa: E731
    stop = StopRule(stop_strings=("cd",), decode=decode)
    assert stop.cut([0, 1, 2, 3, 4]) == 4
    assert stop.cut([0, 1, 4]) is None


def test_unknown_method_and_bad_options_are_one_line_errors(tiny_model):
    with pytest.raises(ExitbenchError, match="unknown decoding method 'nope'; registered: "):
        build_method("nope", tiny_model)
    with pytest.raises(ExitbenchError, match="option 'num_speculations'"):
        build_method("self_speculative", tiny_model, {"exit_layer": 2})
    with pytest.raises(ExitbenchError, match=r"outside 1\.\.4"):
        build_method("early_exit", tiny_model, {"exit_layer": 9})
    assert {"autoregressive", "early_exit", "self_speculative"} <= set(REGISTRY)


def test_frequent_token_ids_is_deterministic_and_keeps_required_ids():
    from exitbench.subvocab import frequent_token_ids

    assert frequent_token_ids([[5, 5, 7, 9], [7, 5, 3]], 2, always=[2]) == [2, 5, 7]
    assert frequent_token_ids([[4, 3], [3, 4]], 1) == [3]  # a tie goes to the smaller id


def test_self_speculative_with_draft_subvocabulary_stays_exact(tiny_model, greedy_outputs, tmp_path):
    import json

    vocab = tmp_path / "vocab.json"
    vocab.write_text(json.dumps(list(range(0, 128, 2))))  # half the vocabulary: many drafts must be rejected
    options = {"exit_layer": 3, "num_speculations": 4, "draft_vocab_file": str(vocab)}
    method = build_method("self_speculative", tiny_model, options)
    results = [method.generate(p, MAX_NEW) for p in prompts()]
    assert [r.tokens for r in results] == greedy_outputs
    drafted_odd = any(t % 2 for r in results for t in r.tokens)
    assert drafted_odd, "the fixture should need tokens outside the sub-vocabulary"
    with pytest.raises(ExitbenchError, match="draft_vocab_file"):
        build_method(
            "self_speculative", tiny_model, {**options, "draft_vocab_file": str(tmp_path / "no.json")}
        ).generate(prompts()[0], 4)


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 9])
def test_project_equals_linear_for_every_row_count(rows):
    from exitbench.models.view import SKINNY_ROWS, project

    gen = torch.Generator().manual_seed(rows)
    weight, bias = torch.randn(48, 32, generator=gen), torch.randn(48, generator=gen)
    x = torch.randn(1, rows, 32, generator=gen)
    with torch.inference_mode():
        got = project(x, weight, bias, skinny_rows=SKINNY_ROWS)
    assert got.shape == (1, rows, 48)
    torch.testing.assert_close(got, torch.nn.functional.linear(x, weight, bias), rtol=1e-5, atol=1e-5)


def test_project_keeps_autograd_on_linear():
    from exitbench.models.view import project

    weight = torch.randn(8, 4, requires_grad=True)
    project(torch.randn(1, 1, 4), weight, skinny_rows=4).sum().backward()
    assert weight.grad is not None and weight.grad.shape == (8, 4)


def test_the_projection_path_is_measured_and_only_float32_cpu_is_a_candidate():
    from exitbench.models.view import SKINNY_ROWS, choose_skinny_rows

    rows, timings = choose_skinny_rows(torch.randn(64, 32), repeats=3)
    assert rows in (0, SKINNY_ROWS) and set(timings) == {"transposed_us", "linear_us"}
    faster, slower = ("transposed_us", "linear_us") if rows else ("linear_us", "transposed_us")
    assert timings[faster] <= timings[slower]  # the faster form was chosen (timings are rounded)
    assert choose_skinny_rows(torch.randn(64, 32, dtype=torch.bfloat16)) == (0, {})


def test_the_projection_choice_is_made_once_per_shape_and_thread_count(monkeypatch):
    """Same-shaped models loaded by one stage take one path, whatever a later measurement would say."""
    from exitbench.models import view

    monkeypatch.setattr(view, "_PROJECTION_CHOICES", {})
    first = view.choose_skinny_rows(torch.randn(48, 24), repeats=3)
    calls = []
    monkeypatch.setattr(view, "project", lambda *a, **k: calls.append(a))
    assert view.choose_skinny_rows(torch.randn(48, 24), repeats=3) == first and not calls  # reused, not re-timed
    view.choose_skinny_rows(torch.randn(40, 24), repeats=3)  # another shape is measured
    assert len(calls) == 3 + 20  # its repeats and its warm-up calls of the transposed form


def test_the_view_records_its_projection_choice(tiny_model):
    assert tiny_model.projection["skinny_rows"] == tiny_model.skinny_rows
    assert "linear_us" in tiny_model.projection


@pytest.mark.parametrize("min_confidence", [0.02, 0.2, 0.6, 0.99])
@pytest.mark.parametrize("exit_layer", [1, 3])
def test_adaptive_self_speculative_equals_greedy_and_drafts_less_when_unsure(
    tiny_model, greedy_outputs, exit_layer, min_confidence, monkeypatch
):
    from exitbench.decoding import self_speculative as module

    calls = []
    counted = module.draft_hidden
    monkeypatch.setattr(module, "draft_hidden", lambda *a, **k: calls.append(1) or counted(*a, **k))
    options = {"exit_layer": exit_layer, "num_speculations": 4}
    fixed = build_method("self_speculative", tiny_model, options)
    adaptive = build_method("adaptive_self_speculative", tiny_model, {**options, "min_confidence": min_confidence})
    for prompt, expected in zip(prompts(), greedy_outputs, strict=True):
        theirs = fixed.generate(prompt, MAX_NEW)
        calls.clear()
        ours = adaptive.generate(prompt, MAX_NEW)
        assert ours.tokens == expected
        assert ours.num_drafted <= theirs.num_drafted and ours.num_accepted <= ours.num_drafted
        assert sum(ours.acceptance_histogram) == ours.num_rounds
        # one forward of layers 0..E-1 per kept draft and one per round (the token verification starts from)
        assert len(calls) == ours.layer_calls["draft_forwards"] == ours.num_drafted + ours.num_rounds
        assert ours.layer_calls["draft_forwards"] <= theirs.layer_calls["draft_forwards"]
    if min_confidence == 0.99:  # a random tiny model is never that sure: every round is one full step
        assert ours.num_drafted == 0 and ours.num_rounds == len(ours.tokens) - 1


def test_adaptive_self_speculative_with_a_draft_subvocabulary_stays_exact(tiny_model, greedy_outputs, tmp_path):
    import json

    vocab = tmp_path / "vocab.json"
    vocab.write_text(json.dumps(list(range(0, 128, 2))))
    options = {"exit_layer": 3, "num_speculations": 4, "min_confidence": 0.05, "draft_vocab_file": str(vocab)}
    method = build_method("adaptive_self_speculative", tiny_model, options)
    results = [method.generate(p, MAX_NEW) for p in prompts()]
    assert [r.tokens for r in results] == greedy_outputs
    assert sum(r.num_drafted for r in results) > 0


@pytest.mark.parametrize("bad", [0.0, 1.0, -0.1])
def test_adaptive_self_speculative_rejects_a_confidence_outside_0_1(tiny_model, bad):
    with pytest.raises(ExitbenchError, match="min_confidence"):
        build_method(
            "adaptive_self_speculative", tiny_model, {"exit_layer": 2, "num_speculations": 4, "min_confidence": bad}
        )
