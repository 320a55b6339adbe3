"""Golden tests for the peers: two-model speculative decoding and transformers' early-exit generation
both equal greedy decoding token for token on the tiny seeded model."""

from __future__ import annotations

import pytest

from exitbench.decoding import StopRule, build_method
from exitbench.errors import ExitbenchError
from exitbench.models.tiny import random_llama
from exitbench.models.view import EarlyExitModel
from tests.decoding_helpers import greedy_tokens, prompts

NUM_LAYERS = 4
MAX_NEW = 20  # >= 2 * max d (8), so accept and reject paths both run


@pytest.fixture(scope="module")
def greedy_outputs(tiny_model):
    return greedy_tokens(tiny_model, MAX_NEW)


@pytest.fixture(scope="module")
def random_draft() -> EarlyExitModel:
    """An unrelated 2-layer model with the same vocabulary: its drafts are mostly rejected."""
    return EarlyExitModel(random_llama(seed=1, num_layers=2))


@pytest.mark.parametrize("num_speculations", [1, 2, 4, 8])
@pytest.mark.parametrize("draft", ["self", "random"])
def test_speculative_equals_greedy(tiny_model, random_draft, greedy_outputs, num_speculations, draft):
    draft_model = tiny_model if draft == "self" else random_draft
    method = build_method("speculative", tiny_model, {"num_speculations": num_speculations}, draft_model=draft_model)
    for prompt, expected in zip(prompts(), greedy_outputs, strict=True):
        result = method.generate(prompt, MAX_NEW)
        assert result.tokens == expected
        assert result.num_accepted <= result.num_drafted
        assert sum(result.acceptance_histogram) == result.num_rounds
        if draft == "self":  # the draft is the main model: every draft is accepted
            assert result.acceptance_rate == 1.0
        else:
            assert result.acceptance_rate is not None and result.acceptance_rate < 0.5
            assert result.acceptance_histogram[0] > 0


def test_speculative_cache_lengths_after_crops(tiny_model, random_draft, monkeypatch):
    from exitbench.decoding import speculative as module

    seen: list[tuple[list[int], list[int], int, int, int]] = []
    original = module.DraftModelProposer.settle

    def spy(self, round_, draft, committed):
        original(self, round_, draft, committed)  # the main cache was cropped by the verification, the draft's now
        committed_minus_pending = round_.position + len(committed)
        seen.append((list(round_.cache.lengths), list(self.cache.lengths), committed_minus_pending, len(committed) - 1,
                     len(draft.tokens)))

    monkeypatch.setattr(module.DraftModelProposer, "settle", spy)
    for draft in (tiny_model, random_draft):
        seen.clear()
        build_method("speculative", tiny_model, {"num_speculations": 4}, draft_model=draft).generate(prompts()[0], 24)
        assert seen
        for main_lengths, draft_lengths, committed_minus_pending, accepted, drafted in seen:
            # The main cache holds every committed token but the newest (read next round).
            assert main_lengths == [committed_minus_pending] * NUM_LAYERS
            # The draft cache holds the accepted tokens it has read: all but the last draft if all were
            # accepted. (A last round without budget drafts nothing, and the draft reads nothing.)
            if drafted:
                lag = 1 if accepted == drafted else 0
                assert draft_lengths == [committed_minus_pending - lag] * draft.num_layers
            assert max(draft_lengths) <= committed_minus_pending
        assert any(drafted and accepted < drafted for _, _, _, accepted, drafted in seen) == (draft is random_draft)


def test_speculative_without_draft_model_is_a_one_line_error(tiny_model):
    method = build_method("speculative", tiny_model, {"num_speculations": 2})
    with pytest.raises(ExitbenchError, match="no draft model"):
        method.generate(prompts()[0], 4)
    other_vocab = EarlyExitModel(random_llama(seed=2, num_layers=1, vocab_size=64))
    method = build_method("speculative", tiny_model, {"num_speculations": 2}, draft_model=other_vocab)
    with pytest.raises(ExitbenchError, match="vocabulary"):
        method.generate(prompts()[0], 4)


@pytest.mark.parametrize("exit_layer", [1, 2, 3, 4])
@pytest.mark.parametrize("num_speculations", [1, 2, 4])
def test_hf_early_exit_equals_greedy(tiny_model, greedy_outputs, exit_layer, num_speculations):
    method = build_method("hf_early_exit", tiny_model, {"exit_layer": exit_layer, "num_speculations": num_speculations})
    config_before = tiny_model.hf.generation_config.to_dict()
    for prompt, expected in zip(prompts(), greedy_outputs, strict=True):
        result = method.generate(prompt, MAX_NEW)
        assert result.tokens == expected
        assert 0 < result.num_drafted <= num_speculations * result.num_rounds
        assert result.num_accepted <= result.num_drafted
        if exit_layer == NUM_LAYERS:  # drafting with every layer: all drafts accepted
            assert result.acceptance_rate == 1.0
    # The shared generation config and the model's methods are left as they were.
    assert tiny_model.hf.generation_config.to_dict() == config_before
    assert "_get_candidate_generator" not in vars(tiny_model.hf)


def test_hf_early_exit_drafts_exactly_d_tokens(tiny_model):
    """transformers ignores generate(num_assistant_tokens=...); the wrapper must still draft d per round."""
    method = build_method("hf_early_exit", tiny_model, {"exit_layer": NUM_LAYERS, "num_speculations": 3})
    result = method.generate(prompts()[1], 13)  # 3 rounds of 3 drafts + 1, then one step without drafts
    assert result.acceptance_histogram == [1, 0, 0, 3]  # the last round drafts nothing: a plain greedy step
    assert result.num_rounds == 4 and result.num_drafted == 9


def test_hf_early_exit_stop_rule_truncates_identically(tiny_model, greedy_outputs):
    prompt, expected = prompts()[2], greedy_outputs[2]
    eos = expected[6]
    cut = expected.index(eos) + 1
    stop = StopRule(eos_token_ids=frozenset({eos}))
    peers = [("hf_early_exit", {"exit_layer": 2, "num_speculations": 4}), ("speculative", {"num_speculations": 4})]
    for name, options in peers:
        method = build_method(name, tiny_model, options, draft_model=tiny_model)
        assert method.generate(prompt, MAX_NEW, stop).tokens == expected[:cut]
    decode = lambda ids: " ".join(str(i) for i in ids)  # noqa: E731
    marker = StopRule(stop_strings=(f" {expected[4]} ",), decode=decode)
    reference = build_method("autoregressive", tiny_model).generate(prompt, MAX_NEW, marker).tokens
    assert len(reference) < MAX_NEW
    hf = build_method("hf_early_exit", tiny_model, {"exit_layer": 2, "num_speculations": 2})
    assert hf.generate(prompt, MAX_NEW, marker).tokens == reference
