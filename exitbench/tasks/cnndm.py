"""CNN/DailyMail summarisation, one-shot, as in LayerSkip's evaluation.

Protocol (LayerSkip, Elhoushi et al. 2024, §5 "Evaluation", following Draft & Verify, Zhang et al. 2023):
one-shot prompt ``Article: {article}\\nSummary:`` preceded by one solved example; reference = the
highlights; ROUGE-1/2/L with stemming (the paper reports ROUGE-2). The example comes from the ``shots``
split (a pool of ~20 articles written by ``prepare_data``, disjoint from the evaluated ``test`` split and
from ``train``), chosen per sample by a generator seeded with the seed and the sample's id. Stop at a
blank line, EOS or ``max_new_tokens``.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from exitbench.errors import ExitbenchError
from exitbench.tasks.base import Sample, Task, register_task, require
from exitbench.tasks.metrics import rouge_scores

MAX_ARTICLE_CHARS = 2000  # keeps a one-shot prompt near 1k tokens on the 2-core CPU profile
SHOTS_SPLIT = "shots"


def format_example(article: str, summary: str | None = None) -> str:
    text = f"Article: {article[:MAX_ARTICLE_CHARS]}\nSummary:"
    return text if summary is None else f"{text} {summary}\n\n"


@register_task
class CnnDm(Task):
    name = "cnndm"
    split = "test"
    stop_strings = ("\n\n",)
    primary_metric = "rouge2"
    context_splits = (SHOTS_SPLIT,)
    version = 2  # 2: one-shot example from the shots split, seeded sample (1: the test split's tail, first N)

    def samples(self, rows: Sequence[dict[str, Any]], num_samples: int, lower: str = "") -> list[Sample]:
        pool = self.context.get(SHOTS_SPLIT) or []
        if not pool:
            raise ExitbenchError(
                f"cnndm: the one-shot pool (data/cnndm/{SHOTS_SPLIT}.jsonl) is missing or empty; "
                "re-run `dvc repro prepare_data`"
            )
        self._pool = sorted(pool, key=self.row_id)  # the choice depends on ids, not on file order
        return super().samples(rows, num_samples, lower)

    def make_sample(self, index: int, row: dict[str, Any]) -> Sample:
        article = require(row, "article", self.name)
        highlights = require(row, "highlights", self.name)
        sample_id = self.row_id(row)
        rng = random.Random(f"{self.settings.seed}/{sample_id}")
        candidates = [r for r in self._pool if self.row_id(r) != sample_id and r.get("article") != article]
        if not candidates:
            raise ExitbenchError(
                f"cnndm: no one-shot example other than the article of {sample_id}; re-run `dvc repro prepare_data`"
            )
        example = rng.choice(candidates)
        shot = format_example(example["article"], " ".join(example["highlights"].split("\n")))
        return Sample(sample_id, shot + format_example(article), highlights, row)

    def score(self, sample: Sample, completion: str) -> dict[str, float]:
        scores = rouge_scores(completion.strip(), sample.reference)
        return {key: scores[key] for key in ("rouge1", "rouge2", "rougeL")}
