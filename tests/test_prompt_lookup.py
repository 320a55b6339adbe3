"""Prompt-lookup decoding, its transformers peer and self-speculation with lookup: the draft rule, exactness
against greedy decoding on the tiny seeded model (accept and reject paths), stop rules and bad options."""

from __future__ import annotations

import random

import pytest
import torch
from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

from exitbench.decoding import StopRule, build_method
from exitbench.decoding import prompt_lookup as pld
from exitbench.decoding import self_speculative_lookup as ssl
from exitbench.decoding.prompt_lookup import lookup_draft
from exitbench.errors import ExitbenchError
from tests.decoding_helpers import greedy_tokens, prompts

NUM_LAYERS = 4
MAX_NEW = 24

LOOKUP_METHODS = [
    ("prompt_lookup", {"ngram_size": 1, "num_speculations": 4}),
    ("prompt_lookup", {"ngram_size": 3, "num_speculations": 10}),
    ("hf_prompt_lookup", {"ngram_size": 1, "num_speculations": 4}),
    ("hf_prompt_lookup", {"ngram_size": 3, "num_speculations": 10}),
    ("self_speculative_lookup", {"exit_layer": 2, "num_speculations": 2, "ngram_size": 1}),
    ("self_speculative_lookup", {"exit_layer": 1, "num_speculations": 4, "ngram_size": 2, "lookup_speculations": 3}),
]


@pytest.fixture(scope="module")
def greedy_outputs(tiny_model):
    return greedy_tokens(tiny_model, MAX_NEW)


def test_lookup_takes_the_longest_ngram_and_its_leftmost_match():
    sequence = [1, 2, 3, 9, 2, 3, 7, 5, 2, 3]
    assert lookup_draft(sequence, 2, 3) == [9, 2, 3]  # "2 3" first occurs at 1, followed by 9 2 3
    assert lookup_draft(sequence, 3, 2) == [9, 2]  # "5 2 3" never occurred before: falls back to n = 2
    assert lookup_draft([4, 5, 6, 5], 1, 8) == [6, 5]  # the draft never runs past the sequence's end
    assert lookup_draft([4, 5, 6, 7], 3, 4) == []  # no earlier occurrence: the tail itself is no match
    assert lookup_draft([4, 5, 4], 2, 0) == []
    assert lookup_draft([8, 1, 2, 0, 5, 8], 1, 5, eos_token_ids={0}) == [1, 2]  # cut before an EOS


def test_lookup_drafts_what_transformers_drafts():
    """The rule of transformers' PromptLookupCandidateGenerator, on random sequences with many repeats."""
    rng = random.Random(3)
    for trial in range(300):
        sequence = [rng.randrange(6) for _ in range(rng.randrange(2, 40))]
        ngram, tokens = rng.randrange(1, 5), rng.randrange(1, 8)
        eos = {rng.randrange(6)} if trial % 2 else set()
        generator = PromptLookupCandidateGenerator(
            eos_token_id=torch.tensor(sorted(eos)) if eos else None,
            num_output_tokens=tokens,
            max_matching_ngram_size=ngram,
            max_length=10_000,
        )
        ids = torch.tensor([sequence])
        candidates, _ = generator.get_candidates(ids)
        expected = candidates[0, len(sequence) :].tolist()
        assert lookup_draft(sequence, ngram, tokens, eos) == expected, (sequence, ngram, tokens, eos)


@pytest.mark.parametrize(("name", "options"), LOOKUP_METHODS)
def test_lookup_methods_equal_greedy(tiny_model, greedy_outputs, name, options):
    method = build_method(name, tiny_model, options)
    for prompt, expected in zip(prompts(), greedy_outputs, strict=True):
        result = method.generate(prompt, MAX_NEW)
        assert result.tokens == expected
        assert result.num_accepted <= result.num_drafted
        assert sum(result.acceptance_histogram) == result.num_rounds
    assert method.exact


def _oracle(greedy_outputs, prompt_len: int, shift: int):
    """A lookup that drafts the greedy continuation itself (shift 0: all accepted) or a wrong one."""

    def draft(sequence, ngram_size, num_tokens, eos_token_ids=()):
        expected = next(g for p, g in zip(prompts(), greedy_outputs, strict=True) if len(p) == prompt_len)
        done = len(sequence) - prompt_len
        return [(token + shift) % 128 for token in expected[done : done + num_tokens]]

    return draft


@pytest.mark.parametrize("module", [pld, ssl])
@pytest.mark.parametrize("shift", [0, 1])
def test_accepted_and_rejected_lookups_stay_exact(tiny_model, greedy_outputs, monkeypatch, module, shift):
    prompt, expected = prompts()[1], greedy_outputs[1]
    monkeypatch.setattr(module, "lookup_draft", _oracle(greedy_outputs, len(prompt), shift))
    name = "prompt_lookup" if module is pld else "self_speculative_lookup"
    options = {"num_speculations": 3} if module is pld else {"exit_layer": 2, "num_speculations": 2,
                                                             "lookup_speculations": 3}
    result = build_method(name, tiny_model, options).generate(prompt, MAX_NEW)
    assert result.tokens == expected
    assert result.num_drafted > 0
    assert result.acceptance_rate == (1.0 if shift == 0 else 0.0)
    if module is ssl:  # every round found a (copied) draft: no early-exit round ran
        assert result.layer_calls["lookup_rounds"] >= result.num_rounds - 1  # the last may have no budget
        assert result.layer_calls["draft_forwards"] == 0
    if shift == 0:  # d accepted drafts + the model's own token per round: far fewer rounds than tokens
        assert result.num_rounds <= -(-(MAX_NEW - 1) // 4) + 1


def test_stop_rules_truncate_identically(tiny_model, greedy_outputs):
    prompt, expected = prompts()[2], greedy_outputs[2]
    eos = expected[6]
    stop = StopRule(eos_token_ids=frozenset({eos}))
    for name, options in LOOKUP_METHODS:
        assert build_method(name, tiny_model, options).generate(prompt, MAX_NEW, stop).tokens == expected[
            : expected.index(eos) + 1
        ]


@pytest.mark.parametrize("key", ["ngram_size", "num_speculations"])
@pytest.mark.parametrize("name", ["prompt_lookup", "hf_prompt_lookup"])
def test_bad_settings_are_one_line_errors(tiny_model, name, key):
    with pytest.raises(ExitbenchError, match=f"method '{name}': option '{key}': Input should be greater than"):
        build_method(name, tiny_model, {key: 0})


def test_the_combined_method_checks_its_lookup_settings(tiny_model):
    with pytest.raises(ExitbenchError, match="option 'lookup_speculations'"):
        build_method("self_speculative_lookup", tiny_model, {"exit_layer": 2, "num_speculations": 2,
                                                             "lookup_speculations": 0})
