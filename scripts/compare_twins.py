"""The papers' claims side by side across runs: the default run (``results/``) and every CPU-scale twin
(``results/twins/<name>/``), each claim's verdict with our estimate, its 95% interval and n.

    python scripts/compare_twins.py                 # prints Markdown; --out results/twins/README.md writes it

Reads each run's ``check.json`` only (written by its `check` stage); a run that has not been run is absent.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def runs(results: Path) -> dict[str, dict[str, Any]]:
    """``{run name: check.json}`` for the default run and each twin that has one."""
    found = {}
    if (results / "check.json").exists():
        found["default (cpu)"] = json.loads((results / "check.json").read_text())
    for path in sorted((results / "twins").glob("*/check.json")):
        found[path.parent.name] = json.loads(path.read_text())
    return found


def cell(claim: dict[str, Any] | None) -> str:
    if claim is None:
        return "–"
    ours = claim.get("ours") or {}
    if not isinstance(ours, dict) or ours.get("estimate") is None:
        return claim["verdict"]
    return (f"{claim['verdict']}: {ours['estimate']:.3g} [{ours.get('low', float('nan')):.3g}, "
            f"{ours.get('high', float('nan')):.3g}], n = {ours.get('n', '?')}")


def table(checks: dict[str, dict[str, Any]]) -> list[str]:
    names = list(checks)
    by_run = {name: {c["id"]: c for c in check.get("verdicts", []) if c.get("kind") != "figure"}
              for name, check in checks.items()}  # fmt: skip
    claims = sorted({claim for found in by_run.values() for claim in found})
    lines = ["| claim | paper | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    for claim in claims:
        first = next(found[claim] for found in by_run.values() if claim in found)
        lines.append(f"| {claim} | {(first.get('band') or {}).get('text', '')} | "
                     + " | ".join(cell(by_run[name].get(claim)) for name in names) + " |")
    summary = ["| run | " + " | ".join(["reproduced", "not reproduced", "inconclusive", "not measured"]) + " |",
               "|---|---:|---:|---:|---:|"]
    for name, check in checks.items():
        counts = check.get("summary_claims", {})
        summary.append(f"| {name} | " + " | ".join(str(counts.get(k, 0)) for k in
                                                   ("reproduced", "not reproduced", "inconclusive", "not measured"))
                       + " |")
    return ["# The papers' claims across runs", "", *summary, "", *lines, ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=ROOT / "results")
    parser.add_argument("--out", type=Path, help="write the Markdown here instead of printing it")
    args = parser.parse_args()
    checks = runs(args.results)
    if not checks:
        raise SystemExit(f"compare_twins: no check.json under {args.results} or its twins/*; run `dvc repro`")
    text = "\n".join(table(checks))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        print(f"compare_twins: {len(checks)} runs -> {args.out}")
    else:
        print(text)


if __name__ == "__main__":
    main()
