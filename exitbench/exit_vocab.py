"""The sub-vocabulary a trained model's early exits were scored over, read back from its training report.

A variant trained with ``exit_vocab_size: N`` scores every exit but the last over the N most frequent target
tokens of its training corpus (:func:`exitbench.training.trainer.exit_vocabulary`); the logits of every other
token at those exits were never trained. A draft through such an exit should propose from that set and no
other: on the cpu profile's ``layerskip`` (E = 12, d = 1) it accepts 0.635 of its TOPv2 drafts against 0.489
with the task's own 2048-token set, and 0.279 of its HumanEval drafts against 0.106 with the whole vocabulary
(README "Draft vocabulary of a sub-vocabulary model").

The set is a deterministic function of the training report's recorded variant and seed, the prepared data and
the tokenizer, so it is rebuilt here exactly as the trainer built it (the corpus draw of
:func:`~exitbench.training.corpora.build_corpus`), and checked against the size and target coverage the report
recorded: prepared data that changed since training stops with one error instead of a silently different set.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from exitbench.config import TrainVariant
from exitbench.data.io import atomic_write_text
from exitbench.errors import ExitbenchError
from exitbench.subvocab import write_task_draft_vocab
from exitbench.tasks.registry import Task
from exitbench.training.corpora import build_corpus
from exitbench.training.trainer import exit_vocab_coverage, exit_vocabulary


def report_path(reports_dir: str | Path | None, model: str) -> Path | None:
    """``<reports_dir>/<model>.json`` when it exists (a trained variant), else None (base, a hub model)."""
    if reports_dir is None:
        return None
    path = Path(reports_dir) / f"{model}.json"
    return path if path.exists() else None


def trained_exit_vocabulary(report_file: str | Path, data_dir: str | Path, tokenizer: Any) -> list[int] | None:
    """The token ids the exits of the model that ``report_file`` describes were trained over (sorted), or None
    when they were trained over the whole vocabulary (or the model was not trained here)."""
    report_file = Path(report_file)
    try:
        report = json.loads(report_file.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ExitbenchError(f"{report_file}: unreadable training report ({err}); rerun `dvc repro train`") from None
    recorded = report.get("exit_vocab")
    if not report.get("config") or not recorded:
        return None
    variant = TrainVariant.model_validate(report["config"])
    if not variant.exit_vocab_size:
        return None
    size = variant.max_examples or variant.steps * variant.batch_size * variant.grad_accum
    corpus = build_corpus(variant.corpus, Path(data_dir), tokenizer, variant.seq_len, size, int(report["seed"]))
    ids = exit_vocabulary(corpus.examples, variant.exit_vocab_size, [tokenizer.eos_token_id])
    coverage = exit_vocab_coverage(corpus.examples, ids)
    if len(ids) != recorded["size"] or not math.isclose(coverage, recorded["target_coverage"], abs_tol=1e-9):
        raise ExitbenchError(
            f"{report_file}: the exits' sub-vocabulary rebuilt from {data_dir} ({len(ids)} tokens, {coverage:.4f} of "
            f"the targets) is not the one the model was trained over ({recorded['size']}, "
            f"{recorded['target_coverage']:.4f}): the prepared data changed since training; rerun `dvc repro train`"
        )
    return ids


def model_exit_vocabulary(
    reports_dir: str | Path | None, model: str, data_dir: str | Path, tokenizer: Any
) -> list[int] | None:
    """:func:`trained_exit_vocabulary` of ``model`` from its report in ``reports_dir``; None without a report."""
    report = report_path(reports_dir, model)
    return None if report is None else trained_exit_vocabulary(report, data_dir, tokenizer)


def write_draft_vocab(
    trained: list[int] | None,
    task: Task,
    data_dir: str | Path,
    tokenizer: Any,
    size: int,
    always: Iterable[int],
    target: str | Path,
) -> Path | None:
    """A model's draft sub-vocabulary for ``task``, written to ``target`` (a JSON list of ids), or None.

    The set its exits were trained over (``trained``) plus ``always`` (the stop tokens) when there is one,
    whatever the task: the other logits of those exits are untrained. Otherwise the ``size`` most frequent
    tokens of the task's train split (:func:`~exitbench.subvocab.write_task_draft_vocab`) when ``size`` > 0 and the
    task has one; else None (drafts over the whole vocabulary).
    """
    if trained is not None:
        return atomic_write_text(Path(target), json.dumps(sorted(set(trained) | set(always))) + "\n")
    if not size:
        return None
    return write_task_draft_vocab(task, data_dir, tokenizer, size, always, target)
