"""Stage `bench_decoding`: the exit layer x speculations sweep, timed against greedy -> results/bench/sweep.{csv,json}.

    python pipelines/bench_decoding.py --config build/config/bench_decoding.json --models-dir models \
        --data data --out results/bench

Prints one line per row; a user-fixable problem prints ``error: <message>`` on stderr and exits with 2.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from exitbench.bench import bench_bandwidths, run_bench
from exitbench.cli import run_stage, set_threads
from exitbench.config import load_stage


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="build/config/bench_decoding.json", help="the stage's resolved config")
    parser.add_argument("--models-dir", default="models")
    parser.add_argument("--data", default="data")
    parser.add_argument("--train-reports", default="results/train",
                        help="training reports: a model trained with exit_vocab_size drafts over its exits' set")
    parser.add_argument("--out", default="results/bench")
    args = parser.parse_args()
    start = time.perf_counter()
    cfg = load_stage(args.config)
    threads = set_threads(cfg.base.threads)
    reports = Path(args.train_reports)
    rows = run_bench(cfg, Path(args.models_dir), Path(args.data), Path(args.out), train_reports=reports)
    for row in rows:
        where = f"{row['model']:>10} {row['dtype']:>8} {row['method']:>16} E={_fmt(row['exit_layer'], '>2')} "
        where += f"d={_fmt(row['num_speculations'], '>2')}"
        print(
            f"{where}: {row['time_per_token_ms']:7.2f} ms/token, {_fmt(row['speedup_vs_greedy'], '.2f')}x, "
            f"acc {_fmt(row['acceptance_rate'], '.2f')}, ideal {_fmt(row['ideal_fraction'], '.2f')}, "
            f"roofline {_fmt(row['roofline_fraction'], '.0%')}, exact {row['exact']}"
        )
    for dtype, measured in bench_bandwidths(Path(args.out)).items():
        print(f"memory bandwidth ({dtype}, STREAM triad): {measured['gb_per_s']:.1f} GB/s")
    print(f"bench_decoding: {len(rows)} rows, {threads} threads, {time.perf_counter() - start:.0f}s -> {args.out}/")


if __name__ == "__main__":
    run_stage(main)
