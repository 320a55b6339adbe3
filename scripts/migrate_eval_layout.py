"""One-off: move a results/eval written before per-method stages into the per-stage layout, records reused.

Before: ``results/eval/<model>/<task>/<label>.{json,jsonl}`` (one evaluate stage). After:
``results/eval/<stage>/<model>/<task>/<label>.{json,jsonl}``, ``<stage>`` the label's registered method. A record's
settings key used to name its draft sub-vocabulary file by its full path; it now names the file only (a results
folder elsewhere keeps its records valid), so the records of the current settings are re-keyed: the old key is
computed with the old path, the new with the new rule, and the records of the old key get the new one. Records of
other settings move unchanged. Each stage re-writes its own draft_vocab.json / calibration.json on its next run.

    python scripts/migrate_eval_layout.py --config build/config/evaluate.json --models-dir models --data data

Run it once, then `dvc repro`: the evaluate stages reuse every record and only summarize again.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from exitbench import evaluation
from exitbench.config import load_stage
from exitbench.decoding import base_method
from exitbench.evaluation import EvalContext, settings_key
from exitbench.identity import model_identity
from exitbench.prompts import uses_chat_template
from exitbench.records import RecordFile
from exitbench.tasks.registry import TaskSettings, build_task

INPUTS = ("draft_vocab.json", "calibration.json")


def rekey(path: Path, old: str, new: str) -> int:
    """Give the records of settings key ``old`` in ``path`` the key ``new`` (record keys follow); returns how many."""
    store = RecordFile(path, new, writable=False)
    lines, moved = [], 0
    for line in path.read_text().splitlines():
        record = json.loads(line)
        if record.get("settings_key") == old:
            record["settings_key"] = new
            record["record_key"] = store.record_key(record["sample_key"])
            moved += 1
        lines.append(json.dumps(record))
    path.write_text("".join(line + "\n" for line in lines))
    return moved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", default="build/config/evaluate.json")
    parser.add_argument("--models-dir", default="models")
    parser.add_argument("--out", default="results/eval")
    args = parser.parse_args()
    cfg = load_stage(args.config)
    out = Path(args.out)
    old_summaries = sorted(path for path in out.glob("*/*/*.json") if path.name not in INPUTS)
    for summary_path in old_summaries:
        summary = json.loads(summary_path.read_text())
        model, task_name, label = summary_path.parent.parent.name, summary_path.parent.name, summary_path.stem
        stage = base_method(label)
        target = out / stage / model / task_name
        target.mkdir(parents=True, exist_ok=True)
        records = summary_path.with_suffix(".jsonl")
        options = summary.get("options", {})
        moved = 0
        if records.exists() and (Path(args.models_dir) / model).exists() and task_name in cfg.evaluate.tasks:
            ctx = EvalContext(model, _DeviceOnly(cfg.base.device), None, None,
                              model_identity(Path(args.models_dir) / model)[:16], {})
            task = build_task(task_name, TaskSettings(cfg.base.seed, cfg.evaluate.sandbox_timeout_s))
            chat = uses_chat_template(cfg, model, task_name)
            new_options = {k: str(target / Path(v).name) if k in evaluation.FILE_OPTIONS else v
                           for k, v in options.items()}
            new = settings_key(cfg, ctx, task, label, new_options, chat)
            saved, evaluation.FILE_OPTIONS = evaluation.FILE_OPTIONS, ()
            try:
                old = settings_key(cfg, ctx, task, label, options, chat)
            finally:
                evaluation.FILE_OPTIONS = saved
            if old != new:
                moved = rekey(records, old, new)
        for path in (records, summary_path):
            if path.exists():
                shutil.move(str(path), str(target / path.name))
        for name in INPUTS:
            if (summary_path.parent / name).exists():
                shutil.copy2(summary_path.parent / name, target / name)
        print(f"{summary_path} -> {target / summary_path.name} ({moved} records re-keyed)")
    for folder in sorted({p.parent for p in old_summaries}):
        for name in INPUTS:
            (folder / name).unlink(missing_ok=True)
        for leftover in sorted(folder.glob("*.jsonl")):  # a label no longer summarized: its store moves too
            stage = base_method(leftover.stem)
            dest = out / stage / folder.parent.name / folder.name
            dest.mkdir(parents=True, exist_ok=True)
            shutil.move(str(leftover), str(dest / leftover.name))
        if not any(folder.iterdir()):
            folder.rmdir()
    for model_dir in sorted(p for p in out.iterdir() if p.is_dir()):
        if model_dir.exists() and not any(model_dir.iterdir()):
            model_dir.rmdir()


class _DeviceOnly:
    """What settings_key reads of a model: its device type."""

    def __init__(self, device: str) -> None:
        import torch

        self.device = torch.device("cpu" if device == "auto" else device)


if __name__ == "__main__":
    main()
