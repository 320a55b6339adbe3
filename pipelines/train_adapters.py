"""Stage `train_adapters`: a Kangaroo adapter for each model of ``adapters.models``, trained on the frozen model.

    python pipelines/train_adapters.py --config build/config/train_adapters.json --models-dir models --data data \
        --out models/adapters --checkpoints checkpoints/adapters --reports results/adapters

Writes ``<out>/<model>/kangaroo.pt`` (read by evaluate's ``kangaroo`` method) and ``<reports>/<model>.json`` (the
loss curve; held-out top-1 agreement with the full model before and after, beside plain early exit at the same
layer). A killed run resumes from ``<checkpoints>/<model>``.
"""

from __future__ import annotations

import argparse
from functools import partial
from pathlib import Path

from exitbench.cli import run_stage, set_threads
from exitbench.config import load_stage, stage_view
from exitbench.data.io import atomic_write_json
from exitbench.identity import model_identity
from exitbench.models.adapter import ADAPTER_FILE, KangarooAdapter, save_adapter
from exitbench.models.trained import TRAINED_FILES
from exitbench.provenance import provenance
from exitbench.training.adapter_training import train_adapter
from exitbench.training.frozen import prepare_run


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="build/config/train_adapters.json", help="resolved stage config")
    parser.add_argument("--models-dir", default="models", help="the prepared and trained models")
    parser.add_argument("--data", default="data", help="prepared data root")
    parser.add_argument("--out", default="models/adapters", help="<out>/<model>/kangaroo.pt")
    parser.add_argument("--checkpoints", default="checkpoints/adapters", help="resumable state, per model")
    parser.add_argument("--reports", default="results/adapters", help="<reports>/<model>.json")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)

    cfg = load_stage(args.config)
    set_threads(cfg.base.threads)
    out, reports, checkpoints = Path(args.out), Path(args.reports), Path(args.checkpoints)
    for folder in (out, reports, checkpoints):  # every output exists, with or without adapters to train
        folder.mkdir(parents=True, exist_ok=True)
    a = cfg.adapters
    if not a.models:
        print("train_adapters: adapters.models is empty; no adapter to train")
    made, build = TRAINED_FILES["adapter_file"], partial(KangarooAdapter, exit_layer=a.exit_layer)
    for name in a.models:
        run, counts = prepare_run(name, build, a, made, cfg.base, Path(args.models_dir), Path(args.data))
        report = train_adapter(run, checkpoints / name, progress=not args.no_progress)
        report.update(
            model=name,
            model_key=model_identity(Path(args.models_dir) / name)[:16],
            corpus=counts,
            provenance=provenance(stage_view(cfg, "train_adapters"), run.model.device, "float32"),
        )
        save_adapter(run.module, out / name / ADAPTER_FILE, {"model": name, "model_key": report["model_key"]})
        atomic_write_json(reports / f"{name}.json", report)
        agree = report["agreement"]
        print(
            f"train_adapters: {name} E={a.exit_layer}: top-1 agreement with the full model on "
            f"{report['held_out_positions']} held-out positions: early exit {agree['early_exit']:.3f}, adapter "
            f"{agree['adapter_untrained']:.3f} -> {agree['adapter_trained']:.3f} after {a.steps} steps "
            f"({report['seconds']:.0f} s) -> {out / name / ADAPTER_FILE}"
        )
    manifest = {
        name: {"file": f"{name}/{ADAPTER_FILE}", "exit_layer": cfg.adapters.exit_layer} for name in cfg.adapters.models
    }
    atomic_write_json(out / "adapters.json", {"adapters": manifest})  # the folder is never empty (DVC)


if __name__ == "__main__":
    run_stage(main)
