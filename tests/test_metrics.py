"""ROUGE, TOPv2 exact match and pass@k against hand-checked values and closed forms."""

from __future__ import annotations

import math

import pytest

from exitbench.errors import ExitbenchError
from exitbench.tasks.metrics import (
    exact_match,
    mean_rouge,
    normalize_parse,
    pass_at_k,
    rouge_scores,
    split_sentences,
)

KEYS = {"rouge1", "rouge2", "rougeL", "rougeLsum"}


def test_identical_strings_score_one() -> None:
    scores = rouge_scores("The quick brown fox jumps.", "The quick brown fox jumps.")
    assert set(scores) == KEYS
    assert scores == pytest.approx(dict.fromkeys(KEYS, 1.0))


def test_one_word_substitution() -> None:
    scores = rouge_scores("the cat sat", "the cat ran")
    assert scores["rouge1"] == pytest.approx(2 / 3)  # 2 of 3 unigrams shared
    assert scores["rouge2"] == pytest.approx(1 / 2)  # "the cat" of 2 bigrams
    assert scores["rougeL"] == pytest.approx(2 / 3)  # LCS "the cat"


def test_stemming_matches_inflections() -> None:
    assert rouge_scores("cats running", "cat run") == pytest.approx(dict.fromkeys(KEYS, 1.0))


def test_precision_recall_asymmetry_gives_f_measure() -> None:
    # prediction "a b" vs reference "a b c d": P = 1, R = 1/2, F = 2/3.
    assert rouge_scores("a b", "a b c d")["rouge1"] == pytest.approx(2 / 3)


@pytest.mark.parametrize("prediction", ["", "   ", "!!!"])
def test_empty_prediction_scores_zero(prediction: str) -> None:
    assert rouge_scores(prediction, "the cat sat on the mat") == pytest.approx(dict.fromkeys(KEYS, 0.0))


def test_split_sentences() -> None:
    assert split_sentences("One. Two!  Three? four") == "One.\nTwo!\nThree?\nfour"
    assert split_sentences("a.b stays\n\nnext line") == "a.b stays\nnext line"
    assert split_sentences("") == ""


def test_rouge_lsum_uses_sentences() -> None:
    reference = "the cat sat. the dog ran."
    prediction = "the dog ran. the cat sat."
    scores = rouge_scores(prediction, reference)
    # Swapping sentence order: every reference sentence is matched in full by the union LCS...
    assert scores["rougeLsum"] == pytest.approx(1.0)
    # ...while plain LCS over the whole text keeps only one of the two sentences (3 of 6 tokens).
    assert scores["rougeL"] == pytest.approx(0.5)
    assert scores["rouge1"] == pytest.approx(1.0)


def test_rouge_lsum_partial_union_lcs() -> None:
    # Reference sentences r1 = "a b c", r2 = "d e"; prediction sentences "a x c", "d e".
    # Union LCS hits: r1 -> {a, c}, r2 -> {d, e}: 4 of 5 reference tokens, 4 of 5 prediction tokens.
    scores = rouge_scores("a x c. d e.", "a b c. d e.")
    assert scores["rougeLsum"] == pytest.approx(0.8)


def test_mean_rouge() -> None:
    pairs = [("the cat sat", "the cat sat"), ("the cat sat", "the cat ran")]
    mean = mean_rouge(pairs)
    assert mean["rouge1"] == pytest.approx((1 + 2 / 3) / 2)
    assert mean["rouge2"] == pytest.approx((1 + 1 / 2) / 2)
    assert mean_rouge(iter(pairs)) == pytest.approx(mean)  # any iterable


def test_mean_rouge_rejects_empty() -> None:
    with pytest.raises(ExitbenchError):
        mean_rouge([])


def test_rouge_rejects_non_strings() -> None:
    with pytest.raises(ExitbenchError):
        rouge_scores(None, "x")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("[IN:X [SL:Y a ]]", "[IN:X [SL:Y a ] ]"),
        ("[IN:GET_WEATHER [SL:LOCATION  paris ] ]", "  [IN:GET_WEATHER\t[SL:LOCATION paris]]\n"),
        ("[IN:X]", "[ IN:X ]"),
    ],
)
def test_exact_match_ignores_whitespace(a: str, b: str) -> None:
    assert normalize_parse(a) == normalize_parse(b)
    assert exact_match(a, b)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("[IN:X [SL:Y a ]]", "[IN:X [SL:Z a ]]"),  # different slot
        ("[IN:X [SL:Y a b ]]", "[IN:X [SL:Y ab ]]"),  # token boundary inside a slot matters
        ("[IN:X [SL:Y a ]]", "[IN:X [SL:Y A ]]"),  # case matters
        ("[IN:X [SL:Y a ]]", "[IN:X [SL:Y a ]"),  # unbalanced
    ],
)
def test_exact_match_detects_differences(a: str, b: str) -> None:
    assert not exact_match(a, b)


def test_normalize_parse_canonical_form() -> None:
    assert normalize_parse("[IN:X [SL:Y a ]]") == "[ IN:X [ SL:Y a ] ]"


def _closed_form(n: int, c: int, k: int) -> float:
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


@pytest.mark.parametrize(
    ("n", "c", "k"),
    [(1, 1, 1), (1, 0, 1), (10, 3, 1), (10, 3, 5), (20, 1, 10), (200, 17, 1), (200, 17, 10), (200, 17, 100), (5, 2, 3)],
)
def test_pass_at_k_matches_closed_form(n: int, c: int, k: int) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(_closed_form(n, c, k), rel=1e-12, abs=1e-12)


def test_pass_at_1_is_fraction_correct() -> None:
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)


def test_pass_at_k_edges() -> None:
    assert pass_at_k(10, 0, 5) == 0.0
    assert pass_at_k(10, 10, 1) == 1.0
    assert pass_at_k(10, 6, 5) == 1.0  # n - c = 4 < k: every k-subset holds a correct sample
    assert pass_at_k(10, 5, 5) < 1.0


@pytest.mark.parametrize(
    ("n", "c", "k"),
    [(5, 2, 6), (5, 6, 1), (5, -1, 1), (5, 2, 0), (0, 0, 1), (5.0, 2, 1), (5, 2, True)],
)
def test_pass_at_k_rejects_bad_arguments(n: object, c: object, k: object) -> None:
    with pytest.raises(ExitbenchError):
        pass_at_k(n, c, k)  # type: ignore[arg-type]
