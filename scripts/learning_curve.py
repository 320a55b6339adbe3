"""Learning curve of a TOPv2 finetune on the CPU: snapshots of one run at several step counts, each measured
the way the pipeline measures a model.

One training run of ``--variant`` (a ``train.variants`` entry of the cpu profile, with ``--set`` overrides) is
stopped at each of ``--snapshots`` steps (the LR schedule is the full run's: these are points along one run, as
a learning curve is usually drawn), its weights saved, and measured on the stratified TOPv2 test sample:

- exact match at the last layer (greedy) and with early exit at each of ``--exit-layers``, and the early-exit
  quality fraction (EM at E over EM at the last layer, both on the same prompts);
- self-speculation's acceptance at each exit layer (d = 1, drafts over the whole vocabulary, the paper's
  setting) on the first ``--timing-samples`` prompts.

Each snapshot's entry carries n and 95% intervals (the pipeline's summaries) and the step time of the run.
Not a DVC stage: it chooses the step budget of the `topv2` twin (issue: CPU twins of the paper experiments).
Run it alone on the machine (step times are recorded). Resumable: a snapshot already in ``--out`` is kept and
training resumes from the run's last checkpoint.

    python scripts/learning_curve.py --variant plain --set corpus=topv2 --snapshots 50,100,200,400 \\
        --out results/learning_curves/topv2_plain.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from exitbench.cli import set_threads  # noqa: E402
from exitbench.config import Config, TaskEvalConfig, TrainVariant, load  # noqa: E402
from exitbench.data.io import atomic_write_json  # noqa: E402
from exitbench.evaluation import evaluate_model_task, load_context  # noqa: E402
from exitbench.provenance import provenance  # noqa: E402
from exitbench.training import distributed as dist_utils  # noqa: E402
from exitbench.training.trainer import TrainPaths, atomic_save_model, build_run, restore, train_loop  # noqa: E402

CORPORA = {"topv2": {"topv2": 1.0}, "mixture": None}


def variant_for(cfg: Config, name: str, overrides: dict[str, Any], steps: int) -> TrainVariant:
    """``train.variants.<name>`` of the cpu profile with ``overrides``, run for ``steps`` steps."""
    if name not in cfg.train.variants:
        raise SystemExit(f"--variant: no '{name}' in params.yaml train.variants ({', '.join(cfg.train.variants)})")
    data = {**cfg.train.variants[name].model_dump(), **overrides, "steps": steps, "control_of": None}
    data["timing_steps"] = 0
    return TrainVariant.model_validate(data)


def parse_sets(items: list[str]) -> dict[str, Any]:
    """``key=value`` overrides; ``corpus=topv2`` trains on TOPv2 only."""
    overrides: dict[str, Any] = {}
    for item in items:
        key, _, value = item.partition("=")
        if key == "corpus":
            if value not in CORPORA or CORPORA[value] is None:
                raise SystemExit(f"--set corpus={value}: one of {', '.join(k for k, v in CORPORA.items() if v)}")
            overrides[key] = CORPORA[value]
            continue
        for kind in (int, float):
            try:
                overrides[key] = kind(value)
                break
            except ValueError:
                continue
        else:
            overrides[key] = {"true": True, "false": False}.get(value, value)
    return overrides


def measure(cfg: Config, models: Path, name: str, data: Path, out: Path, exits: list[int], samples: int,
            timing: int) -> dict[str, Any]:
    """EM at the last layer and at each early exit, and self-speculation's acceptance at each exit (d = 1)."""
    tasks = {"topv2": TaskEvalConfig(num_samples=samples, timing_samples=timing, reference_samples=1,
                                     max_new_tokens=40)}
    methods: dict[str, dict[str, Any]] = {"autoregressive": {}}
    for layer in exits:
        methods[f"early_exit@{layer}"] = {"exit_layer": layer}
        methods[f"self_speculative@{layer}"] = {"exit_layer": layer, "num_speculations": 1}
    evaluate = cfg.evaluate.model_copy(update={
        "models": [name], "tasks": tasks, "methods": methods, "method_models": {}, "method_tasks": {},
        "method_samples": {}, "draft_vocab_size": 0, "chat_template_models": {},
    })
    eval_cfg = cfg.model_copy(update={"evaluate": evaluate})
    summaries = evaluate_model_task(eval_cfg, load_context(eval_cfg, models, name), "topv2", data, out / "eval")

    def interval(label: str, metric: str) -> dict[str, float]:
        found = summaries[label]["intervals"][metric]
        return {key: found[key] for key in ("estimate", "low", "high", "n")}

    result: dict[str, Any] = {"em_last": interval("autoregressive", "exact_match"), "sample_ids":
                              summaries["autoregressive"].get("sample_ids")}
    last = result["em_last"]["estimate"]
    for layer in exits:
        em = interval(f"early_exit@{layer}", "exact_match")
        result[f"em@{layer}"] = em
        result[f"em_fraction@{layer}"] = em["estimate"] / last if last else None
        result[f"acceptance@{layer}"] = interval(f"self_speculative@{layer}", "acceptance_rate")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", required=True, help="a train.variants key of params.yaml (plain, layerskip)")
    parser.add_argument("--set", action="append", default=[], help="key=value override (corpus=topv2, lr=4e-4)")
    parser.add_argument("--snapshots", required=True, help="comma-separated step counts; the last is the run's")
    parser.add_argument("--exit-layers", default="8,15,22", help="E/L = 0.25, 0.5, 0.75 of 30 layers")
    parser.add_argument("--samples", type=int, default=64, help="stratified TOPv2 test prompts")
    parser.add_argument("--timing-samples", type=int, default=32, help="prompts self-speculation runs on")
    parser.add_argument("--data", default="data")
    parser.add_argument("--base-model", default="models/base")
    parser.add_argument("--work", default="/tmp/exitbench-curve", help="snapshots and checkpoints")
    parser.add_argument("--out", required=True, help="JSON, rewritten after each snapshot")
    args = parser.parse_args()

    snapshots = sorted({int(step) for step in args.snapshots.split(",")})
    exits = [int(layer) for layer in args.exit_layers.split(",")]
    cfg = load(ROOT / "params.yaml", "cpu")
    set_threads(cfg.base.threads)
    overrides = parse_sets(args.set)
    variant = variant_for(cfg, args.variant, overrides, snapshots[-1])
    work, out = Path(args.work), Path(args.out)
    report = json.loads(out.read_text()) if out.exists() else {}
    done = {entry["step"] for entry in report.get("snapshots", [])}
    report.update({"variant": args.variant, "overrides": overrides, "config": variant.model_dump(mode="json"),
                   "exit_layers": exits, "snapshots": report.get("snapshots", [])})
    name = f"curve-{args.variant}"
    paths = TrainPaths(Path(args.base_model), Path(args.data), work / "models" / name, work / "checkpoints" / name,
                       work / "train" / f"{name}.json")
    torch.manual_seed(cfg.base.seed)
    with dist_utils.session("none", torch.device("cpu")) as ctx:
        run, tokenizer = build_run(variant, cfg.base, paths, ctx)
        state = restore(run, paths.checkpoints)
        for step in snapshots:
            if step in done:
                continue
            if state.step > step:
                raise SystemExit(f"the run is at step {state.step}, past snapshot {step}: delete {paths.checkpoints}")
            started = time.perf_counter()
            state = train_loop(run, state, paths.checkpoints, step, progress=True)
            trained_s = time.perf_counter() - started
            snapshot = work / "models" / f"{name}-{step}"
            atomic_save_model(run.objective.lm, tokenizer, snapshot)
            run.objective.lm.train()
            started = time.perf_counter()
            entry = measure(cfg, work / "models", snapshot.name, Path(args.data), work, exits, args.samples,
                            args.timing_samples)
            times = state.step_times
            entry = {"step": step, "examples_seen": step * variant.batch_size * variant.grad_accum,
                     "s_per_step": sum(times) / len(times) if times else None, "segment_train_s": trained_s,
                     "measure_s": time.perf_counter() - started,
                     "final_loss": state.history[-1]["loss"] if state.history else None, **entry}
            report["snapshots"].append(entry)
            report["snapshots"].sort(key=lambda item: item["step"])
            report["provenance"] = provenance(variant.model_dump(mode="json"))
            out.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_json(out, report)
            fractions = ", ".join(f"E{layer} EM {entry[f'em@{layer}']['estimate']:.2f} acc "
                                  f"{entry[f'acceptance@{layer}']['estimate']:.2f}" for layer in exits)
            print(f"{name} step {step}: EM {entry['em_last']['estimate']:.3f} (n={entry['em_last']['n']}); "
                  f"{fractions}; {entry['s_per_step']:.2f} s/step", flush=True)


if __name__ == "__main__":
    main()
