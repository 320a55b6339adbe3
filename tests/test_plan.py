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
from exitbench.plan import (
    CORPUS_ROW_COST,
    CPU_KINDS,
    DEVICES,
    OPT_IN,
    RECIPE_COST,
    TASK_DECODE_COST,
    TRAIN_MFU,
    batch_gain,
    build_plan,
    check_cpu_budget,
    check_planned_exit_layers,
    cpu_kind,
    cpu_minutes,
    device_hours,
    render_plan,
    require_cuda,
    row_cost,
)

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


XEON = "processor\t: 0\nflags\t\t: fpu sse avx512f amx_bf16 amx_tile\n"
EPYC = "processor\t: 0\nflags\t\t: fpu sse avx512f avx512_bf16\n"


def test_a_cpu_profile_prints_minutes_from_the_measured_rates_of_its_cpu_kind():
    cfg = config.load(REPO / "params.yaml", profile="cpu")
    rows = build_plan(cfg, exact)
    lines = render_plan(cfg, rows, cpuinfo=XEON)
    assert lines[0].endswith("float32 on cpu") and not any(line.endswith(" h") for line in lines)
    assert lines[1] == "  base      wheel source"
    assert lines[2] == "  layerskip trained here from base (layerskip recipe, 240 steps)"
    assert lines[5].split()[0] == "train@layerskip" and lines[5].endswith(" min")
    assert lines[-1].startswith("  total ~") and "on Intel Xeon (AMX-BF16)" in lines[-1]
    assert lines[-1].endswith("budget 120 min (budget.minutes)")
    assert "on AMD EPYC" in render_plan(cfg, rows, cpuinfo=EPYC)[-1]
    slowest = min(CPU_KINDS, key=lambda kind: kind.train_flops)
    assert cpu_kind("flags : fpu sse") == slowest  # an unmeasured CPU: the slowest measured kind


def test_cpu_minutes_follow_the_measured_step_time_and_the_recipes_cost():
    """The EPYC run's plain finetune: 240 steps at 3.8 s a step (README), i.e. ~15 minutes."""
    cfg = config.load(REPO / "params.yaml", profile="cpu")
    epyc, rows = cpu_kind(EPYC), {row.stage: row for row in build_plan(cfg, exact)}
    assert cpu_minutes(rows["train@plain"], epyc, 1.35e8, 4) == pytest.approx(240 * 3.8 / 60, rel=0.05)
    calm_step = cpu_minutes(rows["train@calm"], epyc, 1.35e8, 4) / 60
    assert calm_step == pytest.approx(cpu_minutes(rows["train@plain"], epyc, 1.35e8, 4) / 240 * RECIPE_COST["calm"])
    assert rows["train@layerskip"].recipe == "layerskip/subvocab"  # the cpu profile's exits: 2,048 tokens
    twin = config.load(REPO / "params.yaml", profile="twin", experiment="layerskip_topv2_cpu")
    assert next(r for r in build_plan(twin, exact) if r.stage == "train@layerskip").recipe == "layerskip"


@pytest.mark.parametrize("cpuinfo", [XEON, EPYC], ids=["xeon", "epyc"])
def test_runs_that_fit_their_budget_pass_and_one_past_it_stops_in_one_line(cpuinfo):
    for profile, experiment in [("cpu", ""), ("smoke", ""), ("twin", "calm_cnndm_cpu"),
                                ("twin", "layerskip_topv2_peers_cpu"), ("twin", "layerskip_topv2_cpu")]:
        cfg = config.load(REPO / "params.yaml", profile=profile, experiment=experiment)
        check_cpu_budget(cfg, build_plan(cfg, exact), cpuinfo=cpuinfo)
    # measured on the Xeon (docs/twins.md), one prompt at a time: 82 minutes of training and 21 of greedy before
    # any other method, so the topv2 twin has a budget of its own; at the twins' 110 minutes it stops
    cfg = config.load(REPO / "params.yaml", profile="twin", experiment="layerskip_topv2_cpu")
    cfg = cfg.model_copy(update={"budget": cfg.budget.model_copy(update={"minutes": 110}),
                                 "evaluate": cfg.evaluate.model_copy(update={"quality_batch_size": 1})})
    with pytest.raises(ExitbenchError) as err:
        check_cpu_budget(cfg, build_plan(cfg, exact), cpuinfo=cpuinfo)
    text = str(err.value)
    assert "\n" not in text and text.startswith("profile 'twin', experiment 'layerskip_topv2_cpu': estimated ~")
    assert "past its budget of 110 min (budget.minutes)" in text and "the costliest stage is evaluate" in text
    assert text.endswith("or raise budget.minutes")
    paper = config.load(REPO / "params.yaml", profile="paper_dry", experiment=TOPV2)
    check_cpu_budget(paper, build_plan(paper, exact), cpuinfo=cpuinfo)  # GPU runs are planned, not capped


