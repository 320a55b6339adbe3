"""Stage `evaluate`: every model x task x method from params.yaml -> results/eval/<model>/<task>/<method>.json."""

from __future__ import annotations

import argparse
from pathlib import Path

from exitbench.cli import run_stage, set_threads
from exitbench.config import load_stage
from exitbench.evaluation import evaluate_all


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", default="build/config/evaluate.json")
    parser.add_argument("--models-dir", default="models")
    parser.add_argument("--data", default="data")
    parser.add_argument("--out", default="results/eval")
    args = parser.parse_args()
    cfg = load_stage(args.config)
    set_threads(cfg.base.threads)
    rows = evaluate_all(cfg, Path(args.models_dir), Path(args.data), Path(args.out))
    for row in rows:
        speedup = row["speedup_vs_greedy"]
        shown = f"{speedup:.2f}x" if speedup is not None else "-"
        where = f"{row['model']:>10} {row['task']:>9} {row['method']:>17}"
        print(f"{where}: {row['time_per_token_ms']:.1f} ms/token, {shown}")


if __name__ == "__main__":
    run_stage(main)
