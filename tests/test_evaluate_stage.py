"""The evaluate stage's entry point: summaries of settings no longer configured do not outlive the run."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _stage():
    spec = importlib.util.spec_from_file_location("evaluate_stage", ROOT / "pipelines" / "evaluate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_summaries_this_run_did_not_write_are_removed_and_records_kept(tmp_path):
    topv2 = tmp_path / "layerskip" / "topv2"
    topv2.mkdir(parents=True)
    for name in (
        "autoregressive.json",
        "autoregressive.jsonl",
        "early_exit.json",
        "early_exit.jsonl",
        "draft_vocab.json",
        "calibration.json",
        "early_exit@15.json",
    ):
        (topv2 / name).write_text("{}")
    (tmp_path / "old_model" / "cnndm").mkdir(parents=True)
    (tmp_path / "old_model" / "cnndm" / "autoregressive.json").write_text("{}")
    rows = [{"model": "layerskip", "task": "topv2", "method": m} for m in ("autoregressive", "early_exit@15")]
    removed = _stage().remove_stale_summaries(tmp_path, rows)
    assert removed == [
        tmp_path / "layerskip" / "topv2" / "early_exit.json",
        tmp_path / "old_model" / "cnndm" / "autoregressive.json",
    ]
    left = sorted(path.name for path in topv2.iterdir())
    assert left == [
        "autoregressive.json",
        "autoregressive.jsonl",
        "calibration.json",
        "draft_vocab.json",
        "early_exit.jsonl",
        "early_exit@15.json",
    ]
