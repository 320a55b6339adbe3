"""HumanEval (Chen et al. 2021): complete a Python function; pass@1 in a sandbox, and ROUGE-2.

Protocol: the raw prompt; stop sequences of the human-eval convention (``\\ndef``, ``\\nclass``,
``\\nif``, ``\\nprint``, ``\\n#``); pass@k with the unbiased estimator (Chen et al. 2021 §2.1), here
k = n = 1 greedy sample; ROUGE-2 against the canonical solution, the metric LayerSkip's Tables 3 and 5
report for code. Completions run only inside :mod:`exitbench.tasks.sandbox`.
"""

from __future__ import annotations

from typing import Any

from exitbench.tasks.base import Sample, Task, register_task, require
from exitbench.tasks.metrics import pass_at_k, rouge_scores
from exitbench.tasks.sandbox import check_completion


@register_task
class HumanEval(Task):
    name = "humaneval"
    split = "test"
    stop_strings = ("\ndef", "\nclass", "\nif", "\nprint", "\n#")
    primary_metric = "pass@1"
    runs_generated_code = True

    def make_sample(self, index: int, row: dict[str, Any]) -> Sample:
        prompt = require(row, "prompt", self.name)
        return Sample(require(row, "task_id", self.name), prompt, require(row, "canonical_solution", self.name), row)

    def score(self, sample: Sample, completion: str) -> dict[str, float]:
        result = check_completion(
            sample.prompt, completion, sample.row["test"], sample.row["entry_point"], self.settings.sandbox_timeout_s
        )
        return {
            "pass@1": pass_at_k(1, int(result.passed), 1),
            "rouge2": rouge_scores(completion, sample.reference)["rouge2"],
        }
