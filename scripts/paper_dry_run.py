"""The paper profile's dry run: every experiment's whole DVC graph, offline on a CPU, with tiny stand-ins.

    EXITBENCH_DATA_MIRROR=../shared/data python scripts/paper_dry_run.py [--experiment NAME ...]

In a scratch copy of the repository (the working tree as it is, committed or not) it makes a random-weight
stand-in of every hub checkpoint the experiments name (their real layer counts; exitbench.models.standins),
then for each experiment: `use_profile.py paper_dry --experiment NAME` (the paper profile's settings with
every count cut by `profiles.paper_dry.shrink`) and `dvc repro`, and asserts what the paper profile would
produce: every stage of dvc.yaml ran and is up to date, each result file the experiment's settings imply
exists and parses (scripts/check_outputs.py: every model x task x method summary, training reports, probes,
calibrations, throughput rows; exact methods match greedy in float32), and
`results/check.json` has a measured verdict for every replication row the experiment names. Experiments run
one after another in the same copy, so DVC reruns only what the switch changes (as a user's would).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from exitbench import config  # noqa: E402
from exitbench.errors import ExitbenchError  # noqa: E402
from exitbench.models.standins import STANDINS_ENV, experiment_hub_ids, make_standin  # noqa: E402
from scripts.check_outputs import output_problems  # noqa: E402

NOT_MEASURED = "not measured"


def run(command: list[str], cwd: Path, env: dict[str, str], log: Path) -> None:
    with log.open("a") as out:
        out.write(f"\n$ {' '.join(command)}\n")
        out.flush()
        done = subprocess.run(command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0:
        tail = "\n".join(log.read_text().splitlines()[-25:])
        raise SystemExit(f"paper dry run: `{' '.join(command)}` failed ({done.returncode}); log {log}:\n{tail}")


def copy_tree(dest: Path) -> None:
    """The working tree's tracked and untracked-but-not-ignored files, as a fresh git repository."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, capture_output=True, check=True,
    ).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    for args in (["init", "-q"], ["add", "-A"], ["-c", "user.name=dry", "-c", "user.email=dry@run", "commit", "-qm",
                                                   "dry run"]):
        subprocess.run(["git", *args], cwd=dest, check=True, capture_output=True)
    # the copy's results are the dry run's own: start without the committed cpu results
    for name in ("results", "dvc.lock"):
        path = dest / name
        shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)


def check_experiment(copy: Path, name: str, experiment: config.Experiment) -> list[str]:
    """What the dry run of ``name`` lacks (empty when it produced everything the paper profile would)."""
    problems = []
    cfg = config.load(copy / "params.yaml")
    status = subprocess.run(["dvc", "status", "--json"], cwd=copy, capture_output=True, text=True, check=False)
    if status.returncode != 0 or json.loads(status.stdout or "{}"):
        problems.append(f"dvc status is not clean after dvc repro: {status.stdout.strip()[:300]}")

    stages = set((yaml.safe_load((copy / "dvc.lock").read_text()) or {}).get("stages", {}))
    defined = subprocess.run(["dvc", "stage", "list", "--name-only"], cwd=copy, capture_output=True, text=True,
                             check=True).stdout.split()
    problems += [f"stage {stage} did not run (not in dvc.lock)" for stage in defined if stage not in stages]
    problems += output_problems(cfg, copy)  # the files every stage writes, as CI checks the smoke run's
    check = json.loads((copy / "results/check.json").read_text()) if (copy / "results/check.json").exists() else {}
    verdicts: dict[str, list[dict]] = {}
    for row in check.get("verdicts", []):
        if row.get("kind") == "figure":
            verdicts.setdefault(row["id"], []).append(row)
    for row_id in experiment.rows:
        got = verdicts.get(row_id)
        if not got:
            problems.append(f"check.json has no verdict for row {row_id}")
        elif not any(row_is_measured(row) for row in got):
            reasons = "; ".join(sorted({row.get("reasons", "") for row in got} - {""}))
            problems.append(f"row {row_id} is not measured ({reasons or 'no reason given'})")
    return problems


def row_is_measured(row: dict) -> bool:
    """The graph produced our number for the row. A dry run's shrunken counts time fewer prompts than a quoted
    speed-up needs, so a verdict of "not measured" that still carries our figure counts as measured here."""
    return row["verdict"] != NOT_MEASURED or row.get("ours") is not None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiment", action="append", help="only these (default: every paper experiment)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch copy (its path is printed)")
    args = parser.parse_args()
    if not os.environ.get("EXITBENCH_DATA_MIRROR"):
        raise SystemExit("paper dry run: set EXITBENCH_DATA_MIRROR to the offline data mirror (e.g. ../shared/data)")
    try:
        experiments = config.experiments_of(REPO / "params.yaml")
    except ExitbenchError as err:
        raise SystemExit(f"paper dry run: {err}") from None
    chosen = args.experiment or [name for name, e in experiments.items() if e.profile == "paper"]
    unknown = [name for name in chosen if name not in experiments]
    if unknown:
        raise SystemExit(f"paper dry run: unknown experiment(s) {unknown}; params.yaml has {', '.join(experiments)}")
    scratch = Path(tempfile.mkdtemp(prefix="exitbench-paper-dry-"))
    copy, standins, log = scratch / "repo", scratch / "standins", scratch / "dry_run.log"
    copy.mkdir()
    copy_tree(copy)
    for hub_id in experiment_hub_ids(REPO / "params.yaml"):
        make_standin(hub_id, standins)
    env = {**os.environ, STANDINS_ENV: str(standins), "PYTHONPATH": str(copy)}
    failures = {}
    for name in chosen:
        started = time.time()
        run([sys.executable, "pipelines/use_profile.py", "paper_dry", "--experiment", name], copy, env, log)
        run(["dvc", "repro"], copy, env, log)
        problems = check_experiment(copy, name, experiments[name])
        if problems:
            failures[name] = problems
        state = "ok" if not problems else f"{len(problems)} problem(s)"
        print(f"paper dry run: {name}: {state} in {time.time() - started:.0f} s "
              f"({len(experiments[name].rows)} replication rows measured)", flush=True)
    if not args.keep and not failures:
        shutil.rmtree(scratch, ignore_errors=True)
    else:
        print(f"paper dry run: scratch copy kept at {scratch} (log {log})")
    if failures:
        for name, problems in failures.items():
            for problem in problems:
                print(f"paper dry run: {name}: {problem}", file=sys.stderr)
        raise SystemExit(1)


if __name__ == "__main__":
    main()
