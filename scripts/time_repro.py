"""Run `dvc repro` and record how long each stage took, with the machine it ran on.

Each line DVC prints is time-stamped as it arrives (``HH:MM:SS line``, kept in ``--log``); a stage lasts from its
"Running stage" line to the next one (or the end of the run). The record, ``<results_root>/stage_times.json``,
names the commit, the profile (and twin), the CPU and its kernel-choosing features, the threads and the memory
bandwidth measured just before the run (the same 2-core VM streams 30-45 GB/s on different days, and every
stage's time moves with it), so the README's stage table cites a file, not a date. Stages DVC skipped are listed
as ``ran: false``: a timing of a run that reused anything is not a from-scratch time, and the record says so.

    python scripts/time_repro.py                          # dvc repro, timed, alone on the machine
    python scripts/time_repro.py -- -s evaluate@calm      # arguments after -- go to dvc repro
    python scripts/time_repro.py --from-log run.log       # record an earlier time-stamped log instead
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
import yaml

from exitbench.provenance import cpu_features, device_name, git_commit
from exitbench.roofline import measure_bandwidth

MACHINE = "time_repro machine: "
RUNNING = re.compile(r"^(\d\d:\d\d:\d\d) Running stage '([^']+)'")
SKIPPED = re.compile(r"^\d\d:\d\d:\d\d Stage '([^']+)' didn't change, skipping")
STAMP = re.compile(r"^(\d\d:\d\d:\d\d) ")


def _seconds(clock: str) -> int:
    hours, minutes, seconds = (int(part) for part in clock.split(":"))
    return hours * 3600 + minutes * 60 + seconds


def stage_times(lines: list[str]) -> dict[str, Any]:
    """Each stage's wall time from a time-stamped DVC log (a run may pass midnight: clocks only move forward)."""
    starts: list[tuple[str, int]] = []
    skipped: list[str] = []
    offset = 0
    previous = None  # the last stamp seen, in seconds since the first one's midnight
    for line in lines:
        stamp = STAMP.match(line)
        if not stamp:
            continue
        now = _seconds(stamp.group(1))
        if previous is not None and now + offset < previous:
            offset += 86400
        previous = now + offset
        if running := RUNNING.match(line):
            starts.append((running.group(2), previous))
        elif skip := SKIPPED.match(line):
            skipped.append(skip.group(1))
    if not starts:
        raise SystemExit('time_repro: no "Running stage" line in the log: nothing was timed')
    end = previous
    bounds = [start for _, start in starts[1:]] + [end]
    stages = [
        {"stage": name, "seconds": stop - start, "ran": True}
        for (name, start), stop in zip(starts, bounds, strict=True)
    ]
    stages += [{"stage": name, "seconds": 0, "ran": False} for name in skipped]
    return {"stages": stages, "total_seconds": end - starts[0][1], "from_scratch": not skipped}


def clock(seconds: int) -> str:
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def machine() -> dict[str, Any]:
    return {
        "git_commit": git_commit(),
        "device": device_name("cpu"),
        "cpu_features": cpu_features(),
        "threads": torch.get_num_threads(),
        "triad_gb_per_s": measure_bandwidth().gb_per_s,
    }


def run_dvc(args: list[str], log: Path, header: dict[str, Any]) -> tuple[list[str], int]:
    lines = [time.strftime("%H:%M:%S ") + MACHINE + json.dumps(header)]
    with (
        log.open("w") as sink,
        subprocess.Popen(
            ["dvc", "repro", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
        ) as proc,
    ):
        assert proc.stdout is not None
        sink.write(lines[0] + "\n")
        for raw in proc.stdout:
            line = time.strftime("%H:%M:%S ") + raw
            sys.stdout.write(line)
            sink.write(line)
            lines.append(line.rstrip("\n"))
        rc = proc.wait()
    lines.append(time.strftime("%H:%M:%S ") + f"dvc repro exited with {rc}")
    return lines, rc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    parser.add_argument("--log", type=Path, default=Path("build/time_repro.log"), help="where the stamped log goes")
    parser.add_argument("--from-log", type=Path, help="record this earlier time-stamped log instead of running")
    parser.add_argument("--out", type=Path, help="default: <results_root>/stage_times.json")
    parser.add_argument("dvc_args", nargs="*", help="after --: passed to dvc repro")
    args = parser.parse_args()
    params = yaml.safe_load(args.params.read_text())
    out = args.out or Path(params.get("results_root", "results")) / "stage_times.json"
    record: dict[str, Any] = {"profile": params.get("profile"), "experiment": params.get("experiment")}
    if args.from_log:
        lines, rc = args.from_log.read_text(errors="replace").splitlines(), 0
        header = next((line.split(MACHINE, 1)[1] for line in lines if MACHINE in line), None)
        if header is None:
            raise SystemExit(
                f"time_repro: {args.from_log} has no '{MACHINE}' line (written when the run starts): "
                "the machine it ran on is unknown; time the run with this script instead"
            )
        record.update(json.loads(header))
    else:
        record["machine"] = machine()
        record["started"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        record["command"] = " ".join(["dvc repro", *args.dvc_args])
        args.log.parent.mkdir(parents=True, exist_ok=True)
        lines, rc = run_dvc(args.dvc_args, args.log, {k: record[k] for k in ("machine", "started", "command")})
    record.update(stage_times(lines))
    record["rc"] = rc
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    tmp.replace(out)
    print(
        f"time_repro: {clock(record['total_seconds'])} in {len(record['stages'])} stages "
        f"({'from scratch' if record['from_scratch'] else 'some stages reused'}) -> {out}"
    )
    for stage in record["stages"]:
        print(f"  {clock(stage['seconds']) if stage['ran'] else 'skipped':>8}  {stage['stage']}")
    raise SystemExit(rc)


if __name__ == "__main__":
    main()
