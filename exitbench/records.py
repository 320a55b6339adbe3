"""evaluate's record store: one append-only ``.jsonl`` of per-sample records per (stage, model, task, method).

A record is reused only for the same settings and the same sample (:class:`RecordFile`), so an interrupted run
resumes where it stopped and other data regenerates exactly the samples that differ. Under ``torchrun`` each
rank keeps its own part file until rank 0 merges them (:class:`Shard`).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from exitbench.errors import ExitbenchError

if TYPE_CHECKING:
    from exitbench.prompts import TaskBatch


def stage_dir(out_dir: Path, stage: str, model: str, task: str) -> Path:
    """Where stage ``stage`` keeps its records and summaries of (``model``, ``task``): one folder per stage."""
    return out_dir / stage / model / task


def read_records(path: Path) -> list[dict[str, Any]]:
    """Every whole record a store file holds, of any settings, in file order; a torn line (a kill mid-write)
    is dropped. The one reader of the format: evaluate's :class:`RecordFile` and the report both use it."""
    if not path.exists():
        return []
    return [record for line in path.read_text().splitlines() if (record := _parse(line)) is not None]


@dataclass(frozen=True)
class Shard:
    """This process's slice of every sample list when evaluation runs under ``torchrun`` (one process per GPU):
    sample ``i`` belongs to rank ``i % world``. Each rank times every method beside greedy on its own samples,
    interleaved per sample as in one process, so each per-sample speed-up stays a same-process ratio."""

    rank: int = 0
    world: int = 1
    barrier: Callable[[], None] = field(default=lambda: None, compare=False)

    def owns(self, index: int) -> bool:
        return index % self.world == self.rank

    def records_path(self, path: Path, rank: int | None = None) -> Path:
        """Where a rank keeps its records until rank 0 merges them (the whole file when not sharded)."""
        if self.world == 1:
            return path
        return path.with_name(f"{path.stem}.rank{self.rank if rank is None else rank}-of-{self.world}{path.suffix}")


def merge_shards(shard: Shard, path: Path, key: str) -> RecordFile:
    """Rank 0, after the barrier: every rank's records of ``path`` joined into ``path`` (the part files go)."""
    merged = RecordFile(path, key)
    parts = [shard.records_path(path, rank) for rank in range(shard.world)]
    for part in parts:
        if part.exists():
            merged.stored.update(RecordFile(part, key).stored)
    merged._rewrite()
    for part in parts:
        part.unlink(missing_ok=True)
    return merged


class RecordFile:
    """Append-only per-sample records, each valid only for one settings key and one sample; resumable.

    A record is stored under ``record_key = sha256(settings key, sample key)``: the settings (weights, code,
    method options, budget, dtype, ...) and the sample (prompt token ids, reference, data row). A record is
    reused only when both match, so a new mirror, a new sampling seed or a mended row regenerates exactly
    the samples that changed, whatever their index. Records of other settings stay in the file, so
    switching a method's options back reuses them. A torn last line (a kill mid-write) is dropped.
    """

    VERSION = 2  # records of earlier layouts (keyed by index) are never reused

    def __init__(self, path: Path, key: str, writable: bool = True) -> None:
        self.path = path
        self.key = key
        self.stored: dict[str, dict[str, Any]] = {}
        self.made = 0
        self.writable = writable  # False: another stage's records, read and never rewritten
        for record in read_records(path):
            if record.get("layout") == self.VERSION and "record_key" in record:
                self.stored[record["record_key"]] = record
        if writable:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._rewrite()

    def record_key(self, sample_key: str) -> str:
        return hashlib.sha256(f"{self.key}/{sample_key}".encode()).hexdigest()[:32]

    def get(self, sample_key: str) -> dict[str, Any] | None:
        """The stored record of this sample under this file's settings, or None."""
        return self.stored.get(self.record_key(sample_key))

    def _rewrite(self) -> None:
        tmp = self.path.with_suffix(".jsonl.tmp")
        with tmp.open("w") as handle:
            for record in self.stored.values():
                handle.write(json.dumps(record) + "\n")
        os.replace(tmp, self.path)

    def append(self, record: dict[str, Any], sample_key: str) -> dict[str, Any]:
        """Store ``record`` for ``sample_key`` (fsynced before returning) and return it as stored."""
        if not self.writable:
            raise RuntimeError(f"{self.path}: opened read-only (another stage's records)")
        record = {
            **record,
            "layout": self.VERSION,
            "settings_key": self.key,
            "sample_key": sample_key,
            "record_key": self.record_key(sample_key),
        }
        with self.path.open("a") as handle:
            handle.write(json.dumps(record) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        self.stored[record["record_key"]] = record
        self.made += 1
        return record


def _parse(line: str) -> dict[str, Any] | None:
    try:
        value = json.loads(line)
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def stored_records(
    out_dir: Path, stage: str, label: str, model: str, batch: TaskBatch, key: str, required: bool
) -> list[dict[str, Any] | None]:
    """Another stage's stored records of ``batch``'s samples (read only), in sample order, None where missing;
    ``required``: every sample must have one (greedy's, which every method stage compares with)."""
    path = stage_dir(out_dir, stage, model, batch.task.name) / f"{label}.jsonl"
    records = RecordFile(path, key, writable=False)
    found = [records.get(sample_key) for sample_key in batch.sample_keys]
    missing = sum(record is None for record in found)
    if required and missing:
        raise ExitbenchError(
            f"evaluate: {path} lacks {label}'s records of {missing} of {len(found)} samples under these settings; "
            f"run `dvc repro evaluate@{stage}` first (every method stage compares with them)"
        )
    return [None if record is None else {**record, "index": i} for i, record in enumerate(found)]
