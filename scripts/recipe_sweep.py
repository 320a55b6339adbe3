"""Short training-recipe sweep: which settings buy TOPv2 quality and early-exit agreement per CPU-minute.

Each run is a ``train.variants`` entry of the active params with a few settings changed (``--run
NAME:BASE:key=value,...``), trained for ``--steps`` steps, then measured the way the pipeline measures it:

- TOPv2 exact match at the last layer and with early exit at E (greedy, the stratified test sample of
  ``--samples`` ids, identical for every run), with 95% bootstrap intervals;
- top-1 agreement of layer E with the last layer on TOPv2 eval targets (the probe's ``topv2_target``; what a
  self-speculative draft's acceptance follows);
- training seconds per step and trained tokens per second.

Not a DVC stage: it informs the choice of the cpu profile's recipe (docs/training.md, "Training recipe sweep").
Run one sweep at a time with nothing else on the machine (step times are measured).

    python scripts/recipe_sweep.py --steps 120 --out /tmp/sweep.json \\
        --run plain:plain: --run plain_lr3:plain:lr=3e-4
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from exitbench.cli import set_threads  # noqa: E402
from exitbench.config import Config, TaskEvalConfig, TrainVariant, load  # noqa: E402
from exitbench.evaluation import evaluate_model_task, load_context  # noqa: E402
from exitbench.models.load import load_early_exit_model, load_tokenizer  # noqa: E402
from exitbench.probe import load_topv2_pairs, probe_prompt_target  # noqa: E402
from exitbench.training.trainer import TrainPaths, train  # noqa: E402


def _scalar(text: str) -> Any:
    """A setting's value: an int or float when it reads as one (``4e-4`` too), else YAML (true, names)."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return yaml.safe_load(text)


def parse_run(spec: str) -> tuple[str, str, dict[str, Any]]:
    """``NAME:BASE:key=value,key=value`` -> (name, base variant, overrides parsed as YAML scalars)."""
    try:
        name, base, settings = spec.split(":", 2)
    except ValueError:
        raise SystemExit(f"--run {spec!r}: expected NAME:BASE_VARIANT:key=value,... (settings may be empty)") from None
    overrides = {}
    for item in filter(None, settings.split(",")):
        key, _, value = item.partition("=")
        overrides[key.strip()] = _scalar(value)
    return name, base, overrides