def test_training_hours_follow_six_n_d():
    cfg = config.load(REPO / "params.yaml", profile="paper", experiment=TOPV2)
    v = cfg.train.variants["layerskip"]
    row = next(r for r in build_plan(cfg, exact) if r.stage == "train@layerskip")
    tokens = v.steps * v.batch_size * v.grad_accum * v.seq_len
    assert v.corpus == {"topv2": 1.0}  # short rows: each costs CORPUS_ROW_COST's share of a full seq_len row
    assert row.flops == pytest.approx(6 * 1.24e9 * tokens * CORPUS_ROW_COST["topv2"])
    assert device_hours(row, DEVICES["h100"]) == pytest.approx(row.flops / (989e12 * TRAIN_MFU) / 3600)


def test_a_training_row_costs_its_corpus_mix_of_short_and_full_rows():
    assert row_cost({"topv2": 1.0}) == CORPUS_ROW_COST["topv2"] < 1.0
    assert row_cost({"news": 0.5, "code": 0.5}) == 1.0  # 128-token blocks fill seq_len
    assert row_cost({"topv2": 0.7, "code": 0.2, "news": 0.1}) == pytest.approx(0.7 * CORPUS_ROW_COST["topv2"] + 0.3)
    assert row_cost({}) == 1.0


def test_a_planned_token_costs_what_its_task_measured():
    """The same sample counts on CNN/DM cost 2.07x TOPv2's decoding (long prompts, summaries to the budget)."""
    cfg = config.load(REPO / "params.yaml", profile="cpu")
    topv2 = cfg.evaluate.tasks["topv2"]
    rows = {}
    for task in ("topv2", "cnndm"):
        # every method on either task (the cpu profile keeps some methods to TOPv2: method_tasks)
        # and one prompt at a time (a quality batch gains by task: see the next test but one)
        evaluate = cfg.evaluate.model_copy(update={"tasks": {task: topv2}, "method_tasks": {}, "quality_batch_size": 1})
        rows[task] = next(r for r in build_plan(cfg.model_copy(update={"evaluate": evaluate}), exact)
                          if r.stage == "evaluate")
    assert rows["cnndm"].bytes_read == pytest.approx(TASK_DECODE_COST["cnndm"] * rows["topv2"].bytes_read)
    assert rows["cnndm"].work == rows["topv2"].work  # the planned tokens it prints are the same


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


def test_an_exit_layer_the_base_model_lacks_stops_configure_before_anything_trains():
    cfg = config.load(REPO / "params.yaml", profile="twin", experiment="layerskip_topv2_cpu")
    check_planned_exit_layers(cfg)  # E = 8, 15, 22 of 30
    methods = {**cfg.evaluate.methods, "early_exit@30": {"exit_layer": 30}}
    bad = cfg.model_copy(update={"evaluate": cfg.evaluate.model_copy(update={"methods": methods})})
    with pytest.raises(ExitbenchError, match=r"^evaluate\.methods\.early_exit@30\.exit_layer: exit layer 30 is "
                                             r"outside 1\.\.29 for this 30-layer model; set .* within 1\.\.29$"):
        check_planned_exit_layers(bad)
    paper = config.load(REPO / "params.yaml", profile="paper", experiment=TOPV2)
    check_planned_exit_layers(paper)  # Llama 3.2 1B: 16 layers, every row's E below it
    deep = paper.model_copy(update={"bench": paper.bench.model_copy(update={"exit_layers": [6, 16]})})
    with pytest.raises(ExitbenchError, match=r"^bench\.exit_layers: exit layer 16 is outside 1\.\.15"):
        check_planned_exit_layers(deep)


def test_quality_batches_are_planned_at_their_measured_gain():
    cfg = config.load(REPO / "params.yaml", profile="twin", experiment="layerskip_topv2_cpu")
    assert cfg.evaluate.quality_batch_size == 8
    one = cfg.model_copy(update={"evaluate": cfg.evaluate.model_copy(update={"quality_batch_size": 1})})
    batched, alone = (next(r for r in build_plan(c, exact) if r.stage == "evaluate") for c in (cfg, one))
    assert batch_gain(4, "topv2") == 1.0 and batch_gain(8, "topv2") == batch_gain(16, "topv2") >= 3
    assert batch_gain(8, "cnndm") < 1.5  # ~1k-token prompts: the padded prefill dominates
    # greedy and early exit on 400 prompts past a 64-prompt timing sample: 336 each at a third of the cost
    assert batched.bytes_read < 0.7 * alone.bytes_read
