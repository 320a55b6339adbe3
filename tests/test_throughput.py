"""The throughput stage's protocol on the tiny model: batches, interleaving, paired speed-ups, exactness."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from exitbench.batched import batched_method
from exitbench.config import check_references, deep_merge, resolve
from exitbench.decoding import REGISTRY, StopRule, parse_options
from exitbench.errors import ExitbenchError
from exitbench.tasks.registry import TASKS
from exitbench.throughput import GREEDY, batches_of, build_methods, rotated, run_batches, summarize

MAX_NEW = 12
ROOT = Path(__file__).resolve().parents[1]


def prompts(n: int = 8) -> list[list[int]]:
    gen = torch.Generator().manual_seed(5)
    lengths = torch.randint(3, 20, (n,), generator=gen).tolist()
    return [torch.randint(3, 128, (length,), generator=gen).tolist() for length in lengths]


def test_batches_and_rotation():
    assert [len(b) for b in batches_of(prompts(10), 4)] == [4, 4]  # the remainder of 2 is left out
    assert batches_of(prompts(10), 4)[1][0] == prompts(10)[4]
    assert rotated(["a", "b", "c"], 4) == ["b", "c", "a"]


def test_summary_rows_are_paired_exact_and_complete(tiny_model):
    methods = {
        GREEDY: batched_method(GREEDY, tiny_model),
        "self_speculative": batched_method("self_speculative", tiny_model, {"exit_layer": 2, "num_speculations": 2}),
        "calm": batched_method("calm", tiny_model, {"threshold": 0.3, "min_exit_layer": 1}),
    }
    runs = run_batches(methods, prompts(), [1, 4], MAX_NEW, StopRule(), repeats=2, progress=False)
    assert {key: len(batches) for key, batches in runs.items()} == {
        (label, b): 8 // b for label in methods for b in (1, 4)
    }
    assert all(len(batch) == 2 for batches in runs.values() for batch in batches)  # two repeats per batch
    rows = {(r["method"], r["batch_size"]): r for r in summarize(runs, {GREEDY: True, "self_speculative": True}, 1)}
    assert rows[(GREEDY, 1)]["speedup_vs_greedy"] == pytest.approx(1.0)
    assert rows[(GREEDY, 1)]["greedy_scaling_vs_b1"] == pytest.approx(1.0)
    assert rows[(GREEDY, 4)]["mismatches_vs_b1"] == 0
    assert rows[("self_speculative", 4)]["mismatches_vs_b1"] == 0
    assert rows[("self_speculative", 1)]["mismatches_vs_greedy_b1"] == 0
    assert rows[("self_speculative", 4)]["speedup_vs_greedy_n"] == 2  # one pair per batch
    spec = rows[("self_speculative", 4)]
    assert 0 <= spec["row_acceptance_min"] <= spec["acceptance_rate"] <= spec["row_acceptance_max"] <= 1
    assert spec["rejected_draft_share"] == pytest.approx(1 - spec["acceptance_rate"])
    calm = rows[("calm", 4)]
    assert calm["mismatches_vs_b1"] == 0 and calm["mismatches_vs_greedy_b1"] is None  # lossy: not held to greedy
    assert calm["mean_exit_layer"] <= calm["batch_effective_depth"] <= tiny_model.num_layers
    assert 0 < calm["carried_layer_share"] < 1
    assert rows[(GREEDY, 4)]["padded_prefill_share"] > 0


def test_methods_without_a_batched_form_are_skipped_with_one_line(tiny_model):
    raw = {
        "throughput": {
            "methods": {"prompt_lookup": {"ngram_size": 3, "num_speculations": 4}, "early_exit": {"exit_layer": 2}}
        }
    }
    cfg = resolve(raw, profile="cpu")  # the section's defaults plus these methods
    said = []
    methods, skipped = build_methods(cfg, tiny_model, None, said.append)
    assert list(methods) == [GREEDY, "early_exit"]
    assert [s["what"] for s in skipped] == ["prompt_lookup"]
    assert said == [f"throughput: skipped method 'prompt_lookup': {skipped[0]['why']}"]


def test_configure_names_a_bad_throughput_entry():
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    for override, message in (
        ({"throughput": {"methods": {"early_exit": {"exit_layer": 0}}}}, "throughput.methods.early_exit"),
        ({"throughput": {"methods": {"nonesuch": {}}}}, "throughput.methods: unknown method 'nonesuch'"),
        ({"throughput": {"model": "nomodel"}}, "throughput.model: unknown model 'nomodel'"),
        ({"throughput": {"task": "nonesuch"}}, "throughput.task: unknown task 'nonesuch'"),
    ):
        cfg = resolve(deep_merge(params, override), profile="cpu")
        with pytest.raises(ExitbenchError, match=message):
            check_references(cfg, "params.yaml", TASKS, REGISTRY, parse_options)
    check_references(resolve(params, profile="cpu"), "params.yaml", TASKS, REGISTRY, parse_options)


def test_report_section_table_and_plot(tiny_model, tmp_path):
    from exitbench.report.plots import _save, _source_line
    from exitbench.report.results import load_throughput
    from exitbench.report.throughput import plot_throughput, throughput_section

    methods = {
        GREEDY: batched_method(GREEDY, tiny_model),
        "early_exit": batched_method("early_exit", tiny_model, {"exit_layer": 2}),
    }
    rows = summarize(
        run_batches(methods, prompts(4), [1, 2, 4], MAX_NEW, StopRule(), progress=False), {GREEDY: True}, 1
    )
    data = {
        "provenance": {
            "git_commit": "abc",
            "device": "cpu",
            "date": "2026-12-04",
            "command": "throughput.py",
            "threads": 1,
        },
        "model": "tiny",
        "task": "topv2",
        "max_new_tokens": MAX_NEW,
        "samples": {"num_samples": 4, "strata": {"a": 4}},
        "skipped": [{"what": "B=16", "why": "batch size 16 is larger than throughput.num_prompts (4)"}],
        "rows": rows,
    }
    (tmp_path / "throughput").mkdir()
    (tmp_path / "throughput" / "throughput.json").write_text(__import__("json").dumps(data))
    assert load_throughput(tmp_path)["rows"] == rows
    section = "\n".join(throughput_section(data))
    assert section.count("| `early_exit` |") == 3 and section.count("| `autoregressive` |") == 3
    assert "skipped B=16: batch size 16 is larger" in section
    files, csv_rows = plot_throughput(data, tmp_path / "plots", _save, _source_line)
    assert [f.name for f in files] == ["throughput_vs_batch.png", "throughput_vs_batch.svg"]
    assert {(r["method"], r["batch_size"]) for r in csv_rows} == {(m, b) for m in methods for b in (1, 2, 4)}
    assert "Not run" in "\n".join(throughput_section(None))
