"""MBPP (Austin et al. 2021): a second code task, scored in the same sandbox as HumanEval.

Protocol (MBPP paper §2): the problem text and its three test asserts in the prompt, three solved
examples (task ids 2-4 of the ``prompt`` split) before it, the solution between ``[BEGIN]`` and
``[DONE]``; pass@1 by running the asserts. The evaluated rows are a seeded draw from ``test`` (task ids
11..510); ``train`` (511..974) is for training and the draft sub-vocabulary only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from exitbench.tasks.base import Sample, Task, register_task, require
from exitbench.tasks.metrics import pass_at_k
from exitbench.tasks.sandbox import check_mbpp


def format_problem(row: dict[str, Any], solution: str | None = None) -> str:
    tests = "\n".join(row["test_list"])
    head = (
        f"You are an expert Python programmer, and here is your task: {row['text']} "
        f"Your code should pass these tests:\n\n{tests}\n[BEGIN]\n"
    )
    return head if solution is None else f"{head}{solution}\n[DONE]\n\n"


@register_task
class Mbpp(Task):
    name = "mbpp"
    split = "test"
    stop_strings = ("[DONE]",)
    primary_metric = "pass@1"
    runs_generated_code = True
    context_splits = ("prompt",)
    few_shot_ids = (2, 3, 4)
    id_field = "task_id"
    version = 2  # 2: a seeded sample of test (1: its first N rows)

    def samples(self, rows: Sequence[dict[str, Any]], num_samples: int, lower: str = "") -> list[Sample]:
        shots = sorted(
            (r for r in self.context.get("prompt", []) if r.get("task_id") in self.few_shot_ids),
            key=lambda r: r["task_id"],
        )
        self._prefix = "".join(format_problem(r, r["code"]) for r in shots)
        return super().samples(rows, num_samples, lower)

    def make_sample(self, index: int, row: dict[str, Any]) -> Sample:
        require(row, "text", self.name)
        require(row, "test_list", self.name, list)
        return Sample(self.row_id(row), self._prefix + format_problem(row), row.get("code", ""), row)

    def score(self, sample: Sample, completion: str) -> dict[str, float]:
        row = sample.row
        setup = row.get("test_setup_code", "")
        result = check_mbpp(completion, row["test_list"], setup, self.settings.sandbox_timeout_s)
        return {"pass@1": pass_at_k(1, int(result.passed), 1)}
