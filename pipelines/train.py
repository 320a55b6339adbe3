"""DVC stage `train`: finetune the base model with the LayerSkip or CALM early-exit recipe.

A role an experiment takes already trained (``source: hub`` / ``local``) is prepared like the base model
instead; a role it leaves out (``source: none``) gets a marker directory, so the DVC graph is the same
for every experiment.

    python pipelines/train.py --config build/config/train-layerskip.json --variant layerskip \
        --base-model models/base --data data --out models/layerskip \
        --checkpoints checkpoints/layerskip --report results/train/layerskip.json

Re-running resumes from the last checkpoint. Data-parallel: the same command under
``torchrun --nproc_per_node N`` with ``distributed: ddp`` (or ``fsdp``: sharded per decoder layer) in the variant.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch

from exitbench import config
from exitbench.cli import run_stage
from exitbench.config import load_stage
from exitbench.data.io import atomic_write_json
from exitbench.errors import ExitbenchError
from exitbench.models.sources import prepare_released, write_absent
from exitbench.training.distributed import launched_world_size
from exitbench.training.trainer import TrainPaths, train


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="build/config/train.json", help="resolved stage config")
    parser.add_argument("--variant", required=True, help="a key of train.variants")
    parser.add_argument("--base-model", default="models/base", help="prepared model directory")
    parser.add_argument("--data", default="data", help="prepared data directory")
    parser.add_argument("--out", help="trained model directory (default models/VARIANT)")
    parser.add_argument("--checkpoints", help="checkpoint directory (default checkpoints/VARIANT)")
    parser.add_argument("--report", help="training report (default results/train/VARIANT.json)")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    config = load_stage(args.config)
    variants = config.train.variants
    if args.variant not in variants:
        raise ExitbenchError(f"unknown variant '{args.variant}'; known: {', '.join(sorted(variants))}")
    world = launched_world_size()
    torch.set_num_threads(config.base.threads or max(1, (os.cpu_count() or 1) // world))
    paths = TrainPaths(
        base_model=Path(args.base_model),
        data=Path(args.data),
        out=Path(args.out or f"models/{args.variant}"),
        checkpoints=Path(args.checkpoints or f"checkpoints/{args.variant}"),
        report=Path(args.report or f"results/train/{args.variant}.json"),
    )
    variant = variants[args.variant]
    if variant.source != "train":
        obtain_untrained(args.variant, variant, config.experiment, paths)
        return
    report = train(variant, config.base, paths, name=args.variant, progress=not args.no_progress)
    if report is not None:
        ratio = report["step_time_ratio"]
        ratio_text = f", step-time ratio {ratio['ratio']:.2f}x vs plain" if ratio else ""
        print(
            f"train: {args.variant} {report['steps']} steps, final loss {report['final_loss']:.4f}"
            f"{ratio_text} -> {paths.out}, {paths.report}"
        )


def obtain_untrained(name: str, variant, experiment: str, paths: TrainPaths) -> None:
    """A released checkpoint (hub / local) prepared as is, or the marker of a role the experiment leaves out;
    the training report says which. The checkpoint directory (a DVC output) is made, and stays empty."""
    paths.checkpoints.mkdir(parents=True, exist_ok=True)
    if variant.source == "none":
        info = write_absent(paths.out, name, experiment)
        atomic_write_json(paths.report, {"variant": name, "source": "none", "trained": False, "why": info["why"]})
        print(f"train: {name} is not part of experiment '{experiment}' -> marker {paths.out}/absent.json")
        return
    info = prepare_released(variant.source, variant.hub_id, variant.revision, variant.local_path, paths.out,
                            key=f"train.variants.{name}")
    where = variant.hub_id if variant.source == "hub" else variant.local_path
    report = {"variant": name, "source": variant.source, "checkpoint": where, "trained": False,
              "num_layers": info["num_layers"], "num_parameters": info["num_parameters"]}
    atomic_write_json(paths.report, {**report, **twin_training(variant.local_path, name)})
    print(f"train: {name} = released checkpoint {where} ({info['num_layers']} layers), not trained -> {paths.out}")


def twin_training(local_path: str, name: str) -> dict:
    """For a model another twin trained (``from_twin``: models/twins/<twin>/<role>), that twin's name and its
    training report, where it is committed: how the model was trained travels with the results that use it."""
    twin = config.twin_of_checkpoint(local_path, name)
    if not twin:
        return {}
    source = Path(config.results_root_for("twin", twin)) / "train" / f"{name}.json"
    trained = json.loads(source.read_text()) if source.is_file() else None
    return {"from_twin": twin, "twin_training_report": trained}


if __name__ == "__main__":
    run_stage(main)
