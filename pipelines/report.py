"""Stage `report`: result files -> results/README.md, results/tables/*.csv, results/metrics.json, results/plots/.

Reads JSON only (no model, no torch). Optional stages that did not run are reported as "not run"; a
malformed result file stops the stage with one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import sys

from exitbench.config import load_stage
from exitbench.errors import ExitbenchError
from exitbench.replications import load_replications
from exitbench.report.plots import write_plots
from exitbench.report.results import load_results
from exitbench.report.tables import write_text_outputs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", default="build/config/report.json")
    parser.add_argument("--results", default="results")
    parser.add_argument("--replications", default="replications")
    parser.add_argument("--out", default="results")
    args = parser.parse_args(argv)
    try:
        cfg = load_stage(args.config)
        papers = load_replications(args.replications)
        results = load_results(args.results)
        plots = write_plots(results, papers, f"{args.out}/plots")
        written = write_text_outputs(results, papers, args.out, cfg.profile, plots)
    except ExitbenchError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(
        f"report: {len(results.evals)} eval results -> {len(written)} text files, {len(plots)} plot files "
        f"under {args.out}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
