"""Stage `throughput`: batched decoding at each batch size, every method beside greedy -> results/throughput/.

    python pipelines/throughput.py --config build/config/throughput.json --models-dir models --data data \
        --out results/throughput

Prints one line per (method, B); a user-fixable problem prints ``error: <message>`` on stderr and exits with 2.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from exitbench.cli import run_stage, set_threads
from exitbench.config import load_stage
from exitbench.throughput import run_throughput


def _fmt(value: float | int | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="build/config/throughput.json", help="the stage's resolved config")
    parser.add_argument("--models-dir", default="models")
    parser.add_argument("--data", default="data")
    parser.add_argument("--train-reports", default="results/train",
                        help="training reports: a model trained with exit_vocab_size drafts over its exits' set")
    parser.add_argument("--out", default="results/throughput")
    args = parser.parse_args()
    start = time.perf_counter()
    cfg = load_stage(args.config)
    threads = set_threads(cfg.base.threads)
    reports = Path(args.train_reports)
    report = run_throughput(cfg, Path(args.models_dir), Path(args.data), Path(args.out), train_reports=reports)
    for row in report["rows"]:
        print(
            f"{row['method']:>18} B={row['batch_size']:>3}: {row['tokens_per_s']:7.1f} tokens/s, "
            f"{_fmt(row['speedup_vs_greedy'], '.2f')}x greedy at this B "
            f"[{_fmt(row['speedup_vs_greedy_low'], '.2f')}, {_fmt(row['speedup_vs_greedy_high'], '.2f')}], "
            f"mismatches vs B=1 {_fmt(row['mismatches_vs_b1'], 'd')}, "
            f"vs greedy {_fmt(row['mismatches_vs_greedy_b1'], 'd')}"
        )
    elapsed = time.perf_counter() - start
    print(f"throughput: {len(report['rows'])} rows, {threads} threads, {elapsed:.0f}s -> {args.out}/")


if __name__ == "__main__":
    run_stage(main)
