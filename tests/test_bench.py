"""The decoding benchmark on the tiny model: rows, exactness, cost fields and the files. No timed assertions."""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from exitbench.bench import (
    BASELINE,
    COLUMNS,
    CONTROL_TAG,
    SweepEntry,
    build_entry,
    interleaved_times,
    interval_fields,
    measure_step_costs,
    measure_verify_scaling,
    pass_speedups,
    run_interleaved,
    run_sweep,
    sweep_entries,
    truncated_view,
    write_results,
)
from exitbench.config import BenchConfig, resolve, stage_view
from exitbench.decoding import DecodeResult, StopRule, build_method
from exitbench.errors import ExitbenchError
from exitbench.roofline import Bandwidth

NUM_LAYERS = 4


def prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(11)
    return [torch.randint(3, 128, (n,), generator=gen).tolist() for n in (6, 13)]


BENCH = BenchConfig(
    models=["tiny"],
    exit_layers=[1, 2],
    num_speculations=[1, 3],
    num_prompts=2,
    max_new_tokens=8,
    repeats=2,
    dtypes=["float32"],
    peers=["hf_early_exit", "speculative"],
)


@pytest.fixture(scope="module")
def rows(tiny_model):
    return run_sweep(
        tiny_model,
        prompts(),
        BENCH,
        model_name="tiny",
        dtype="float32",
        cost_iters=2,
        progress=False,
        bandwidth=BANDWIDTH,
    )


BANDWIDTH = Bandwidth(gb_per_s=10.0, dtype="float32", mib=1, threads=1, device="cpu")


def test_sweep_entries_cover_every_exit_layer_and_d():
    entries = sweep_entries(BENCH, NUM_LAYERS)
    assert entries[:2] == [SweepEntry(BASELINE), SweepEntry(BASELINE, tag=CONTROL_TAG)]  # greedy, its A/A control
    assert {e.exit_layer for e in entries[2:]} == {1, 2}
    assert len(entries) == 2 + 2 * 2 * 3
    speculative = next(e for e in entries if e.method == "speculative")
    assert dict(speculative.options) == {"num_speculations": speculative.num_speculations}


@pytest.mark.parametrize("exit_layer", [NUM_LAYERS, 40])
def test_exit_layer_at_or_past_the_last_is_an_error_not_a_dropped_row(tiny_model, exit_layer):
    bench = BENCH.model_copy(update={"exit_layers": [1, exit_layer]})
    with pytest.raises(ExitbenchError) as info:
        run_sweep(tiny_model, prompts(), bench, progress=False)
    assert str(info.value) == (
        f"bench.exit_layers: exit layer {exit_layer} is outside 1..3 for this 4-layer model; "
        "set bench.exit_layers within 1..3"
    )


def test_sweep_rows_are_exact_and_complete(rows):
    assert len(rows) == 2 + 2 * 2 * 3
    assert rows[0]["method"] == BASELINE and rows[0]["speedup_vs_greedy"] == pytest.approx(1.0)
    assert rows[1]["method"] == BASELINE + CONTROL_TAG and rows[1]["exact"]  # greedy timed against greedy
    for row in rows:
        assert set(COLUMNS) <= set(row)
        assert row["exact"] is True and row["num_mismatched"] == 0 and row["first_divergence"] is None
        assert row["num_prompts"] == 2 and row["repeats"] == 2 and row["max_new_tokens"] == 8
        assert row["time_per_token_ms"] > 0 and row["iqr_ms"] >= 0 and row["speedup_vs_greedy"] > 0
    for row in rows:  # paired 95% interval over the 2 prompts, around the reported speed-up
        assert row["speedup_vs_greedy_low"] <= row["speedup_vs_greedy"] <= row["speedup_vs_greedy_high"]
        assert row["speedup_vs_greedy_n"] == 2
    for row in rows[:2]:  # greedy drafts nothing
        assert row["acceptance_rate"] is None and row["acceptance_rate_low"] is None
    for row in rows[2:]:
        assert 0.0 <= row["acceptance_rate"] <= 1.0
        assert row["acceptance_rate_low"] <= row["acceptance_rate"] <= row["acceptance_rate_high"]
        assert row["acceptance_rate_n"] == 2
        assert row["tokens_per_round"] >= 1.0
        assert row["c_draft"] > 0 and row["c_verify"] > 0
        assert 0.0 <= row["alpha"] <= 1.0
        assert math.isfinite(row["ideal_speedup"]) and row["ideal_speedup"] > 0
        assert row["ideal_fraction"] == pytest.approx(row["speedup_vs_greedy"] / row["ideal_speedup"])


