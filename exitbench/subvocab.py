"""A draft sub-vocabulary: the most frequent tokens of a task's training text.

Self-speculative drafting proposes tokens through the shared head; restricted to the tokens a task
actually uses, that head costs a fraction of the 49k-word one, and since the full model verifies every
token the output stays exact (only acceptance can drop, when the right token is outside the subset).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from exitbench.data.io import atomic_write_text, read_jsonl
from exitbench.tasks.registry import Task

MAX_VOCAB_ROWS = 20_000  # training rows counted for a draft sub-vocabulary


def frequent_token_ids(token_lists: Iterable[Sequence[int]], size: int, always: Iterable[int] = ()) -> list[int]:
    """The ``size`` most frequent ids (ties broken by id, deterministic), plus every id in ``always``."""
    counts = Counter(token for tokens in token_lists for token in tokens)
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    chosen = {token for token, _ in ranked[:size]}
    return sorted(chosen | set(always))


def task_train_path(task: Task, data_dir: str | Path) -> Path:
    """Where a task's training rows would be: ``<data>/<task>/train.jsonl``."""
    return Path(data_dir) / task.name / "train.jsonl"


def load_missing_context(task: Task, data_dir: str | Path) -> None:
    """Give ``task`` the rows of its context splits (few-shot examples) it has not received yet, where present."""
    paths = {split: Path(data_dir) / task.name / f"{split}.jsonl" for split in task.context_splits}
    missing = {split: path for split, path in paths.items() if split not in task.context and path.exists()}
    if missing:
        task.set_context({**task.context, **{split: list(read_jsonl(path)) for split, path in missing.items()}})


def write_task_draft_vocab(
    task: Task, data_dir: str | Path, tokenizer: Any, size: int, always: Iterable[int], target: str | Path
) -> Path | None:
    """Write the ``size`` most frequent tokens of the task's train split (prompt + reference, never test
    data), plus ``always`` (the stop tokens), as a JSON list to ``target``; None when there is no train split.
    """
    path = task_train_path(task, data_dir)
    if not path.exists():
        return None
    rows = list(read_jsonl(path))[:MAX_VOCAB_ROWS]
    load_missing_context(task, data_dir)
    # every row counted (a draw of all rows only reorders them, which leaves the counts as they are)
    texts = [sample.prompt + sample.reference for sample in task.samples(rows, len(rows))]
    ids = frequent_token_ids((tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts), size, always)
    return atomic_write_text(Path(target), json.dumps(ids) + "\n")


def write_task_calibration(
    task: Task, data_dir: str | Path, tokenizer: Any, rows: int, target: str | Path
) -> Path | None:
    """Write ``rows`` seeded train-split examples of the task (prompt + reference, never test data) as a JSON
    list of token-id lists to ``target``: calibration text for a method that chooses something on it
    (depth pruning's block); None when there is no train split."""
    path = task_train_path(task, data_dir)
    if not path.exists():
        return None
    train_rows = list(read_jsonl(path))[:MAX_VOCAB_ROWS]
    load_missing_context(task, data_dir)
    texts = [sample.prompt + sample.reference for sample in task.samples(train_rows, min(rows, len(train_rows)))]
    ids = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
    return atomic_write_text(Path(target), json.dumps(ids) + "\n")
