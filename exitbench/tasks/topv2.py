"""TOPv2 semantic parsing (Chen et al. 2020): an utterance in, its bracketed semantic parse out."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from exitbench.errors import ExitbenchError
from exitbench.tasks.base import Sample, Task, register_task
from exitbench.tasks.metrics import exact_match

PROMPT_TEMPLATE = "{utterance}\n"


def _field(row: dict, key: str) -> str:
    value = row.get(key)
    if not isinstance(value, str):
        raise ExitbenchError(f"topv2 row has no string '{key}' (keys: {', '.join(sorted(row))})")
    return value


def build_prompt(row: dict) -> str:
    """The model's input for one row: the utterance followed by a newline."""
    return PROMPT_TEMPLATE.format(utterance=_field(row, "utterance"))


def build_target(row: dict) -> str:
    """The expected continuation: the semantic parse (the trainer appends the EOS token)."""
    return _field(row, "semantic_parse")


@register_task
class TopV2(Task):
    """TOPv2 exact match after whitespace normalisation, overall and per domain.

    Protocol (LayerSkip §5, Table 6): the model is finetuned on TOPv2 train with the same prompt format
    (:func:`build_prompt`, used by the trainer too) and generates one parse per utterance; stop at the
    newline or EOS. The sample is stratified by domain (equal counts per domain, see
    :mod:`exitbench.tasks.sampling`); a row's id is ``<domain>-<split>-<n>`` (written by ``prepare_data``).
    """

    name = "topv2"
    split = "test"
    stop_strings = ("\n",)
    primary_metric = "exact_match"
    stratum_field = "domain"
    version = 2  # 2: seeded sample stratified by domain, ids from the rows (1: the first N rows, index ids)

    def make_sample(self, index: int, row: dict) -> Sample:
        return Sample(self.row_id(row), build_prompt(row), build_target(row), row)

    def score(self, sample: Sample, completion: str) -> dict[str, float]:
        return {"exact_match": float(exact_match(completion.strip(), sample.reference))}

    def aggregate(self, samples: Sequence[Sample], scores: Sequence[dict[str, float]]) -> dict[str, Any]:
        overall = super().aggregate(samples, scores)
        per_domain: dict[str, list[float]] = {}
        for sample, score in zip(samples, scores, strict=True):
            per_domain.setdefault(str(sample.row.get("domain", "?")), []).append(score["exact_match"])
        overall["per_domain"] = {d: sum(v) / len(v) for d, v in sorted(per_domain.items())}
        return overall
