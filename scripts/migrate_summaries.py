"""One-off migration of evaluate summaries of schema 1 to schema 2 (``exitbench.summaries.SUMMARY_SCHEMA``).

Schema 1 summaries did not state their task's primary metric nor whose ``generate()`` ran, and wrote
``quality_from`` as a sentence (``"autoregressive (exact method; measured on the timing sample of 4)"``). The
report reads schema 2 only, so that it guesses nothing; this script adds what schema 2 states, from the task and
method registries and the summary itself, and leaves every number as it is. Idempotent.

    python scripts/migrate_summaries.py results            # every results/**/eval/<stage>/<model>/<task>/<label>.json
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from exitbench.data.io import atomic_write_json
from exitbench.decoding import method_class
from exitbench.summaries import SUMMARY_SCHEMA
from exitbench.tasks.registry import TASKS

SENTENCE = re.compile(r"^(?P<method>\S+) \((?P<why>exact method; measured on the timing sample of (?P<n>\d+))\)$")


def migrated(summary: dict[str, Any]) -> dict[str, Any] | None:
    """The summary at schema 2, or None where it is not an older summary (already migrated, or another file)."""
    if "speed" not in summary or summary.get("schema_version", 1) >= SUMMARY_SCHEMA:
        return None
    out = {**summary, "schema_version": SUMMARY_SCHEMA}
    out["primary_metric"] = TASKS[summary["task"]].primary_metric
    out["framework"] = method_class(summary["method"]).framework
    source = summary.get("quality_from")
    if isinstance(source, str):
        match = SENTENCE.match(source)
        if match is None:
            raise ValueError(f"quality_from {source!r} is not the sentence schema 1 wrote")
        out["quality_from"] = {
            "method": match["method"],
            "n": summary.get("num_quality_samples"),
            "why": f"exact method: its tokens are greedy's; its own quality on the timing sample of {match['n']} "
            "is quality_measured",
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", type=Path, nargs="+", help="results folders (their eval/ trees are searched)")
    args = parser.parse_args(argv)
    changed = seen = 0
    for root in args.results:
        for path in sorted(root.glob("**/eval/*/*/*/*.json")):
            try:
                summary = json.loads(path.read_text())
                new = migrated(summary) if isinstance(summary, dict) else None
            except (KeyError, ValueError) as err:
                print(f"error: {path}: {err}", file=sys.stderr)
                return 2
            seen += isinstance(summary, dict) and "speed" in summary
            if new is not None:
                atomic_write_json(path, new)
                changed += 1
    print(f"migrate_summaries: {changed} of {seen} summaries migrated to schema {SUMMARY_SCHEMA}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