def test_sweep_rows_carry_the_roofline_of_what_they_read(rows):
    """Bytes per token from the read counter; the roofline time at the given bandwidth over the measured time."""
    by_method = {(r["method"], r["exit_layer"], r["num_speculations"]): r for r in rows}
    greedy = by_method[(BASELINE, None, None)]
    assert greedy["bytes_per_token"] > 0
    assert greedy["roofline_ms_per_token"] == pytest.approx(greedy["bytes_per_token"] / 1e7)  # 10 GB/s, in ms
    assert greedy["roofline_fraction"] == pytest.approx(
        greedy["roofline_ms_per_token"] / greedy["mean_time_per_token_ms"], rel=0.5
    )  # total-based, against the per-prompt mean: close, not equal
    assert by_method[(BASELINE + CONTROL_TAG, None, None)]["bytes_per_token"] == greedy["bytes_per_token"]
    # transformers' assistant runs outside exitbench's forward: nothing counted, no roofline (not a zero)
    peer = by_method[("hf_early_exit", 1, 1)]
    assert peer["bytes_per_token"] is None and peer["roofline_fraction"] is None
    # a draft through 1 of 4 layers and a verify from it read less per token than greedy when all is accepted;
    # whatever the acceptance, every exitbench method read something
    assert all(r["bytes_per_token"] > 0 for r in rows if not r["method"].startswith("hf_"))


def _result(seconds: float, tokens: int, accepted: int = 0, drafted: int = 0) -> DecodeResult:
    return DecodeResult(tokens=[5] * tokens, wall_time_s=seconds, num_drafted=drafted, num_accepted=accepted)


def test_interval_fields_pair_prompts_and_sum_repeats():
    """Speed-up = greedy's seconds/token over the method's (totals), acceptance = accepted/drafted, per prompt."""
    greedy = [[_result(1.0, 10), _result(2.0, 10), _result(3.0, 10)]] * 2  # 2 repeats x 3 prompts
    method = [[_result(0.5, 10, 6, 8), _result(1.2, 10, 2, 8), _result(1.4, 10, 5, 6)]] * 2
    fields = interval_fields(method, greedy, seed=7)
    assert fields["speedup_vs_greedy"] == pytest.approx(6.0 / 3.1)
    assert fields["speedup_vs_greedy_low"] <= fields["speedup_vs_greedy"] <= fields["speedup_vs_greedy_high"]
    assert fields["speedup_vs_greedy_low"] < fields["speedup_vs_greedy_high"]  # prompts differ: a real interval
    assert fields["acceptance_rate"] == pytest.approx(13 / 22)
    assert fields["speedup_vs_greedy_n"] == fields["acceptance_rate_n"] == 3  # prompts, not prompts x repeats
    assert interval_fields(method, greedy, seed=7) == fields  # seeded
    no_drafts = interval_fields(greedy, greedy)
    assert no_drafts["speedup_vs_greedy"] == no_drafts["speedup_vs_greedy_high"] == pytest.approx(1.0)
    assert no_drafts["acceptance_rate"] is None and no_drafts["acceptance_rate_n"] is None


