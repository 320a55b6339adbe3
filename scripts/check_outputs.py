"""After `dvc repro`: assert every stage's outputs exist and parse (CI: the smoke profile, and each paper
experiment's dry run through scripts/paper_dry_run.py)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from exitbench import config
from exitbench.decoding import base_method, method_class
from exitbench.report.results import EVAL_INPUT_FILES
from exitbench.stage_plan import FRAMEWORK_GREEDY, runs_on


def expected_files(cfg: config.Config) -> list[Path]:
    """Every file the stages write for ``cfg`` (relative to the repository root)."""
    files = [Path("models/base/model_info.json"), Path("models/draft/model_info.json"), Path("data/manifest.json")]
    files += [Path(f"results/train/{v}.json") for v in cfg.train.variants]
    files += [Path(f"results/probe/{m}.json") for m in ("base", *cfg.train.variants)]
    files += [Path(f"models/adapters/{m}/kangaroo.pt") for m in cfg.adapters.models]
    files += [Path(f"results/adapters/{m}.json") for m in cfg.adapters.models]
    files += [Path(f"models/routers/{m}/routers.pt") for m in cfg.routers.models]
    files += [Path(f"results/routers/{m}.json") for m in cfg.routers.models]
    for model in cfg.evaluate.models:
        for task in cfg.evaluate.tasks:
            files += [
                Path(f"results/eval/{base_method(method)}/{model}/{task}/{method}.json")
                for method in cfg.evaluate.methods
                if method == "autoregressive" or runs_on(cfg, method, model, task)
            ]
    files += [Path("results/bench/sweep.json"), Path("results/bench/sweep.csv")]
    files += [Path(f"results/calibrate/{m}.json") for m in cfg.calibrate.models]
    files += [Path("results/throughput/throughput.json"), Path("results/throughput/throughput.csv")]
    files += [Path("results/plots/throughput_vs_batch.png")]
    files += [
        Path("results/README.md"),
        Path("results/metrics.json"),
        Path("results/check.md"),
        Path("results/check.json"),
        Path("results/index.html"),
    ]
    return files


def throughput_problems(cfg: config.Config, path: Path) -> list[str]:
    """Every configured method (with a batched form) at every batch size, and no batched row that differs from
    its batch-1 tokens."""
    if not path.exists():
        return []
    data = json.loads(path.read_text())
    have = {(row["method"], row["batch_size"]) for row in data["rows"]}
    skipped = {s["what"] for s in data.get("skipped", [])}
    labels = ["autoregressive", *cfg.throughput.methods]
    problems = [
        f"{path}: no row for {label} at B={b}"
        for label in labels for b in cfg.throughput.batch_sizes
        if (label, b) not in have and label not in skipped and f"B={b}" not in skipped
    ]
    problems += [
        f"{path}: {row['method']} at B={row['batch_size']} differs from its B=1 tokens on {row['mismatches_vs_b1']}"
        " rows"
        for row in data["rows"] if row.get("mismatches_vs_b1")
    ]
    return problems


def output_problems(cfg: config.Config, root: Path = Path(".")) -> list[str]:
    """What is missing or wrong in the outputs under ``root`` for ``cfg`` (empty when all is well)."""
    problems = []
    for path in expected_files(cfg):
        if not (root / path).exists():
            problems.append(f"missing {path}")
        elif path.suffix == ".json":
            try:
                json.loads((root / path).read_text())
            except json.JSONDecodeError as err:
                problems.append(f"{path} is not valid JSON ({err})")
    for path in (root / "results/eval").glob("*/*/*/*.json"):  # eval/<stage>/<model>/<task>/<label>.json
        if path.name in EVAL_INPUT_FILES:
            continue
        summary = json.loads(path.read_text())
        correctness = summary.get("correctness", {})
        if correctness.get("exact_claimed") and summary.get("dtype") == "float32" and correctness.get("num_mismatched"):
            problems.append(f"{path}: an exact method mismatched greedy in float32 ({correctness['num_mismatched']})")
        own_greedy = path.parents[3] / FRAMEWORK_GREEDY / path.parent.parent.name / path.parent.name
        own_greedy = own_greedy / f"{FRAMEWORK_GREEDY}.json"
        framework = method_class(summary["method"]).framework if summary.get("method") else "exitbench"
        if framework != "exitbench" and path != own_greedy and own_greedy.exists():
            if summary["speed"].get("speedup_vs_framework_greedy") is None:
                problems.append(f"{path}: a transformers peer without its speed-up against {FRAMEWORK_GREEDY}")
    for path in (root / "results/calibrate").glob("*.json"):
        if not json.loads(path.read_text()).get("provenance", {}).get("num_parameters"):
            problems.append(f"{path}: provenance has no num_parameters (the check cannot compare model sizes)")
    problems += throughput_problems(cfg, root / "results/throughput/throughput.json")
    check_path = root / "results/check.json"
    text = json.dumps(json.loads(check_path.read_text())) if check_path.exists() else ""
    for figure in ("2.16", "1.82", "2.0"):
        if figure not in text:
            problems.append(f"results/check.json has no row for the paper's {figure}x figure")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--profile", default=None)
    args = parser.parse_args()
    cfg = config.load("params.yaml", profile=args.profile)
    problems = output_problems(cfg)
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    print(f"check_outputs: {len(expected_files(cfg))} files checked, {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
