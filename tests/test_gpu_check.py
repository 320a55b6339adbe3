"""scripts/gpu_check.py on the tiny shape on CPU: result file, exactness, coverage of the registry, errors."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from exitbench.cli import run_stage
from exitbench.decoding import REGISTRY

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.py"


@pytest.fixture(scope="module")
def gpu_check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check_script", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tiny_run(gpu_check: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, str, str]:
    """One dry run; ``tiny`` twice with a zero budget, so the second is not started."""
    out = tmp_path_factory.mktemp("gpu")
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        gpu_check.main(["--shapes", "tiny,tiny", "--device", "cpu", "--dtype", "float32", "--out", str(out),
                        "--max-minutes", "0", "--threads", "1"])
    return json.loads((out / "tiny.json").read_text()), stdout.getvalue(), stderr.getvalue()


def test_exact_methods_match_greedy_in_float32(tiny_run: tuple[dict, str, str]) -> None:
    result, _, _ = tiny_run
    exact = [row for row in result["rows"] if row["exact_claimed"]]
    assert exact and all(row["status"] == "ok" for row in exact)
    assert {row["label"]: row["num_mismatched"] for row in exact} == {row["label"]: 0 for row in exact}


def test_every_registered_method_has_numbers_or_a_reason(tiny_run: tuple[dict, str, str]) -> None:
    result, _, _ = tiny_run
    assert {row["method"] for row in result["rows"]} == set(REGISTRY)
    assert not [row["label"] for row in result["rows"] if row["status"] == "failed"]
    for row in result["rows"]:
        if row["status"] == "ok":
            assert row["time_per_token_ms"] > 0 and row["speedup_vs_greedy"] > 0
        else:
            assert row["status"] == "skipped" and row["reason"]


def test_costs_provenance_and_output(tiny_run: tuple[dict, str, str]) -> None:
    result, stdout, stderr = tiny_run
    assert [c["exit_layer"] for c in result["costs"]] == result["shape"]["exit_layers"] == [1, 2]
    assert all(c["c_draft"] > 0 and c["c_verify"] > 0 for c in result["costs"])
    assert result["provenance"]["dtype"] == "float32" and result["provenance"]["git_commit"]
    speculative = [r for r in result["rows"] if r["method"] == "self_speculative"]
    assert speculative and all(r["predicted_speedup"] > 0 for r in speculative)
    assert "| autoregressive |" in stdout and "speed-up vs greedy" in stdout
    assert "not starting tiny" in stderr  # the time budget stopped the second shape


def test_cuda_without_cuda_is_one_line_error(gpu_check: ModuleType, tmp_path: Path, capsys) -> None:
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    with pytest.raises(SystemExit) as exit_info:
        run_stage(lambda: gpu_check.main(["--shapes", "tiny", "--device", "cuda", "--out", str(tmp_path)]))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--device cpu" in err
    assert not list(tmp_path.iterdir())