def test_interleaved_times_keep_each_round_and_drop_the_warm_ups():
    """One time per round and entry, warm-ups left out; rounds alternate forward and reverse order."""
    calls: list[str] = []
    times = interleaved_times({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, iters=3, warmup=1)
    assert {name: len(values) for name, values in times.items()} == {"a": 3, "b": 3}
    assert calls == ["a", "b", "a", "b", "b", "a", "a", "b"]  # warm-up, then forward, reverse, forward
    assert all(value >= 0 for values in times.values() for value in values)


def test_pass_speedups_are_one_per_timing_pass():
    """Each pass's speed-up uses that pass's prompts only: a slow second pass shows in the spread."""
    greedy = [[_result(1.0, 10), _result(2.0, 10)], [_result(1.0, 10), _result(2.0, 10)]]
    method = [[_result(0.5, 10), _result(1.0, 10)], [_result(1.5, 10), _result(1.5, 10)]]
    assert pass_speedups(method, greedy) == pytest.approx([2.0, 1.0])
    assert pass_speedups([[_result(0.0, 10)]], [[_result(1.0, 10)]]) is None  # nothing timed: no speed-up


def test_write_results_csv_and_json_parse(rows, tmp_path):
    block = {"git_commit": "unknown", "threads": 1}
    write_results(rows, tmp_path / "bench", block, "topv2")
    with (tmp_path / "bench" / "sweep.csv").open() as handle:
        table = list(csv.DictReader(handle))
    assert len(table) == len(rows) and list(table[0]) == list(COLUMNS)
    assert table[0]["exit_layer"] == "" and table[1]["exact"] == "True"
    data = json.loads((tmp_path / "bench" / "sweep.json").read_text())
    assert data["provenance"] == block and data["rows"] == json.loads(json.dumps(rows))
    assert data["task"] == "topv2"  # the check bounds evaluate results of this task only with these costs
    assert not list((tmp_path / "bench").glob("*.tmp"))


def test_interleaved_results_have_one_result_per_repeat_and_prompt(tiny_model):
    methods = {
        BASELINE: build_method(BASELINE, tiny_model),
        "ss": build_method("self_speculative", tiny_model, {"exit_layer": 2, "num_speculations": 2}),
    }
    results = run_interleaved(methods, prompts(), 5, StopRule(), repeats=3, progress=False)
    assert {label: [len(r) for r in runs] for label, runs in results.items()} == {BASELINE: [2, 2, 2], "ss": [2, 2, 2]}
    assert results["ss"][2][1].tokens == results[BASELINE][0][1].tokens


def test_truncated_view_is_a_separate_model_with_shared_weights(tiny_model):
    view = truncated_view(tiny_model, 2)
    assert view.num_layers == 2 and tiny_model.num_layers == NUM_LAYERS
    assert view.layers[1] is tiny_model.layers[1] and view.new_cache(8).keys.shape[0] == 2
    method = build_entry(SweepEntry("speculative", (("num_speculations", 2),), 2, 2), tiny_model)
    assert method.draft_model is not None and method.draft_model.num_layers == 2


def test_verify_scaling_is_relative_to_one_row(tiny_model):
    scaling = measure_verify_scaling(tiny_model, prompts()[0], exit_layer=2, rows=(1, 2, 4), iters=2)
    assert scaling["rows"] == [1, 2, 4] and scaling["relative_cost"][0] == 1.0 and scaling["exit_layer"] == 2
    assert all(cost > 0 for cost in scaling["relative_cost"]) and scaling["one_row_ms"] > 0


def test_step_costs_are_positive_ratios(tiny_model):
    costs = measure_step_costs(tiny_model, prompts()[0], exit_layer=1, num_speculations=2, iters=2)
    assert costs.full_step_s > 0 and costs.c_draft > 0 and costs.c_verify > 0
    assert costs.c_tail > 0  # the last draft's layers 0..E-1, which a verification from the exit starts after
    for name in ("c_draft", "c_tail", "c_verify"):  # each cost's interval over its timing rounds holds its median
        low, high = costs.bounds[name]
        assert 0 < low <= getattr(costs, name) <= high
    full = measure_step_costs(tiny_model, prompts()[0], 1, 2, verify_from_exit=False, iters=2)
    assert full.c_verify > 0 and full.c_tail == 0.0


def test_pipeline_fails_with_one_line_naming_the_missing_model(tmp_path):
    config = stage_view(resolve({"bench": {"models": ["nothere"]}}), "bench_decoding")
    path = tmp_path / "bench_decoding.json"
    path.write_text(json.dumps(config))
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run(
        [
            sys.executable,
            str(root / "pipelines" / "bench_decoding.py"),
            "--config",
            str(path),
            "--models-dir",
            str(tmp_path / "models"),
            "--data",
            str(tmp_path / "data"),
            "--out",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        cwd=root,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"error: bench_decoding: model 'nothere' not found at {tmp_path / 'models' / 'nothere'}; "
        "run `dvc repro train` (or remove it from bench.models)"
    ]
