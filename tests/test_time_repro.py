"""scripts/time_repro.py: each stage's wall time from a time-stamped DVC log, past midnight and with skipped stages."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "time_repro.py"
_spec = importlib.util.spec_from_file_location("time_repro", SCRIPT)
time_repro = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(time_repro)

LOG = """\
23:58:00 time_repro machine: {"machine": {"device": "cpu X", "triad_gb_per_s": 40.0}, "command": "dvc repro"}
23:58:00 Running stage 'configure':
23:58:03 > python pipelines/configure.py
23:58:30 Stage 'prepare_data' didn't change, skipping
23:59:10 Running stage 'train@plain':
00:10:00 step 240
00:10:05 Running stage 'report':
00:10:20 dvc repro exited with 0
"""


def test_each_stage_lasts_until_the_next_one_starts_and_clocks_pass_midnight() -> None:
    record = time_repro.stage_times(LOG.splitlines())
    ran = {stage["stage"]: stage["seconds"] for stage in record["stages"] if stage["ran"]}
    assert ran == {"configure": 70, "train@plain": 10 * 60 + 55, "report": 15}
    assert record["total_seconds"] == 70 + 655 + 15
    assert [stage["stage"] for stage in record["stages"] if not stage["ran"]] == ["prepare_data"]
    assert record["from_scratch"] is False


def test_a_log_without_a_running_stage_is_refused() -> None:
    with pytest.raises(SystemExit, match="nothing was timed"):
        time_repro.stage_times(["12:00:00 Stage 'configure' didn't change, skipping"])


def test_from_log_writes_the_record_with_the_machine_measured_at_the_start(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    log.write_text(LOG)
    params = tmp_path / "params.yaml"
    params.write_text("profile: cpu\nresults_root: res\n")
    out = tmp_path / "times.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--params", str(params), "--from-log", str(log), "--out", str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    record = json.loads(out.read_text())
    assert record["machine"]["triad_gb_per_s"] == 40.0
    assert record["profile"] == "cpu" and record["total_seconds"] == 740
    assert "0:12:20" in done.stdout


def test_from_log_without_the_machine_line_names_the_fix(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    log.write_text("\n".join(line for line in LOG.splitlines() if "machine" not in line))
    params = tmp_path / "params.yaml"
    params.write_text("profile: cpu\n")
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--params", str(params), "--from-log", str(log), "--out", str(tmp_path / "t")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode != 0 and "time the run with this script" in done.stderr
