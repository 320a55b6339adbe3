"""A task's samples as a model reads them: the seeded draw, prompt encoding (chat template or not), the stop
rule, each sample's key, and the token comparison every exactness check uses.

Shared by evaluate, the bench, batched throughput and CALM's calibration, so each encodes and stops a prompt
the same way.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from exitbench.config import Config
from exitbench.data.io import read_jsonl
from exitbench.decoding import StopRule
from exitbench.errors import ExitbenchError
from exitbench.tasks.registry import Sample, Task


def uses_chat_template(cfg: Config, model: str, task: str) -> bool:
    """Whether ``model``'s prompts of ``task`` go through its chat template (``evaluate.chat_template`` for every
    model and task, or the tasks ``evaluate.chat_template_models`` names for the model)."""
    return cfg.evaluate.chat_template or task in cfg.evaluate.chat_template_models.get(model, [])


def encode_prompt(tokenizer: Any, prompt: str, chat_template: bool) -> list[int]:
    """Prompt text -> token ids (a chat template only when params ask for it; BOS as the tokenizer adds)."""
    if chat_template:
        messages = [{"role": "user", "content": prompt}]
        prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer(prompt, add_special_tokens=True)["input_ids"]


def stop_rule(tokenizer: Any, task: Task) -> StopRule:
    eos = tokenizer.eos_token_id
    eos_ids = frozenset(eos if isinstance(eos, list) else [eos]) if eos is not None else frozenset()
    return StopRule(eos_ids, task.stop_strings, lambda ids: tokenizer.decode(ids, skip_special_tokens=True))


def load_samples(task: Task, data_dir: Path, num_samples: int) -> list[Sample]:
    def rows(split: str) -> list[dict[str, Any]]:
        path = data_dir / task.name / f"{split}.jsonl"
        if not path.exists():
            raise ExitbenchError(
                f"evaluate: {path} not found; run `dvc repro prepare_data` (is '{task.name}' in data.tasks?)"
            )
        return list(read_jsonl(path))

    task.set_context({split: rows(split) for split in task.context_splits})
    return task.samples(rows(task.split), num_samples)


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first differing token (the shorter length if one is a prefix), None if equal."""
    if list(a) == list(b):
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def sample_key(sample: Sample, prompt_ids: Sequence[int]) -> str:
    """sha256 of everything a stored record of ``sample`` was made from and scored against: the exact prompt
    token ids, the sample's id, its reference and its whole data row (HumanEval's tests live there)."""
    payload = {"id": sample.sample_id, "prompt_ids": list(prompt_ids), "reference": sample.reference, "row": sample.row}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:32]


@dataclass
class TaskBatch:
    """One task's samples on one model, encoded once and shared by every method."""

    task: Task
    samples: list[Sample]
    prompt_ids: list[list[int]]
    stop: StopRule
    max_new_tokens: int
    tokenizer: Any

    @cached_property
    def sample_keys(self) -> list[str]:
        """Each sample's :func:`sample_key` (what its stored records must match)."""
        return [sample_key(s, ids) for s, ids in zip(self.samples, self.prompt_ids, strict=True)]


def sample_info(task: Task, samples: Sequence[Sample]) -> dict[str, Any]:
    """How the samples run were drawn: seed, strategy, count and count per stratum."""
    strata = Counter(task.stratum(sample.row) for sample in samples)
    return {
        "seed": task.settings.seed,
        "strategy": task.sample_strategy(),
        "num_samples": len(samples),
        "strata": dict(sorted(strata.items())),
    }
