"""Stage `page`: results/README.md, results/check.md and the per-sample records -> results/index.html.

One page to look at: the report's and the check's tables (sortable), the plots, and each (model, task)'s first
samples with every method's output beside greedy's. Reads JSON and Markdown only (no model, no torch).
"""

from __future__ import annotations

import argparse
import sys

from exitbench.config import load_stage
from exitbench.errors import ExitbenchError
from exitbench.report.page import page_summary, write_page


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", default="build/config/report.json", help="for base.seed (the samples' draw)")
    parser.add_argument("--results", default="results")
    parser.add_argument("--data", default="data")
    parser.add_argument("--out", default="results/index.html")
    args = parser.parse_args(argv)
    try:
        seed = load_stage(args.config).base.seed
        path = write_page(args.results, args.data, args.out, seed)
    except (ExitbenchError, OSError, ValueError) as err:
        print(f"error: page: {err}", file=sys.stderr)
        return 2
    print(f"page: {path} ({page_summary(path)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