def variant_for(cfg: Config, base: str, overrides: dict[str, Any], steps: int) -> TrainVariant:
    if base not in cfg.train.variants:
        raise SystemExit(f"--run: no variant '{base}' in params.yaml train.variants ({', '.join(cfg.train.variants)})")
    data = {**cfg.train.variants[base].model_dump(), **overrides, "steps": steps, "control_of": None}
    data["warmup_steps"] = min(data["warmup_steps"], max(steps // 10, 1))
    data["checkpoint_every"] = steps
    data["timing_steps"] = 0  # the plain-vs-early-exit step-time ratio is train@<variant>'s job
    return TrainVariant.model_validate(data)


def measure(
    cfg: Config, models: Path, name: str, data: Path, out: Path, exit_layer: int, samples: int, timing: int
) -> dict:
    """TOPv2 EM at the last layer and at early exit E, layer E's agreement with the last on eval targets, and
    self-speculation's acceptance at (E, d=1) with the pipeline's draft sub-vocabulary (a run trained with
    ``exit_vocab_size``: its exits' set, as the pipeline drafts it) on the first ``timing`` prompts (exits trained
    over a sub-vocabulary are judged by the draft they feed, not by full-vocabulary agreement, which counts their
    untrained logits outside the set)."""
    tasks = {"topv2": TaskEvalConfig(num_samples=samples, timing_samples=timing, max_new_tokens=40)}
    methods = {
        "autoregressive": {},
        f"early_exit@{exit_layer}": {"exit_layer": exit_layer},
        "self_speculative": {"exit_layer": exit_layer, "num_speculations": 1},
    }
    evaluate = cfg.evaluate.model_copy(update={"models": [name], "tasks": tasks, "methods": methods,
                                               "method_models": {}, "method_tasks": {}, "method_samples": {}})
    eval_cfg = cfg.model_copy(update={"evaluate": evaluate})
    ctx = load_context(eval_cfg, models, name, train_reports=out / "train")  # drafts over a trained exit set
    summaries = evaluate_model_task(eval_cfg, ctx, "topv2", data, out / "eval")
    model = load_early_exit_model(models / name, cfg.base.dtype, cfg.base.device)
    pairs = load_topv2_pairs(data / "topv2" / "eval.jsonl", cfg.probe.topv2_rows)
    probe = probe_prompt_target(model, load_tokenizer(models / name), pairs, "topv2", cfg.probe.max_tokens)
    agreement = probe["topv2_target"]["top1_agreement"]
    result = {"agreement_at_exit": agreement[exit_layer - 1], "exit_layer": exit_layer}
    for label, summary in summaries.items():
        interval = summary["intervals"]["exact_match"]
        result[f"em/{label}"] = {key: interval[key] for key in ("estimate", "low", "high", "n")}
    spec = summaries["self_speculative"]["intervals"]
    for key in ("acceptance_rate", "speedup_vs_greedy"):
        result[f"self_speculative/{key}"] = {k: spec[key][k] for k in ("estimate", "low", "high", "n")}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", action="append", required=True, help="NAME:BASE_VARIANT:key=value,...")
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--samples", type=int, default=64, help="stratified TOPv2 test prompts")
    parser.add_argument("--exit-layer", type=int, default=12)
    parser.add_argument("--timing-samples", type=int, default=32, help="prompts self-speculation runs on")
    parser.add_argument("--data", default="data")
    parser.add_argument("--base-model", default="models/base")
    parser.add_argument("--work", default="/tmp/exitbench-sweep", help="models and checkpoints of the runs")
    parser.add_argument("--out", required=True, help="JSON with one entry per run (rewritten after each)")
    args = parser.parse_args()

    cfg = load(ROOT / "params.yaml", "cpu")
    set_threads(cfg.base.threads)
    work, out = Path(args.work), Path(args.out)
    results = json.loads(out.read_text()) if out.exists() else {}
    for spec in args.run:
        name, base, overrides = parse_run(spec)
        if name in results:
            print(f"{name}: done before, kept", flush=True)
            continue
        variant = variant_for(cfg, base, overrides, args.steps)
        paths = TrainPaths(Path(args.base_model), Path(args.data), work / "models" / name,
                           work / "checkpoints" / name, work / "train" / f"{name}.json")
        if (paths.out / "config.json").exists() and paths.report.exists():  # trained before a failed measurement
            print(f"{name}: trained before ({paths.report}), measuring it", flush=True)
            report = json.loads(paths.report.read_text())  # (the trainer deletes its checkpoints when it finishes)
        else:
            report = train(variant, cfg.base, paths, name=name, progress=False)
        train_s = report["time_per_step_s"]["total"]  # the steps' own time (the report's, also of an earlier run)
        entry = {
            "base": base, "overrides": overrides, "steps": args.steps,
            "train_s": train_s, "s_per_step": report["time_per_step_s"]["mean"],
            "tokens_per_s": report["tokens"]["trained_tokens"] / report["time_per_step_s"]["total"],
            "final_exit_losses": report["final_exit_losses"],
            **measure(
                cfg, work / "models", name, Path(args.data), work, args.exit_layer, args.samples, args.timing_samples
            ),
        }
        results[name] = entry
        out.write_text(json.dumps(results, indent=2) + "\n")
        em = entry["em/autoregressive"]
        print(f"{name}: {entry['s_per_step']:.2f} s/step, EM {em['estimate']:.3f} [{em['low']:.3f}, {em['high']:.3f}]"
              f", EM@{args.exit_layer} {entry[f'em/early_exit@{args.exit_layer}']['estimate']:.3f}, agreement@"
              f"{args.exit_layer} {entry['agreement_at_exit']:.3f}, acceptance "
              f"{entry['self_speculative/acceptance_rate']['estimate']:.3f}", flush=True)
        shutil.rmtree(paths.out, ignore_errors=True)


if __name__ == "__main__":
    main()
