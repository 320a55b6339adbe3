"""Did a change to a method's code change what it generates? Compare the records two code versions stored.

A method's records are keyed by its code (exitbench/identity.py), so after a refactor `evaluate` regenerates them
beside the old ones in the same record files (or in a copy of the eval folder made before the run). For every
record file, this pairs each settings key that only the new folder holds with each key of the old folder, prompt
by prompt (sample id), and counts the prompts whose tokens, and whose round counters (rounds, drafted, accepted,
acceptance histogram, layer calls), are equal:

    python scripts/compare_records.py OLD_EVAL_DIR NEW_EVAL_DIR   # e.g. results/twins/<twin>/eval

Exit status 1 when a pair differs on any shared prompt.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

COUNTERS = ("num_rounds", "num_drafted", "num_accepted", "acceptance_histogram", "layer_calls")


def records_by_key(path: Path) -> dict[str, dict[str, dict]]:
    """settings key -> sample id -> record, for one ``*.jsonl`` record file."""
    by_key: dict[str, dict[str, dict]] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            by_key.setdefault(record["settings_key"], {})[record["sample_id"]] = record
    return by_key


def compare(old_dir: Path, new_dir: Path) -> list[dict]:
    rows = []
    for new_file in sorted(new_dir.rglob("*.jsonl")):
        old_file = old_dir / new_file.relative_to(new_dir)
        if not old_file.exists():
            continue
        old, new = records_by_key(old_file), records_by_key(new_file)
        for new_key in (key for key in new if key not in old):
            for old_key, old_records in old.items():
                shared = sorted(set(new[new_key]) & set(old_records))
                if not shared:
                    continue
                pairs = [(new[new_key][s], old_records[s]) for s in shared]
                rows.append(
                    {
                        "file": str(new_file.relative_to(new_dir)),
                        "new_key": new_key,
                        "old_key": old_key,
                        "prompts": len(shared),
                        "tokens_equal": sum(a["tokens"] == b["tokens"] for a, b in pairs),
                        "counters_equal": sum(
                            all(a["decode"].get(f) == b["decode"].get(f) for f in COUNTERS) for a, b in pairs
                        ),
                    }
                )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", type=Path, help="the eval folder (or a copy) before the change")
    parser.add_argument("new", type=Path, help="the eval folder after evaluate ran the changed code")
    args = parser.parse_args()
    rows = compare(args.old, args.new)
    for r in rows:
        print(
            f"{r['file']}: {r['prompts']} prompts, tokens equal {r['tokens_equal']}, round counters equal "
            f"{r['counters_equal']} (new key {r['new_key']} vs old {r['old_key']})"
        )
    if not rows:
        print("no settings key of the new folder pairs with one of the old folder on a shared prompt")
    return int(any(r["tokens_equal"] < r["prompts"] or r["counters_equal"] < r["prompts"] for r in rows))


if __name__ == "__main__":
    raise SystemExit(main())
