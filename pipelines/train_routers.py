"""Stage `train_routers`: MindSkip's routers for each model of ``routers.models``, trained on the frozen model.

    python pipelines/train_routers.py --config build/config/train_routers.json --models-dir models --data data \
        --out models/routers --checkpoints checkpoints/routers --reports results/routers

Writes ``<out>/<model>/routers.pt`` (read by evaluate's ``mindskip`` method) and ``<reports>/<model>.json`` (the
loss and capacity curves; on held-out text, the routed model's agreement with the full model, its skip rate per
layer, and the static control's at the same skip rate). A killed run resumes from ``<checkpoints>/<model>``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from exitbench.cli import run_stage, set_threads
from exitbench.config import load_stage, stage_view
from exitbench.data.io import atomic_write_json
from exitbench.identity import model_identity
from exitbench.models.router import ROUTER_FILE, DepthRouters, save_routers
from exitbench.models.trained import TRAINED_FILES
from exitbench.models.view import EarlyExitModel
from exitbench.provenance import provenance
from exitbench.training.frozen import prepare_run
from exitbench.training.router_training import train_routers


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="build/config/train_routers.json", help="resolved stage config")
    parser.add_argument("--models-dir", default="models", help="the prepared and trained models")
    parser.add_argument("--data", default="data", help="prepared data root")
    parser.add_argument("--out", default="models/routers", help=f"<out>/<model>/{ROUTER_FILE}")
    parser.add_argument("--checkpoints", default="checkpoints/routers", help="resumable state, per model")
    parser.add_argument("--reports", default="results/routers", help="<reports>/<model>.json")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)

    cfg = load_stage(args.config)
    set_threads(cfg.base.threads)
    out, reports, checkpoints = Path(args.out), Path(args.reports), Path(args.checkpoints)
    for folder in (out, reports, checkpoints):  # every output exists, with or without routers to train
        folder.mkdir(parents=True, exist_ok=True)
    r = cfg.routers
    if not r.models:
        print("train_routers: routers.models is empty; no routers to train")
    manifest = {}

    def build(model: EarlyExitModel) -> DepthRouters:
        num_routed = r.num_routed if r.num_routed is not None else model.num_layers // 2
        return DepthRouters(model, num_routed, r.granularity, r.threshold)

    made = TRAINED_FILES["router_file"]
    for name in r.models:
        run, counts = prepare_run(name, build, r, made, cfg.base, Path(args.models_dir), Path(args.data))
        routers = run.module
        report = train_routers(run, checkpoints / name, progress=not args.no_progress)
        report.update(
            model=name,
            model_key=model_identity(Path(args.models_dir) / name)[:16],
            corpus=counts,
            provenance=provenance(stage_view(cfg, "train_routers"), run.model.device, "float32"),
        )
        save_routers(routers, out / name / ROUTER_FILE, {"model": name, "model_key": report["model_key"]})
        atomic_write_json(reports / f"{name}.json", report)
        manifest[name] = {"file": f"{name}/{ROUTER_FILE}", "routed_layers": routers.layers}
        routed, control = report["routed"], report["static_control"]
        print(
            f"train_routers: {name}: {r.granularity} of layers {routers.layers[0]}..{routers.layers[-1]} routed; on "
            f"{report['held_out_positions']} held-out positions: capacity {routed['capacity']:.2f}, top-1 agreement "
            f"with the full model {routed['agreement']:.3f} (static skip of {control['skip']}: "
            f"{control['agreement']:.3f}) after {r.steps} steps ({report['seconds']:.0f} s) "
            f"-> {out / name / ROUTER_FILE}"
        )
    atomic_write_json(out / "routers.json", {"routers": manifest})  # the folder is never empty (DVC)


if __name__ == "__main__":
    run_stage(main)
