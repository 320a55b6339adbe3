"""Stage `check`: every claim and published figure in replications/*.yaml vs this profile's results ->
check.md/.json (claims first: they do not depend on hardware kind or model size).

A figure or claim that is not reproduced is a result (exit 0); only a broken input (missing results
directory, malformed result or replication file) fails, with one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import sys

from exitbench.config import load_stage
from exitbench.errors import ExitbenchError
from exitbench.replications import load_replications
from exitbench.report.check import run_check
from exitbench.report.claims import run_claims
from exitbench.report.results import load_results
from exitbench.report.verdicts import split, summarize, write_check


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", default="build/config/check.json")
    parser.add_argument("--results", default="results")
    parser.add_argument("--replications", default="replications")
    parser.add_argument("--out", default="results")
    args = parser.parse_args(argv)
    try:
        cfg = load_stage(args.config)
        papers = load_replications(args.replications)
        results = load_results(args.results)
        tolerance = cfg.check.default_tolerance
        verdicts = [*run_claims(papers, results), *run_check(papers, results, tolerance)]
        md_path, json_path = write_check(verdicts, papers, args.out, tolerance, cfg.profile, args.replications)
    except ExitbenchError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    claims, own, figures = split(verdicts)
    counts = ", ".join(f"{name}: {n}" for name, n in summarize([*claims, *figures]).items())
    print(f"check: {len(claims)} claim and {len(figures)} figure verdicts ({counts}; {len(own)} on the papers' own "
          f"consistency, apart) -> {md_path}, {json_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
