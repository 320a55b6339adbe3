"""The one line an evaluate stage prints before it recomputes results that are already on disk.

A stored record is reused only under the settings it was made with (:class:`exitbench.records.RecordFile`):
the weights' hash among them. A fresh clone that trains its own models gets weights that differ from the
committed run's (training is not bit-identical across CPU kernels: AMX vs AVX512-BF16), so every generation
of those models is made again. That is correct, and it must not happen without a word: before the first
sample, the stage names what changed (from the stored summary's ``settings``), how many records it will
make and roughly how long that takes (the stored records' own decoding times, their greedy references
included).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from exitbench.records import RecordFile

if TYPE_CHECKING:
    from exitbench.prompts import TaskBatch

#: what each part of a record's settings (:func:`exitbench.evaluation.settings_of`) is, in the notice's words
SETTING_NAMES = {
    "model": "the weights",
    "code": "the method's code",
    "timing": "the timing protocol",
    "options": "the method's options",
    "task_version": "the task's version",
    "max_new_tokens": "the token budget",
    "dtype": "the dtype",
    "device": "the device",
    "chat_template": "the prompt format",
    "seed": "the sampling seed",
}


OLDER_SUMMARY = "the settings (weights, method code or options)"


@dataclass(frozen=True)
class Planned:
    """One method's records of one (stage, model, task) before the stage runs it."""

    label: str
    settings: Mapping[str, Any]  # what its records are made with now (:func:`exitbench.evaluation.settings_of`)
    records: RecordFile
    needed: Sequence[str]  # the sample keys the method runs on (its sample limit's first samples)
    previous: Mapping[str, Any] | None  # the summary the stored results were written with (its .json), if any


def read_summary(path: Path) -> dict[str, Any] | None:
    """A stored summary, or None where there is none (or it is unreadable: the stage rewrites it)."""
    try:
        value = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return value if isinstance(value, dict) else None


def changed_settings(previous: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """The parts of ``current`` settings that differ from those ``previous`` summary states, in words; a
    summary written before summaries stated their settings names them all."""
    stated = previous.get("settings")
    if not isinstance(stated, dict):
        return [OLDER_SUMMARY]
    keys = [key for key in current if stated.get(key) != current[key]]
    return [SETTING_NAMES.get(key, key) for key in keys] or ["the settings"]


def _stored_seconds(planned: Planned, missing: set[str]) -> float:
    """Decoding seconds the stored results of ``missing`` samples took (the method's and the greedy reference
    timed beside it), from the records the previous summary was made with."""
    old_key = (planned.previous or {}).get("settings_key")
    total = 0.0
    for record in planned.records.stored.values():
        if record.get("sample_key") not in missing or record.get("settings_key") != old_key:
            continue
        for field in ("decode", "reference_decode", "framework_reference_decode"):
            total += float((record.get(field) or {}).get("wall_time_s") or 0.0)
    return total


def recompute_notice(where: str, plans: Sequence[Planned]) -> str | None:
    """The notice for the stage ``where`` (``evaluate@early_exit plain/topv2``), or None when it reuses every
    stored result, or when there were none (a first run, or a resumed one: its progress bar says enough)."""
    stale = []
    for planned in plans:
        missing = {key for key in planned.needed if planned.records.get(key) is None}
        previous = planned.previous
        if missing and previous is not None and previous.get("settings_key") != planned.records.key:
            stale.append((planned, missing))
    if not stale:
        return None
    parts = (changed_settings(planned.previous or {}, planned.settings) for planned, _ in stale)
    changes = dict.fromkeys(part for changed in parts for part in changed)
    count = sum(len(missing) for _, missing in stale)
    needed = sum(len(planned.needed) for planned, _ in stale)
    seconds = sum(_stored_seconds(planned, missing) for planned, missing in stale)
    took = f"{seconds / 60:.0f} min" if seconds >= 60 else f"{seconds:.0f} s"
    labels = ", ".join(planned.label for planned, _ in stale)
    return (
        f"{where}: {' and '.join(changes)} differ from those the stored results were made with, so {count} of "
        f"{needed} records ({labels}) will be recomputed, about {took} at the stored records' speed; "
        "the committed numbers come back only from the same weights and code (docs/pipeline.md#stored-generations)"
    )


def announce_recompute(
    where: str,
    target: Path,
    settings: Mapping[str, Mapping[str, Any]],
    records: Mapping[str, RecordFile],
    batch: TaskBatch,
    limits: Mapping[str, int],
) -> str | None:
    """Print (and return) :func:`recompute_notice` for one stage's methods on one (model, task): each label's
    settings, its record file, the samples it runs on (``limits``) and its summary in ``target``."""
    keys = batch.sample_keys
    plans = [
        Planned(
            label, settings[label], stored, keys[: limits.get(label, len(keys))], read_summary(target / f"{label}.json")
        )
        for label, stored in records.items()
    ]
    notice = recompute_notice(where, plans)
    if notice is not None:
        print(notice, flush=True)
    return notice
