"""CNN/DailyMail summarisation, one-shot, as in LayerSkip's evaluation.

Protocol (LayerSkip, Elhoushi et al. 2024, §5 "Evaluation", following Draft & Verify, Zhang et al. 2023):
one-shot prompt ``Article: {article}\\nSummary:`` preceded by one solved example; reference = the
highlights; ROUGE-1/2/L with stemming (the paper reports ROUGE-2). The example comes from a fixed pool
drawn (seeded) from the END of the test split, disjoint from the evaluated rows, which are the first N.
Stop at a blank line, EOS or ``max_new_tokens``.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from exitbench.errors import ExitbenchError
from exitbench.tasks.base import Sample, Task, register_task, require
from exitbench.tasks.metrics import rouge_scores

POOL_SIZE = 20
MAX_ARTICLE_CHARS = 2000  # keeps a one-shot prompt near 1k tokens on the 2-core CPU profile


def format_example(article: str, summary: str | None = None) -> str:
    text = f"Article: {article[:MAX_ARTICLE_CHARS]}\nSummary:"
    return text if summary is None else f"{text} {summary}\n\n"


@register_task
class CnnDm(Task):
    name = "cnndm"
    split = "test"
    stop_strings = ("\n\n",)
    primary_metric = "rouge2"

    def samples(self, rows: Sequence[dict[str, Any]], num_samples: int) -> list[Sample]:
        if num_samples + POOL_SIZE > len(rows):
            raise ExitbenchError(
                f"cnndm: {num_samples} samples + a one-shot pool of {POOL_SIZE} need {num_samples + POOL_SIZE} "
                f"rows, data has {len(rows)}; lower evaluate.tasks.cnndm.num_samples"
            )
        self._pool = list(rows[-POOL_SIZE:])
        return super().samples(rows[: len(rows) - POOL_SIZE], num_samples)

    def make_sample(self, index: int, row: dict[str, Any]) -> Sample:
        article = require(row, "article", self.name)
        highlights = require(row, "highlights", self.name)
        rng = random.Random(self.settings.seed * 100_003 + index)
        example = rng.choice([r for r in self._pool if r.get("id") != row.get("id")])
        shot = format_example(example["article"], " ".join(example["highlights"].split("\n")))
        return Sample(str(row.get("id", index)), shot + format_example(article), highlights, row)

    def score(self, sample: Sample, completion: str) -> dict[str, float]:
        scores = rouge_scores(completion.strip(), sample.reference)
        return {key: scores[key] for key in ("rouge1", "rouge2", "rougeL")}
