"""Confidence intervals (exitbench.stats) and their place in every evaluate summary; method labels."""

from __future__ import annotations

import random

import pytest

from exitbench.config import resolve
from exitbench.decoding import base_method, parse_options
from exitbench.errors import ExitbenchError
from exitbench.evaluation import EvalContext, evaluate_model_task
from exitbench.stats import (
    Interval,
    mean_interval,
    median_interval,
    ratio_interval,
    required_samples,
    speedup_interval,
)
from tests.test_second_mirror import CharTokenizer, prepared


def test_mean_interval_covers_the_truth_at_about_the_nominal_rate():
    rng = random.Random(0)
    covered = 0
    for trial in range(60):
        values = [float(rng.random() < 0.4) for _ in range(120)]
        covered += mean_interval(values, seed=trial).contains(0.4)
    assert covered >= 51  # 95% nominal: 57 expected of 60; far fewer means the interval is too narrow


def test_interval_width_shrinks_with_n_and_matches_the_normal_approximation():
    rng = random.Random(1)
    values = [float(rng.random() < 0.5) for _ in range(400)]
    wide, narrow = mean_interval(values[:50]), mean_interval(values)
    assert narrow.half_width < wide.half_width
    assert narrow.half_width == pytest.approx(1.96 * (0.25 / 400) ** 0.5, rel=0.2)
    assert required_samples(0.07) == 196


def test_paired_speedup_interval_is_tight_when_prompts_vary_but_the_ratio_does_not():
    rng = random.Random(2)
    greedy = [rng.uniform(0.2, 3.0) for _ in range(40)]  # prompts of very different cost
    method = [g / 1.25 * rng.uniform(0.97, 1.03) for g in greedy]
    tokens = [20] * 40
    interval = speedup_interval(greedy, tokens, method, tokens)
    assert interval.contains(1.25) and interval.half_width < 0.03


def test_ratio_interval_and_degenerate_samples():
    interval = ratio_interval([3, 4, 5, 2, 4, 4], [4, 5, 5, 4, 5, 4])
    assert interval.estimate == pytest.approx(22 / 27) and interval.low < interval.estimate < interval.high
    flat = mean_interval([0.0] * 30)
    assert (flat.low, flat.high) == (0.0, 0.0) and flat.method.startswith("point")
    assert Interval.from_dict(interval.to_dict()) == interval
    with pytest.raises(ValueError):
        ratio_interval([1], [0])


def test_method_labels_run_one_method_with_several_options():
    assert base_method("early_exit@8") == "early_exit" and base_method("early_exit") == "early_exit"
    assert parse_options("early_exit@8", {"exit_layer": 8}).exit_layer == 8
    with pytest.raises(ExitbenchError, match="unknown decoding method 'erly_exit@8'"):
        parse_options("erly_exit@8", {})


def test_every_summary_carries_intervals_and_labels(tiny_model, tmp_path):
    methods = {"autoregressive": {}, "early_exit@1": {"exit_layer": 1}, "early_exit@3": {"exit_layer": 3},
               "self_speculative": {"exit_layer": 2, "num_speculations": 2}}
    tasks = {"topv2": {"num_samples": 8, "timing_samples": 4, "max_new_tokens": 6}}
    cfg = resolve({"evaluate": {"models": ["tiny"], "methods": methods, "draft_vocab_size": 0, "tasks": tasks}})
    ctx = EvalContext("tiny", tiny_model, CharTokenizer(), None, "tinykey", {"num_parameters": 1})
    data, _ = prepared(tmp_path, "only", rows_per_domain=4)
    summaries = evaluate_model_task(cfg, ctx, "topv2", data, tmp_path / "eval")
    assert set(summaries) == set(methods)
    shallow, deep = summaries["early_exit@1"], summaries["early_exit@3"]
    assert shallow["base_method"] == "early_exit" and shallow["options"] == {"exit_layer": 1}
    assert deep["method"] == "early_exit@3" and shallow["sample_ids"] == deep["sample_ids"]
    for name, summary in summaries.items():
        em = summary["intervals"]["exact_match"]
        assert em["low"] <= summary["quality"]["exact_match"] <= em["high"]
        assert {"per_domain/alarm", "per_domain/weather"} <= set(summary["intervals"])
        if name != "autoregressive":
            # speed-ups pair with greedy re-timed in the same rounds: the timing sample (4), for lossy methods too
            assert summary["intervals"]["speedup_vs_greedy"]["n"] == summary["speed"]["num_timed"] == 4
            assert "mismatch_rate" in summary["intervals"]
    spec = summaries["self_speculative"]
    assert spec["num_samples"] == 4 and spec["intervals"]["exact_match"]["n"] == 8  # greedy's quality sample
    assert spec["intervals"]["acceptance_rate"]["estimate"] == pytest.approx(spec["speed"]["acceptance_rate"])
    assert spec["intervals"]["mismatch_rate"]["high"] == 0.0  # exact: no sample differs from greedy
    assert "decode_speedup_vs_greedy" not in spec["intervals"]  # exact: same tokens, the whole-run ratio says it all
    assert summaries["early_exit@1"]["intervals"]["decode_speedup_vs_greedy"]["n"] <= 4


