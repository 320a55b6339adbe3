"""Stage `configure`: validate params.yaml and write each stage's resolved config to build/config/.

Validation covers types and keys, and that every model, task and method named exists (the registries of
:mod:`exitbench.tasks` and :mod:`exitbench.decoding`), so a typo fails here, before any stage computes.

It prints the plan first (:mod:`exitbench.plan`: each stage's work and estimated device time), and a
profile that runs on CUDA stops here, with one line, on a machine without it (unless the user opts in), as
does a CPU run whose estimate is past its ``budget.minutes``, and one whose hub checkpoints cannot be had (not
cached, unreachable, gated without a token).

Every other stage depends on its own file here, so switching profile re-runs exactly the stages whose
effective values changed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import yaml
from pydantic import ValidationError

from exitbench import config
from exitbench.cli import run_stage
from exitbench.data.io import atomic_write_text
from exitbench.decoding import REGISTRY, MethodOptions, method_class, parse_options
from exitbench.errors import ExitbenchError
from exitbench.models.sources import check_hub_access, sha256_file
from exitbench.models.trained import TRAINED_FILES
from exitbench.plan import (
    build_plan,
    check_cpu_budget,
    check_planned_exit_layers,
    hub_sources,
    render_plan,
    require_cuda,
)
from exitbench.stage_plan import method_stages, stage_code_view, stage_config_view
from exitbench.tasks.registry import TASKS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--out", default="build/config")
    parser.add_argument("--dvc-yaml", default="dvc.yaml", help="where the evaluate stages are listed")
    args = parser.parse_args()
    cfg = config.load(args.params)
    config.check_references(cfg, args.params, tasks=TASKS, methods=REGISTRY, parse_options=strict_options)
    staged = evaluate_stage_names(Path(args.dvc_yaml))
    check_method_stages(cfg, staged)
    check_trained_files(cfg)
    check_planned_exit_layers(cfg)
    plan = build_plan(cfg, lambda label: method_class(label).exact)
    for line in render_plan(cfg, plan):
        print(line)
    require_cuda(cfg, torch.cuda.is_available())
    check_cpu_budget(cfg, plan)
    check_hub_access(hub_sources(cfg))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for stage in config.STAGE_SECTIONS:
        view = config.stage_view(cfg, stage)
        atomic_write_text(out / f"{stage}.json", json.dumps(view, indent=2, sort_keys=True) + "\n")
    sources = {variant: source_checkpoint(cfg, variant) for variant in cfg.train.variants}
    for variant in cfg.train.variants:
        view = config.train_variant_view(cfg, variant)
        atomic_write_text(out / f"train-{variant}.json", json.dumps(view, indent=2, sort_keys=True) + "\n")
        atomic_write_text(out / f"train-{variant}.source.json", json.dumps(sources[variant], indent=2) + "\n")
    write_method_configs(cfg, staged, out / "evaluate")
    print(f"configure: profile '{cfg.profile}' -> {out}/ ({len(config.STAGE_SECTIONS)} stages)")


def source_checkpoint(cfg: config.Config, variant: str) -> dict:
    """What a role taken from a local checkpoint (another twin's trained model, ``from_twin``) is, by its weights'
    hashes: the train stage depends on this file, so it takes the model again when that twin trains it anew.
    Empty for any other source. A missing checkpoint stops here, naming the run that makes it."""
    spec = cfg.train.variants[variant]
    if spec.source != "local":
        return {}
    folder = Path(spec.local_path)
    weights = sorted(folder.glob("*.safetensors")) + sorted(folder.glob("*.bin"))
    if not weights:
        twin = config.twin_of_checkpoint(spec.local_path, variant)
        fix = (f"run that twin first: `python pipelines/use_profile.py twin --experiment {twin} && dvc repro train`"
               if twin else "point local_path at a Hugging Face checkpoint directory")
        raise ExitbenchError(f"train.variants.{variant}: no checkpoint at '{folder}'; {fix}")
    return {"local_path": spec.local_path, "sha256": {path.name: sha256_file(path) for path in weights}}


def strict_options(name: str, options: dict | None) -> MethodOptions:
    """A method's options validated as the config sections are (strict: ``true`` is not an integer, ``"2"``
    not a number; an integer is a valid float), so that no stage config carries a value the stage would
    coerce. Stages parse their own (already checked) options leniently."""
    parse_options(name, options)  # unknown options and values out of range, in the method's own words
    cls = method_class(name)
    try:
        return cls.Options.model_validate(options or {}, strict=True)
    except ValidationError as err:
        first = err.errors()[0]
        key = ".".join(str(part) for part in first["loc"])
        problem = config.type_error_text(first) or first["msg"]
        raise ExitbenchError(f"method '{name}': option '{key}': {problem} "
                             f"(options: {', '.join(sorted(cls.Options.model_fields))})") from None


def evaluate_stage_names(dvc_yaml: Path) -> list[str]:
    """The methods dvc.yaml evaluates: greedy (stage ``evaluate_greedy``) and the ``evaluate`` stage's ``foreach``
    list; empty without a dvc.yaml."""
    if not dvc_yaml.exists():
        return []
    stages = (yaml.safe_load(dvc_yaml.read_text()) or {}).get("stages", {})
    names = stages.get("evaluate", {}).get("foreach", [])
    return [*(["autoregressive"] if "evaluate_greedy" in stages else []), *(names if isinstance(names, list) else [])]


def check_method_stages(cfg: config.Config, staged: list[str]) -> None:
    """Every method params.yaml evaluates has its stage in dvc.yaml (when there is one): one line otherwise."""
    if not staged:
        return
    for stage in method_stages(cfg):
        if stage not in staged:
            labels = ", ".join(label for label in cfg.evaluate.methods if label.split("@", 1)[0] == stage)
            raise ExitbenchError(
                f"evaluate.methods: {labels or stage} has no evaluation stage; add '{stage}' to the foreach list "
                f"of the evaluate stage in dvc.yaml (stages there: {', '.join(staged)})"
            )


def check_trained_files(cfg: config.Config) -> None:
    """A method that reads a trained add-on (an option of ``models.trained.TRAINED_FILES``: Kangaroo's adapter,
    MindSkip's routers) has one for every model it runs on: ``<section>.models`` names them (one line otherwise)."""
    for label in cfg.evaluate.methods:
        for option in method_class(label).Options.model_fields:
            if (made := TRAINED_FILES.get(option)) is None:
                continue
            trained_for = getattr(cfg, made.section).models
            runs_on = cfg.evaluate.method_models.get(label, cfg.evaluate.models)
            if missing := [model for model in runs_on if model not in trained_for]:
                raise ExitbenchError(
                    f"evaluate.methods.{label} runs on {', '.join(missing)}, which {made.section}.models "
                    f"({', '.join(trained_for) or 'empty'}) trains no {made.what} for; add them there"
                )


def write_method_configs(cfg: config.Config, staged: list[str], out: Path) -> None:
    """``<out>/<method>.json`` (the stage's config) and ``<out>/<method>.code.json`` (the code identities of what it
    builds) for every evaluate stage: a stage that this profile does not run gets its config too (it writes an
    empty result), so that DVC finds every stage's dependencies."""
    out.mkdir(parents=True, exist_ok=True)
    for stage in dict.fromkeys([*method_stages(cfg), *staged]):
        for suffix, view in (("json", stage_config_view(cfg, stage)), ("code.json", stage_code_view(cfg, stage))):
            atomic_write_text(out / f"{stage}.{suffix}", json.dumps(view, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    run_stage(main)
