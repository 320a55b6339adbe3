"""Stage `configure`: validate params.yaml and write each stage's resolved config to build/config/.

Validation covers types and keys, and that every model, task and method named exists (the registries of
:mod:`exitbench.tasks` and :mod:`exitbench.decoding`), so a typo fails here, before any stage computes.

It prints the plan first (:mod:`exitbench.plan`: each stage's work and estimated device-hours), and a
profile that runs on CUDA stops here, with one line, on a machine without it (unless the user opts in), as
does one whose hub checkpoints cannot be had (not cached, unreachable, gated without a token).

Every other stage depends on its own file here, so switching profile re-runs exactly the stages whose
effective values changed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from exitbench import config
from exitbench.cli import run_stage
from exitbench.data.io import atomic_write_text
from exitbench.decoding import REGISTRY, method_class, parse_options
from exitbench.models.sources import check_hub_access
from exitbench.plan import build_plan, hub_sources, render_plan, require_cuda
from exitbench.tasks.registry import TASKS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--out", default="build/config")
    args = parser.parse_args()
    cfg = config.load(args.params)
    config.check_references(cfg, args.params, tasks=TASKS, methods=REGISTRY, parse_options=parse_options)
    for line in render_plan(cfg, build_plan(cfg, lambda label: method_class(label).exact)):
        print(line)
    require_cuda(cfg, torch.cuda.is_available())
    check_hub_access(hub_sources(cfg))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for stage in config.STAGE_SECTIONS:
        view = config.stage_view(cfg, stage)
        atomic_write_text(out / f"{stage}.json", json.dumps(view, indent=2, sort_keys=True) + "\n")
    for variant in cfg.train.variants:
        view = config.train_variant_view(cfg, variant)
        atomic_write_text(out / f"train-{variant}.json", json.dumps(view, indent=2, sort_keys=True) + "\n")
    print(f"configure: profile '{cfg.profile}' -> {out}/ ({len(config.STAGE_SECTIONS)} stages)")


if __name__ == "__main__":
    run_stage(main)
