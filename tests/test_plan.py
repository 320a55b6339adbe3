"""The plan configure prints: each stage's work and estimated device-hours; CUDA profiles stop without CUDA."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from exitbench import config
from exitbench.decoding import method_class
from exitbench.errors import ExitbenchError
from exitbench.plan import DEVICES, OPT_IN, TRAIN_MFU, build_plan, device_hours, render_plan, require_cuda

REPO = Path(__file__).resolve().parents[1]
CONTINUAL = "layerskip_continual_llama2_7b"  # two released 7B checkpoints, nothing trained
TOPV2 = "layerskip_topv2_llama32_1b"  # Llama 3.2 1B, plain and layerskip trained here


def exact(label: str) -> bool:
    return method_class(label).exact


def test_paper_plan_names_every_role_download_stage_and_hours():
    cfg = config.load(REPO / "params.yaml", profile="paper", experiment=CONTINUAL)
    rows = build_plan(cfg, exact)
    assert [r.stage for r in rows] == ["evaluate", "bench_decoding", "calibrate", "throughput"]  # nothing trained
    lines = render_plan(cfg, rows)
    assert lines[0].startswith(f"plan for profile 'paper', experiment '{CONTINUAL}': model meta-llama/Llama-2-7b-hf")
    assert lines[1] == "  base      download meta-llama/Llama-2-7b-hf@main (~13.5 GB in bf16)"
    assert lines[2] == "  layerskip download facebook/layerskip-llama2-7B@main (~13.5 GB in bf16), not trained"
    assert lines[3:5] == ["  plain     not part of this run", "  calm      not part of this run"]
    assert all(line.rstrip().endswith(" h") for line in lines[5:-1]), lines
    assert "H100 SXM-hours" in lines[-1]
    trained = config.load(REPO / "params.yaml", profile="paper", experiment=TOPV2)
    assert [r.stage for r in build_plan(trained, exact)][:2] == ["train@layerskip", "train@plain"]
    assert "  plain     trained here from base (plain recipe, 5800 steps)" in render_plan(trained, [])


def test_a_cpu_profile_prints_its_work_without_gpu_hours():
    cfg = config.load(REPO / "params.yaml", profile="cpu")
    lines = render_plan(cfg, build_plan(cfg, exact))
    assert lines[0].endswith("float32 on cpu") and not any(line.endswith(" h") for line in lines)
    assert lines[1] == "  base      wheel source"
    assert lines[2] == "  layerskip trained here from base (layerskip recipe, 240 steps)"
    assert lines[5].split()[0] == "train@layerskip" and "steps" in lines[5]
    assert lines[-1].startswith("  on CPU: no estimate") and "Time per stage" in lines[-1]


def test_training_hours_follow_six_n_d():
    cfg = config.load(REPO / "params.yaml", profile="paper", experiment=TOPV2)
    v = cfg.train.variants["layerskip"]
    row = next(r for r in build_plan(cfg, exact) if r.stage == "train@layerskip")
    tokens = v.steps * v.batch_size * v.grad_accum * v.seq_len
    assert row.flops == pytest.approx(6 * 1.24e9 * tokens)
    assert device_hours(row, DEVICES["h100"]) == pytest.approx(row.flops / (989e12 * TRAIN_MFU) / 3600)


def test_exact_methods_are_planned_on_the_timing_sample_only():
    cfg = config.load(REPO / "params.yaml", profile="cpu")
    everything = build_plan(cfg, lambda label: False)[3]
    timing_only = build_plan(cfg, exact)[3]
    assert everything.stage == timing_only.stage == "evaluate"
    assert timing_only.bytes_read < everything.bytes_read


def test_cuda_profiles_stop_without_cuda_unless_the_user_opts_in():
    paper = config.load(REPO / "params.yaml", profile="paper", experiment=CONTINUAL)
    with pytest.raises(ExitbenchError, match=f"no CUDA device; run it on a GPU machine, or set {OPT_IN}=1"):
        require_cuda(paper, cuda_available=False, environ={})
    require_cuda(paper, cuda_available=False, environ={OPT_IN: "1"})
    require_cuda(paper, cuda_available=True, environ={})
    require_cuda(config.load(REPO / "params.yaml", profile="cpu"), cuda_available=False, environ={})


def test_configure_prints_the_plan_and_stops_the_paper_profile_in_one_line(tmp_path):
    params = tmp_path / "params.yaml"
    text = (REPO / "params.yaml").read_text().replace("profile: cpu", "profile: paper", 1)
    params.write_text(text.replace('experiment: ""', f"experiment: {TOPV2}", 1))
    env = {k: v for k, v in os.environ.items() if k != OPT_IN}
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "pipelines" / "configure.py"),
            "--params",
            str(params),
            "--out",
            str(tmp_path / "c"),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
    )
    if done.returncode == 0:
        pytest.skip("this machine has CUDA")
    assert done.returncode == 2
    assert f"plan for profile 'paper', experiment '{TOPV2}'" in done.stdout and "train@layerskip" in done.stdout
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: profile 'paper' runs on CUDA")
    assert not (tmp_path / "c").exists()
