"""Stage `calibrate`: CALM's risk-controlled exit thresholds (CALM §4) -> results/calibrate/<model>.json.

    python pipelines/calibrate.py --config build/config/calibrate.json --models-dir models --data data \
        --out results/calibrate --generations checkpoints/calibrate

Every finished generation is appended to checkpoints/calibrate/<model>/generations.jsonl, so a rerun after a
kill makes only the missing ones (DVC keeps the folder: ``persist: true``). Speed-ups are decode-phase
times per token, greedy and calm continuing one shared prefill per prompt. Prints one line per (model, task,
measure, kv_strategy, delta); a user-fixable problem prints ``error: <message>`` on stderr and exits with
status 2.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from exitbench.calm_calibration import run_calibrate_stage, summary_line
from exitbench.cli import run_stage, set_threads
from exitbench.config import load_stage


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="build/config/calibrate.json", help="the stage's resolved config")
    parser.add_argument("--models-dir", default="models")
    parser.add_argument("--data", default="data")
    parser.add_argument("--out", default="results/calibrate")
    parser.add_argument("--classifiers", default="build/classifiers",
                        help="where trained early-exit classifiers go (measure 'classifier')")
    parser.add_argument("--generations", default="checkpoints/calibrate",
                        help="the resumable store of finished generations (not a result; git-ignored)")
    args = parser.parse_args()
    start = time.perf_counter()
    cfg = load_stage(args.config)
    set_threads(cfg.base.threads)
    rows = run_calibrate_stage(
        cfg, Path(args.models_dir), Path(args.data), Path(args.out), Path(args.classifiers), Path(args.generations)
    )
    for row in rows:
        print(summary_line(row))
    print(f"calibrate: {len(rows)} results in {time.perf_counter() - start:.0f}s -> {args.out}/")


if __name__ == "__main__":
    run_stage(main)