def test_decode_speedup_leaves_the_prefill_out():
    from exitbench.summaries import decode_speedup

    def run(wall: float, prefill: float, tokens: int) -> dict:
        return {"wall_time_s": wall, "prefill_time_s": prefill, "num_tokens": tokens}

    # the method stops after 3 tokens where greedy (timed in the same round) writes 9: per token of the whole run it
    # looks slower (2.0 s / 3 against 5.5 s / 9), while each of its decoding steps takes half of greedy's
    greedy_run = run(5.5, 1.5, 9)
    method = [{"error": None, "decode": run(2.0, 1.5, 3), "reference_decode": greedy_run}] * 6
    greedy = [{"error": None, "decode": greedy_run}] * 6
    interval = decode_speedup(method, greedy, seed=0)
    assert interval.estimate == pytest.approx(2.0) and interval.n == 6
    one_token = [{"error": None, "decode": run(1.5, 1.5, 1), "reference_decode": greedy_run}] * 6  # no step to time
    assert decode_speedup(one_token, greedy, seed=0) is None


def test_early_exit_quality_as_a_paired_fraction_of_greedy():
    from exitbench.summaries import intervals
    from exitbench.tasks.base import Sample
    from exitbench.tasks.registry import build_task

    task = build_task("topv2")
    samples = [Sample(f"alarm-test-{i}", "u\n", "p", {"domain": "alarm"}) for i in range(40)]
    decode = {"num_tokens": 5, "wall_time_s": 0.1, "num_accepted": 0, "num_drafted": 0}
    greedy = [{"scores": {"exact_match": float(i % 2 == 0)}, "tokens": [1], "decode": decode} for i in range(40)]
    early = [{"scores": {"exact_match": float(i % 4 == 0)}, "tokens": [1], "decode": decode} for i in range(40)]
    found = intervals(task, list(zip(samples, early, strict=True)), early, greedy)
    fraction = found["fraction_of_greedy/exact_match"]
    assert fraction["estimate"] == pytest.approx(0.5) and fraction["low"] < 0.5 < fraction["high"] <= 1.0
    assert fraction["n"] == 40


def test_paired_interval_of_any_statistic():
    from exitbench.stats import paired_interval

    rng = random.Random(4)
    a = [float(rng.random() < 0.6) for _ in range(150)]
    b = [float(rng.random() < 0.3) for _ in range(150)]
    gap = paired_interval([a, b], lambda x, y, axis=-1: x.mean(axis=axis) - y.mean(axis=axis))
    assert gap.low < gap.estimate < gap.high and gap.contains(0.3) and not gap.contains(0.0)
    with pytest.raises(ValueError, match="equally long"):
        paired_interval([a, b[:-1]], lambda x, y, axis=-1: x.mean(axis=axis))


def test_median_interval_takes_the_textbook_order_statistics():
    """Distribution-free interval of a median: n = 20 at 95% is [x(6), x(15)] (coverage 0.9586, Conover's table);
    n = 7 is [min, max] (1 - 2/128); below 6 values [min, max] at its own, lower, confidence (n = 5: 0.9375)."""
    twenty = median_interval(list(range(20, 0, -1)))  # order does not matter
    assert (twenty.low, twenty.high, twenty.estimate) == (6.0, 15.0, 10.5)
    assert twenty.confidence == pytest.approx(0.958611, abs=1e-6) and twenty.n == 20
    seven = median_interval([3.0, 1.0, 2.0, 7.0, 5.0, 4.0, 6.0])
    assert (seven.low, seven.estimate, seven.high) == (1.0, 4.0, 7.0)
    assert seven.confidence == pytest.approx(1 - 2 / 128)
    assert median_interval([1.0, 2.0, 3.0, 4.0, 5.0]).confidence == pytest.approx(0.9375)
    with pytest.raises(ValueError):
        median_interval([])
