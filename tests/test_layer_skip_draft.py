"""layer_skip_draft (Draft & Verify's skipped-layer draft): exact against greedy on the tiny seeded model, the
draft runs only the kept layers, verification every layer, and bad skip sets are one-line errors."""

from __future__ import annotations

import pytest

from exitbench.decoding import build_method
from exitbench.errors import ExitbenchError
from tests.decoding_helpers import greedy_tokens, prompts
from tests.test_decoding import NUM_LAYERS

MAX_NEW = 24  # >= 2 * max d: rounds with accepted and with rejected drafts both run


@pytest.fixture(scope="module")
def greedy_outputs(tiny_model):
    return greedy_tokens(tiny_model, MAX_NEW)


@pytest.mark.parametrize("skip_layers", [[0], [1], [NUM_LAYERS - 1], [1, 2], list(range(1, NUM_LAYERS))])
@pytest.mark.parametrize("num_speculations", [1, 2, 4, 8])
def test_layer_skip_draft_equals_greedy(tiny_model, greedy_outputs, skip_layers, num_speculations):
    method = build_method(
        "layer_skip_draft", tiny_model, {"skip_layers": skip_layers, "num_speculations": num_speculations}
    )
    for prompt, expected in zip(prompts(), greedy_outputs, strict=True):
        result = method.generate(prompt, MAX_NEW)
        assert result.tokens == expected
        assert sum(result.acceptance_histogram) == result.num_rounds
        assert result.num_accepted <= result.num_drafted


def test_a_one_layer_skip_accepts_some_drafts_and_rejects_others(tiny_model):
    method = build_method("layer_skip_draft", tiny_model, {"skip_layers": [NUM_LAYERS // 2], "num_speculations": 4})
    results = [method.generate(p, MAX_NEW) for p in prompts()]
    accepted, drafted = sum(r.num_accepted for r in results), sum(r.num_drafted for r in results)
    assert 0 < accepted < drafted  # both branches of verification ran


def test_drafts_run_the_kept_layers_and_verification_all(tiny_model, monkeypatch):
    skip = [1, 2]
    method = build_method("layer_skip_draft", tiny_model, {"skip_layers": skip, "num_speculations": 3})
    phase = ["prefill"]
    calls: dict[str, list[int]] = {"prefill": [], "draft": [], "verify": []}
    from exitbench.decoding.layer_skip_draft import SkippingProposer

    attention_block, draft = tiny_model.attention_block, SkippingProposer.draft_logits

    def spy_layer(index, *args, **kwargs):  # every layer that runs runs its attention sub-layer
        calls[phase[0]].append(index)
        return attention_block(index, *args, **kwargs)

    def spy_draft(*args):
        phase[0] = "draft"
        logits = draft(*args)
        phase[0] = "verify"  # whatever runs next until the next draft: the verification forward
        return logits

    monkeypatch.setattr(tiny_model, "attention_block", spy_layer)
    monkeypatch.setattr(SkippingProposer, "draft_logits", spy_draft)
    result = method.generate(prompts()[1], MAX_NEW)
    kept = [layer for layer in range(NUM_LAYERS) if layer not in skip]
    assert calls["draft"] == kept * result.layer_calls["draft_forwards"]
    assert calls["verify"] and set(calls["verify"]) == set(range(NUM_LAYERS))  # verification runs every layer


@pytest.mark.parametrize("skip_layers", [[NUM_LAYERS], [-1], list(range(NUM_LAYERS))])
def test_skip_layers_outside_the_model_or_every_layer_are_one_line_errors(tiny_model, skip_layers):
    with pytest.raises(ExitbenchError, match=r"layer_skip_draft: skip_layers .* set skip_layers within") as err:
        build_method("layer_skip_draft", tiny_model, {"skip_layers": skip_layers, "num_speculations": 2})
    assert "\n" not in str(err.value)
