"""Stage `train_adapters`: a Kangaroo adapter for each model of ``adapters.models``, trained on the frozen model.

    python pipelines/train_adapters.py --config build/config/train_adapters.json --models-dir models --data data \
        --out models/adapters --checkpoints checkpoints/adapters --reports results/adapters

Writes ``<out>/<model>/kangaroo.pt`` (read by evaluate's ``kangaroo`` method) and ``<reports>/<model>.json`` (the
loss curve; held-out top-1 agreement with the full model before and after, beside plain early exit at the same
layer). A killed run resumes from ``<checkpoints>/<model>``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from exitbench.cli import run_stage, set_threads
from exitbench.config import load_stage, stage_view
from exitbench.data.io import atomic_write_json
from exitbench.errors import ExitbenchError
from exitbench.identity import model_identity
from exitbench.models.adapter import ADAPTER_FILE, KangarooAdapter, save_adapter
from exitbench.models.load import load_early_exit_model, load_tokenizer
from exitbench.models.sources import absent_role
from exitbench.provenance import provenance
from exitbench.training.adapter_training import AdapterRun, train_adapter
from exitbench.training.corpora import build_corpus


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
    if not cfg.adapters.models:
        print("train_adapters: adapters.models is empty; no adapter to train")
    for name in cfg.adapters.models:
        model_dir = Path(args.models_dir) / name
        if (absent := absent_role(model_dir)) is not None:
            raise ExitbenchError(
                f"adapters.models names '{name}', which this run has no model for "
                f"({absent['why']}); remove it from adapters.models"
            )
        if not (model_dir / "config.json").exists():
            raise ExitbenchError(
                f"train_adapters: model '{name}' not found at {model_dir}; run `dvc repro` for the "
                "stage that makes it (prepare_model or train) first"
            )
        model = load_early_exit_model(model_dir, "float32", cfg.base.device)
        tokenizer = load_tokenizer(model_dir)
        a = cfg.adapters
        corpus = build_corpus(
            a.corpus, Path(args.data), tokenizer, a.seq_len, a.steps * a.batch_size + a.held_out, cfg.base.seed
        )
        held_out, train = corpus.examples[: a.held_out], corpus.examples[a.held_out :]
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        run = AdapterRun(model, KangarooAdapter(model, a.exit_layer), a, train, held_out, int(pad or 0), cfg.base.seed)
        report = train_adapter(run, checkpoints / name, progress=not args.no_progress)
        report.update(
            model=name,
            model_key=model_identity(model_dir)[:16],
            corpus=corpus.counts,
            provenance=provenance(stage_view(cfg, "train_adapters"), model.device, "float32"),
        )
        save_adapter(run.adapter, out / name / ADAPTER_FILE, {"model": name, "model_key": report["model_key"]})
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
