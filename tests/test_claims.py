"""Claims independent of hardware kind and model size: the verdict rule, the paper's curve, malformed claims,
missing models (never replaced by another), and the whole check over fake result files."""

from __future__ import annotations

import json
import math
import runpy
from pathlib import Path
from typing import Any

import pytest

from exitbench.cost_model import predict_speedup
from exitbench.errors import ExitbenchError
from exitbench.replications import claim_paper_values, load_paper, load_replications
from exitbench.report.check import run_check
from exitbench.report.claims import claim_band, clopper_pearson, hoeffding, interpolate, run_claims
from exitbench.report.format import Estimate, fmt_estimate
from exitbench.report.results import MIN_SPEED_PROMPTS, load_results
from exitbench.report.verdicts import (
    INCONCLUSIVE,
    NOT_COMPARABLE,
    NOT_MEASURED,
    NOT_REPRODUCED,
    REPRODUCED,
    Band,
    interval_verdict,
)
from exitbench.stats import Interval, mean_interval, ratio_interval

REPO = Path(__file__).resolve().parent.parent
PAPERS = load_replications(REPO / "replications")
LAYERSKIP = next(p for p in PAPERS if p.id == "layerskip")
CLAIMS = {c.id: c for p in PAPERS for c in p.claims}


def _iv(low: float, high: float, estimate: float | None = None) -> Interval:
    return Interval((low + high) / 2 if estimate is None else estimate, low, high, 40)


# ------------------------------------------------------------------------------------------ verdict rule


@pytest.mark.parametrize(
    ("ours", "verdict"),
    [
        ((0.86, 0.92), REPRODUCED),        # inside
        ((0.84, 0.94), REPRODUCED),        # exactly on both edges counts as inside
        ((0.70, 0.80), NOT_REPRODUCED),    # entirely below
        ((0.95, 0.99), NOT_REPRODUCED),    # entirely above
        ((0.80, 0.88), INCONCLUSIVE),      # straddles the lower edge
        ((0.90, 0.97), INCONCLUSIVE),      # straddles the upper edge
        ((0.70, 0.99), INCONCLUSIVE),      # covers the whole band
    ],
)
def test_within_band(ours: tuple[float, float], verdict: str) -> None:
    assert interval_verdict(_iv(*ours), Band(0.84, 0.94)) == verdict


def test_at_most_and_above_bands() -> None:
    at_most = Band(-math.inf, 0.05)
    assert interval_verdict(_iv(0.0, 0.036, 0.0), at_most) == REPRODUCED
    assert interval_verdict(_iv(0.0, 0.05, 0.0), at_most) == REPRODUCED  # the edge is inside
    assert interval_verdict(_iv(0.0, 0.106, 0.0), at_most) == INCONCLUSIVE
    assert interval_verdict(_iv(0.08, 0.3), at_most) == NOT_REPRODUCED
    above = Band(0.0, math.inf, open_low=True)  # "exceeds": a gain of exactly 0 does not exceed
    assert interval_verdict(_iv(0.1, 0.5), above) == REPRODUCED
    assert interval_verdict(_iv(0.0, 0.0), above) == NOT_REPRODUCED
    assert interval_verdict(_iv(-0.3, -0.1), above) == NOT_REPRODUCED
    assert interval_verdict(_iv(-0.1, 0.3), above) == INCONCLUSIVE


def test_claim_band_from_tolerance() -> None:
    acceptance = CLAIMS["ls-claim-acceptance-vs-depth"]
    assert claim_band(acceptance, 0.89) == Band(pytest.approx(0.84), pytest.approx(0.94))
    speedup = CLAIMS["ls-claim-cpu-speedup-self-spec"]  # relative: ±15% of the value
    band = claim_band(speedup, 2.0)
    assert (band.low, band.high) == (pytest.approx(1.7), pytest.approx(2.3))
    exact = CLAIMS["ls-claim-self-spec-exact"]
    assert claim_band(exact, 0.0) == Band(-math.inf, 0.05)
    gain = CLAIMS["ls-claim-exit-quality-vs-control"]
    assert claim_band(gain, 0.0) == Band(0.0, math.inf, open_low=True)


def test_clopper_pearson_zero_of_n_is_about_rule_of_three() -> None:
    interval = clopper_pearson(0, 100)
    assert interval.low == 0 and interval.estimate == 0
    assert 3 / 100 < interval.high < 3.7 / 100 + 1e-3  # two-sided 95%: 1 - 0.025^(1/n)
    assert clopper_pearson(10, 50).low > 0.05


def test_clopper_pearson_and_hoeffding_match_reference_values() -> None:
    """Closed forms and published values, not the library's own output: k = 0 and k = n have the closed ends
    1 - (alpha/2)^(1/n) and (alpha/2)^(1/n); 5 of 10 is [0.1871, 0.8129] (Clopper and Pearson 1934's table,
    Agresti and Coull 1998); Hoeffding's half-width at n = 100 is sqrt(ln 40 / 200) = 0.13581."""
    assert clopper_pearson(0, 10).high == pytest.approx(1 - 0.025 ** (1 / 10), abs=1e-9)  # 0.30850
    assert clopper_pearson(20, 20).low == pytest.approx(0.025 ** (1 / 20), abs=1e-9)  # 0.83157
    half = clopper_pearson(5, 10)
    assert (half.low, half.high) == (pytest.approx(0.18709, abs=5e-5), pytest.approx(0.81291, abs=5e-5))
    bound = hoeffding(0.5, 100)
    assert bound.half_width == pytest.approx(0.13581, abs=5e-6)
    assert hoeffding(0.05, 100).low == 0.0  # clipped to [0, 1]


# ------------------------------------------------------------------------------------------ paper curve


def test_interpolation_of_the_papers_curve() -> None:
    points = [(x, y) for x, y, _ in claim_paper_values(CLAIMS["ls-claim-acceptance-vs-depth"], LAYERSKIP.rows_by_id)]
    assert sorted(points) == [(0.25, 0.76), (0.5, 0.976), (0.75, 0.989)]  # Table 6, read from the rows
    assert interpolate(points, 0.25) == pytest.approx(0.76)
    assert interpolate(points, 12 / 30) == pytest.approx(0.76 + 0.6 * (0.976 - 0.76))
    assert interpolate(points, 0.625) == pytest.approx((0.976 + 0.989) / 2)
    assert interpolate(points, 0.75) == pytest.approx(0.989)
    assert interpolate(points, 4 / 30) is None and interpolate(points, 28 / 30) is None  # no extrapolation


def test_paper_values_are_read_from_the_rows() -> None:
    fraction = claim_paper_values(CLAIMS["ls-claim-exit-quality-fraction"], LAYERSKIP.rows_by_id)
    assert [round(y, 4) for _, y, _ in sorted(fraction)] == [round(0.629 / 0.829, 4), round(0.794 / 0.829, 4),
                                                              round(0.833 / 0.829, 4)]
    (_, cost, _), = claim_paper_values(CLAIMS["ls-claim-last-layer-cost"], LAYERSKIP.rows_by_id)
    assert cost == pytest.approx(0.829 - 0.859)
    speedups = claim_paper_values(CLAIMS["ls-claim-cpu-speedup-self-spec"], LAYERSKIP.rows_by_id)
    assert sorted((x, y) for x, y, _ in speedups) == [(0.25, 1.90), (0.5, 1.59), (0.75, 1.23)]  # Table 11


# ------------------------------------------------------------------------------------------ malformed claims


def _broken(tmp_path: Path, old: str, new: str) -> Path:
    text = (REPO / "replications" / "layerskip.yaml").read_text()
    assert old in text
    path = tmp_path / "layerskip.yaml"
    path.write_text(text.replace(old, new, 1))
    return path


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ("    maps_to: {task: topv2, models: [layerskip], method: self_speculative}\n    tolerance: 0.05\n",
         "    maps_to: {task: topv2, modls: [layerskip], method: self_speculative}\n    tolerance: 0.05\n",
         "claim 'ls-claim-acceptance-vs-depth': unknown key 'maps_to.modls'"),
        ("    kind: exit_quality_fraction\n", "    kind: exit_quality_fractoin\n",
         "claim 'ls-claim-exit-quality-fraction': 'kind': Input should be"),
        ("control: plain, method: autoregressive, metric: exact_match}\n",
         "method: autoregressive, metric: exact_match}\n",
         "claim 'ls-claim-last-layer-cost': 'maps_to.control': kind 'last_layer_cost' needs it"),
        ("      reference_row: ls-t6-llama-1.5b-topv2-self-spec-e6\n",
         "      reference_row: ls-t6-llama-1.5b-topv2-self-spec-e7\n",
         "claim 'ls-claim-exit-quality-fraction': 'paper.reference_row': unknown row "
         "'ls-t6-llama-1.5b-topv2-self-spec-e7'"),
        ("    tolerance: 0.10\n", "    tolerance: -0.10\n",
         "claim 'ls-claim-exit-quality-fraction': 'tolerance': Input should be greater than or equal to 0"),
    ],
)
def test_malformed_claim_is_one_line_naming_file_claim_and_key(tmp_path: Path, old: str, new: str,
                                                                expected: str) -> None:
    path = _broken(tmp_path, old, new)
    with pytest.raises(ExitbenchError) as err:
        load_paper(path)
    message = str(err.value)
    assert message.startswith(f"{path}: {expected}"), message
    assert "\n" not in message


def test_a_claim_id_may_not_repeat_a_row_or_claim_id(tmp_path: Path) -> None:
    path = _broken(tmp_path, "  - id: ls-claim-last-layer-cost\n", "  - id: ls-claim-acceptance-vs-depth\n")
    with pytest.raises(ExitbenchError, match="duplicate claim id"):
        load_paper(path)


# ------------------------------------------------------------------------------------------ fake results

N = 40
PROVENANCE = {"git_commit": "0" * 40, "device": "AMD EPYC 7R13 Processor", "date": "2026-01-01", "command": "test",
              "num_parameters": 134_515_008}


def _summary(model: str, method: str, scores: list[float], *, options: dict[str, Any] | None = None,
             speed: dict[str, Any] | None = None, correctness: dict[str, Any] | None = None,
             intervals: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "schema_version": 2, "primary_metric": "exact_match", "framework": "exitbench",
        "task": "topv2", "method": method, "model": model, "options": options or {}, "num_samples": len(scores),
        "quality": {"exact_match": sum(scores) / len(scores)},
        "speed": {"time_per_token_ms": 10.0, "speedup_vs_greedy": 1.0, "acceptance_rate": None, **(speed or {})},
        "correctness": {"exact_claimed": False, **(correctness or {})}, "dtype": "float32",
        "provenance": PROVENANCE, "model_info": {"num_layers": 30, "num_parameters": 134_515_008},
        "sample_ids": [str(i) for i in range(len(scores))], "intervals": intervals or {},
    }


def _write(root: Path, summary: dict[str, Any], records: list[dict[str, Any]] | None = None) -> None:
    target = root / "eval" / summary["method"].split("@", 1)[0] / summary["model"] / summary["task"]
    target.mkdir(parents=True, exist_ok=True)
    (target / f"{summary['method']}.json").write_text(json.dumps(summary))
    if records is not None:
        lines = [json.dumps({"key": "old-layout header"}), *(json.dumps(r) for r in records), '{"torn']
        (target / f"{summary['method']}.jsonl").write_text("\n".join(lines))


def _records(scores: list[float], decode: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    return [{"index": i, "sample_id": str(i), "scores": {"exact_match": s}, "error": None,
             "decode": (decode or [{}] * len(scores))[i]} for i, s in enumerate(scores)]


LS_AR = [1.0] * 30 + [0.0] * 10             # layerskip last layer: 30 / 40
LS_EE = [1.0] * 27 + [0.0] * 13             # layerskip early exit at E=12: 27 / 40 (fraction 0.9)
PLAIN_AR = [1.0] * 32 + [0.0] * 8           # plain last layer: 32 / 40
PLAIN_EE = [1.0] * 5 + [0.0] * 35           # plain early exit at E=12: 5 / 40
ACCEPTED = [18.0 if i % 2 else 17.0 for i in range(N)]  # of 20 drafted: acceptance 0.875


def _sweep_row(speedup_factor: float, exit_layer: int) -> dict[str, Any]:
    predicted = predict_speedup(0.5, 2, 0.4, 0.7)["predicted_speedup"]
    return {"model": "layerskip", "dtype": "float32", "method": "self_speculative", "exit_layer": exit_layer,
            "num_speculations": 2, "time_per_token_ms": 10.0, "speedup_vs_greedy": predicted * speedup_factor,
            "acceptance_rate": 0.5, "c_draft": 0.4, "c_verify": 0.7, "num_prompts": 16, "max_new_tokens": 32}


def _calibration(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {"model": "layerskip", "risk": "textual", "results": rows, "provenance": PROVENANCE}


def _cal_row(measure: str, layer: float, **more: Any) -> dict[str, Any]:
    return {"task": "topv2", "measure": measure, "kv_strategy": "propagate", "delta": 0.2, "threshold": 0.5,
            "certified": True, "test_risk": 0.05, "num_test": 1000, "avg_exit_layer": layer, **more}


@pytest.fixture
def fake_results(tmp_path: Path) -> Path:
    root = tmp_path / "results"
    twelve = {"exit_layer": 12, "num_speculations": 1}
    decode = [{"num_accepted": a, "num_drafted": 20.0} for a in ACCEPTED]
    _write(root, _summary("layerskip", "autoregressive", LS_AR), _records(LS_AR))
    _write(root, _summary("layerskip", "early_exit", LS_EE, options={"exit_layer": 12},
                          intervals={"speedup_vs_greedy": {"estimate": 2.0, "low": 1.9, "high": 2.1, "n": N}}),
           _records(LS_EE))
    _write(root, _summary("layerskip", "self_speculative", LS_AR, options=twelve,
                          speed={"acceptance_rate": 0.875, "speedup_vs_greedy": 1.7},
                          correctness={"exact_claimed": True, "num_compared": 100, "num_mismatched": 0},
                          intervals={"speedup_vs_greedy": {"estimate": 1.7, "low": 1.6, "high": 1.8, "n": N}}),
           _records(LS_AR, decode))
    _write(root, _summary("plain", "autoregressive", PLAIN_AR), _records(PLAIN_AR))
    _write(root, _summary("plain", "early_exit", PLAIN_EE, options={"exit_layer": 12}), _records(PLAIN_EE))
    _write(root, _summary("plain", "self_speculative", PLAIN_AR, options=twelve,
                          correctness={"exact_claimed": True, "num_compared": 50, "num_mismatched": 10}))
    _write(root, _summary("base", "autoregressive", LS_AR), _records(LS_AR))  # never a stand-in for plain
    (root / "bench").mkdir()
    (root / "bench" / "sweep.json").write_text(json.dumps(
        {"rows": [_sweep_row(0.9, 8), _sweep_row(1.3, 4)], "provenance": PROVENANCE}))
    (root / "calibrate").mkdir()
    rows = [_cal_row("softmax", 10.0), _cal_row("classifier", 14.0), _cal_row("state", 29.0),
            _cal_row("softmax", 30.0, delta=0.1, certified=False, threshold=1.0, test_risk=0.0)]
    (root / "calibrate" / "layerskip.json").write_text(json.dumps(_calibration(rows)))
    return root


def _by_claim(results_dir: Path) -> dict[str, list]:
    out: dict[str, list] = {}
    for v in run_claims(PAPERS, load_results(results_dir)):
        out.setdefault(v.claim_id, []).append(v)
    return out


def test_every_claim_gets_its_verdict_over_fake_results(fake_results: Path) -> None:
    got = _by_claim(fake_results)
    (acceptance,) = got["ls-claim-acceptance-vs-depth"]
    assert acceptance.paper_value == pytest.approx(0.76 + 0.6 * 0.216)  # Table 6 read at E/L = 12/30
    assert acceptance.ours.estimate == pytest.approx(0.875) and acceptance.ours.low < 0.875 < acceptance.ours.high
    assert acceptance.verdict == REPRODUCED and "E=12/30" in acceptance.subject

    (fraction,) = got["ls-claim-exit-quality-fraction"]  # paired over shared sample ids
    expected = ratio_interval(LS_EE, LS_AR)
    assert (fraction.ours.low, fraction.ours.high) == pytest.approx((expected.low, expected.high))
    assert fraction.verdict == interval_verdict(expected, fraction.band)

    (gain,) = got["ls-claim-exit-quality-vs-control"]
    assert gain.ours.estimate == pytest.approx(27 / 30 - 5 / 32)
    assert gain.verdict == REPRODUCED and "layerskip vs plain" in gain.subject

    (cost,) = got["ls-claim-last-layer-cost"]
    diff = mean_interval([a - b for a, b in zip(LS_AR, PLAIN_AR, strict=True)])
    assert cost.ours.estimate == pytest.approx(-0.05) and cost.ours.low == pytest.approx(diff.low)
    assert cost.paper_value == pytest.approx(-0.03)
    assert cost.verdict == INCONCLUSIVE  # n = 40 cannot tell -0.05 from the band [-0.06, 0]

    exact = {v.subject.split(",")[0]: v for v in got["ls-claim-self-spec-exact"]}
    assert exact["layerskip"].verdict == REPRODUCED and exact["layerskip"].ours.n == 100
    assert exact["plain"].verdict == NOT_REPRODUCED  # 10 of 50 mismatched
    assert "base" not in exact  # self_speculative ran on layerskip and plain, not base: no row for it

    (self_spec,) = got["ls-claim-cpu-speedup-self-spec"]  # the summary's own interval comes first
    assert (self_spec.ours.low, self_spec.ours.high) == (1.6, 1.8) and self_spec.verdict == REPRODUCED
    assert any("model size: ours 135M vs paper 1.5B" in n for n in self_spec.notes)
    (early,) = got["ls-claim-cpu-speedup-early-exit"]
    assert early.verdict == NOT_REPRODUCED  # 2.0 [1.9, 2.1] vs the band around 2.68

    bound = {v.subject: v for v in got["ls-claim-spec-bound-ours"]}
    sweep = bound["layerskip, self_speculative (sweep)"]
    assert sweep.verdict == NOT_REPRODUCED and sweep.ours.estimate == pytest.approx(1.3)  # the worst row decides
    assert all(v.verdict == REPRODUCED for v in got["ls-claim-spec-bound-paper"])

    (risk,) = got["calm-claim-risk-guarantee"]  # the uncertified δ is no claim of the method
    assert risk.verdict == REPRODUCED and risk.ours.high < 0.2 and "3 checked" in risk.notes[0]
    (order,) = got["calm-claim-measure-order"]
    assert order.verdict == REPRODUCED and order.subject == "layerskip: softmax < classifier < state"


def test_a_speed_up_of_outputs_that_score_nothing_is_not_reproduced(fake_results: Path) -> None:
    """The papers time early exits that still do the task (Table 11 prints their EM); an exit whose every
    quality metric is 0 does not reproduce that speed-up, even one inside the band."""
    zero = [0.0] * N
    inside = {"speedup_vs_greedy": {"estimate": 2.6, "low": 2.5, "high": 2.7, "n": N}}  # band around 2.68 at E/L 0.4
    _write(fake_results, _summary("layerskip", "early_exit", zero, options={"exit_layer": 12}, intervals=inside),
           _records(zero))
    (early,) = _by_claim(fake_results)["ls-claim-cpu-speedup-early-exit"]
    assert early.verdict == NOT_REPRODUCED and early.ours.estimate == pytest.approx(2.6)
    (why,) = [r for r in early.reasons if r.startswith("outputs unusable: exact_match 0 at this exit (n=40)")]
    assert "the paper's outputs keep exact_match 0.582 at this E/L" in why  # 0.298 at 0.25, 0.772 at 0.5

    on_gpu = _summary("layerskip", "early_exit", zero, options={"exit_layer": 12}, intervals=inside)
    on_gpu["provenance"] = {**PROVENANCE, "device": "NVIDIA H100 80GB HBM3"}
    _write(fake_results, on_gpu, _records(zero))
    (early,) = _by_claim(fake_results)["ls-claim-cpu-speedup-early-exit"]
    assert early.verdict == NOT_COMPARABLE  # another hardware kind is never judged, whatever its outputs
    assert early.reasons[0].startswith("hardware")
    (self_spec,) = _by_claim(fake_results)["ls-claim-cpu-speedup-self-spec"]  # exact: greedy's quality
    assert self_spec.verdict == REPRODUCED


def test_a_speed_up_of_outputs_under_half_the_papers_quality_is_not_reproduced(fake_results: Path) -> None:
    """At E/L 0.4 the paper's early exit keeps EM 0.582 (interpolated): outputs at 0.25 (under half) do not
    reproduce its speed-up, outputs at 0.3 (over half) are judged by the speed-up alone."""
    inside = {"speedup_vs_greedy": {"estimate": 2.6, "low": 2.5, "high": 2.7, "n": N}}
    for right, expected in ((10, NOT_REPRODUCED), (12, REPRODUCED)):
        scores = [1.0] * right + [0.0] * (N - right)
        _write(fake_results, _summary("layerskip", "early_exit", scores, options={"exit_layer": 12},
                                      intervals=inside), _records(scores))
        (early,) = _by_claim(fake_results)["ls-claim-cpu-speedup-early-exit"]
        assert early.verdict == expected, (right, early.reasons)
        unusable = [r for r in early.reasons if r.startswith("outputs unusable")]
        assert bool(unusable) == (expected == NOT_REPRODUCED)
        if unusable:
            assert unusable[0].startswith("outputs unusable: exact_match 0.25 at this exit (n=40), where the "
                                          "paper's outputs keep exact_match 0.582 at this E/L (interpolated): "
                                          "under 50% of it")


def test_measure_order_ignores_uncertified_thresholds(fake_results: Path) -> None:
    """Where no threshold is certified every measure falls back to λ = 1 (layer 30): that tie is no order."""
    rows = [_cal_row(measure, 30.0, certified=False, threshold=1.0) for measure in ("softmax", "classifier", "state")]
    (fake_results / "calibrate" / "layerskip.json").write_text(json.dumps(_calibration(rows)))
    (order,) = _by_claim(fake_results)["calm-claim-measure-order"]
    assert order.verdict == NOT_MEASURED
    assert "certified at the same task" in order.reasons[0] and "3 uncertified" in order.reasons[0]


def test_sweep_bound_carries_the_sweeps_speed_up_and_acceptance_intervals(fake_results: Path) -> None:
    """measured / predicted over a sweep row: the speed-up interval over the prediction at the acceptance
    interval's ends (the prediction rises with acceptance), so a ratio of 0.9 from 16 noisy prompts straddles 1.05."""
    row = _sweep_row(0.9, 8)
    predicted = row["speedup_vs_greedy"] / 0.9
    row.update(speedup_vs_greedy_low=predicted * 0.8, speedup_vs_greedy_high=predicted * 1.1, speedup_vs_greedy_n=16,
               acceptance_rate_low=0.45, acceptance_rate_high=0.55, acceptance_rate_n=16)
    (fake_results / "bench" / "sweep.json").write_text(json.dumps({"rows": [row], "provenance": PROVENANCE}))
    bound = {v.subject: v for v in _by_claim(fake_results)["ls-claim-spec-bound-ours"]}
    sweep = bound["layerskip, self_speculative (sweep)"]
    at = {a: predict_speedup(a, 2, 0.4, 0.7)["predicted_speedup"] for a in (0.45, 0.55)}
    assert sweep.ours.estimate == pytest.approx(0.9) and sweep.ours.n == 16
    assert sweep.ours.low == pytest.approx(predicted * 0.8 / at[0.55])
    assert sweep.ours.high == pytest.approx(predicted * 1.1 / at[0.45])
    assert sweep.verdict == INCONCLUSIVE


def test_sweep_bound_widens_by_the_step_costs_own_timing_noise(fake_results: Path) -> None:
    """With the costs' intervals recorded, the prediction's ends take the cheapest and dearest costs too: the
    ratio interval is wider than with the point costs alone, and its point is unchanged."""
    row = _sweep_row(0.9, 8)
    predicted = row["speedup_vs_greedy"] / 0.9
    row.update(speedup_vs_greedy_low=predicted * 0.8, speedup_vs_greedy_high=predicted * 1.1, speedup_vs_greedy_n=16,
               acceptance_rate_low=0.45, acceptance_rate_high=0.55, acceptance_rate_n=16,
               c_draft_low=0.35, c_draft_high=0.45, c_verify_low=0.6, c_verify_high=0.8)
    (fake_results / "bench" / "sweep.json").write_text(json.dumps({"rows": [row], "provenance": PROVENANCE}))
    sweep = {v.subject: v for v in _by_claim(fake_results)["ls-claim-spec-bound-ours"]}[
        "layerskip, self_speculative (sweep)"]
    best = predict_speedup(0.55, 2, 0.35, 0.6)["predicted_speedup"]
    worst = predict_speedup(0.45, 2, 0.45, 0.8)["predicted_speedup"]
    assert sweep.ours.estimate == pytest.approx(0.9)
    assert sweep.ours.low == pytest.approx(predicted * 0.8 / best)
    assert sweep.ours.high == pytest.approx(predicted * 1.1 / worst)
    assert "step costs' intervals" in sweep.ours.method


def test_a_speed_up_timed_on_too_few_prompts_is_shown_and_not_judged(fake_results: Path, tmp_path: Path) -> None:
    """A speed-up on 4 prompts flipped between data mirrors (1.31x, then 1.02x [0.98, 1.14]): under 16 timed
    prompts the claim, the figure and the report's cell show our number and judge nothing."""
    few = {"speedup_vs_greedy": {"estimate": 1.7, "low": 1.6, "high": 1.8, "n": MIN_SPEED_PROMPTS - 1}}
    twelve = {"exit_layer": 12, "num_speculations": 1}
    _write(fake_results, _summary("layerskip", "self_speculative", LS_AR, options=twelve, intervals=few,
                                  speed={"acceptance_rate": 0.875, "speedup_vs_greedy": 1.7}))
    (claim,) = _by_claim(fake_results)["ls-claim-cpu-speedup-self-spec"]
    assert claim.verdict == NOT_MEASURED and claim.ours.estimate == pytest.approx(1.7)
    assert claim.reasons[0] == f"timed on 15 prompts, fewer than the {MIN_SPEED_PROMPTS} a quoted speed-up needs"
    (acceptance,) = _by_claim(fake_results)["ls-claim-acceptance-vs-depth"]  # not a speed-up: still judged
    assert acceptance.verdict == REPRODUCED

    self_spec = {row.id for paper in PAPERS for row in paper.rows if row.maps_to.method == "self_speculative"}
    figures = [v for v in run_check(PAPERS, load_results(fake_results), 0.15)
               if v.claim_id in self_spec and v.model == "layerskip"]
    assert figures and all(v.verdict == NOT_MEASURED and v.ours.estimate == pytest.approx(1.7) for v in figures)
    assert all("fewer than the 16" in v.reasons[0] for v in figures)

    enough = {"speedup_vs_greedy": {**few["speedup_vs_greedy"], "n": MIN_SPEED_PROMPTS}}
    _write(fake_results, _summary("layerskip", "self_speculative", LS_AR, options=twelve, intervals=enough,
                                  speed={"acceptance_rate": 0.875, "speedup_vs_greedy": 1.7}))
    (claim,) = _by_claim(fake_results)["ls-claim-cpu-speedup-self-spec"]
    assert claim.verdict == REPRODUCED

    interval = Interval(1.31, 1.29, 1.32, 4)
    assert fmt_estimate(Estimate(1.31, interval, 4), "x") == "(1.31x, n=4 < 16: not quoted)"
    assert fmt_estimate(Estimate(1.31, interval, 16), "x") == "1.31x [1.29, 1.32] (n=16)"
    assert fmt_estimate(Estimate(0.5, interval, 4)) == "0.500 [1.290, 1.320] (n=4)"  # not a speed-up


def test_missing_control_is_not_measured_and_never_replaced_by_base(fake_results: Path) -> None:
    for plain in (fake_results / "eval").glob("*/plain"):
        for path in sorted(plain.rglob("*"), reverse=True):
            path.unlink() if path.is_file() else path.rmdir()
        plain.rmdir()
    got = _by_claim(fake_results)
    for claim_id in ("ls-claim-exit-quality-vs-control", "ls-claim-last-layer-cost"):
        (verdict,) = got[claim_id]
        assert verdict.verdict == NOT_MEASURED and verdict.ours is None
        assert "the control model 'plain'" in verdict.reasons[0]
        assert "base" not in verdict.subject
    assert got["ls-claim-acceptance-vs-depth"][0].verdict == REPRODUCED  # claims on layerskip alone still run


def test_a_claim_naming_a_model_the_results_lack_is_not_measured(fake_results: Path) -> None:
    claim = CLAIMS["ls-claim-acceptance-vs-depth"]
    renamed = claim.model_copy(update={"maps_to": claim.maps_to.model_copy(update={"models": ("layerskip-7b",)})})
    paper = LAYERSKIP.model_copy(update={"claims": (renamed,)})
    (verdict,) = run_claims((paper,), load_results(fake_results))
    assert verdict.verdict == NOT_MEASURED and verdict.ours is None
    assert verdict.reasons == ("no evaluate results for model 'layerskip-7b'",)


def test_intervals_fall_back_to_the_summaries_without_per_sample_records(fake_results: Path) -> None:
    for path in (fake_results / "eval").rglob("*.jsonl"):
        path.unlink()
    got = _by_claim(fake_results)
    (acceptance,) = got["ls-claim-acceptance-vs-depth"]
    assert acceptance.ours.low == acceptance.ours.high == 0.875 and "point only" in acceptance.notes[0]
    (fraction,) = got["ls-claim-exit-quality-fraction"]
    assert fraction.ours.estimate == pytest.approx(0.9) and "conservative" in fraction.ours.method


def test_depth_outside_the_papers_range_is_not_measured(fake_results: Path) -> None:
    path = fake_results / "eval" / "self_speculative" / "layerskip" / "topv2" / "self_speculative.json"
    data = json.loads(path.read_text())
    data["options"]["exit_layer"] = 4  # 4/30 = 0.13 < the paper's 6/24 = 0.25
    path.write_text(json.dumps(data))
    (acceptance,) = _by_claim(fake_results)["ls-claim-acceptance-vs-depth"]
    assert acceptance.verdict == NOT_MEASURED and "outside the paper's 0.25–0.75" in acceptance.reasons[0]


def test_check_cli_opens_with_the_claims_table(tmp_path: Path, fake_results: Path) -> None:
    config = tmp_path / "check.json"
    config.write_text(json.dumps({"profile": "cpu", "base": {}, "check": {"default_tolerance": 0.15}}))
    main = runpy.run_path(str(REPO / "pipelines" / "check.py"))["main"]
    out = tmp_path / "out"
    assert main(["--config", str(config), "--results", str(fake_results), "--replications",
                 str(REPO / "replications"), "--out", str(out)]) == 0
    report = json.loads((out / "check.json").read_text())
    own = sum(report["summary_paper_consistency"].values())
    assert sum(report["summary"].values()) + own == len(report["verdicts"])
    assert report["summary_claims"][INCONCLUSIVE] >= 1
    claim = next(c for c in report["verdicts"] if c["id"] == "ls-claim-acceptance-vs-depth")
    assert claim["verdict"] == REPRODUCED and claim["ours"]["n"] == N and claim["band"]["text"] == "[0.84, 0.94]"
    markdown = (out / "check.md").read_text()
    claims_at, figures_at = markdown.index("## Claims"), markdown.index("## Published figures")
    assert claims_at < figures_at
    header = "| claim or row | source | paper | ours (interval, n) | tol. | verdict | note |"
    assert claims_at < markdown.index(header) < figures_at
    assert "`ls-claim-acceptance-vs-depth`: layerskip, topv2, self_speculative E=12/30" in markdown


def test_shared_compute_pairs_each_method_with_the_greedy_run_of_its_own_round(fake_results: Path) -> None:
    """Self-speculation vs `speculative` drafting with a copy of the same layers: each speed-up against its own
    greedy (a later-added method carries its round's greedy re-run, reference_decode), then their ratio."""
    assert _by_claim(fake_results)["ls-claim-shared-compute"][0].verdict == NOT_MEASURED  # no speculative twin yet
    twelve = {"exit_layer": 12, "num_speculations": 1}
    greedy = [{"wall_time_s": 1.0 + 0.01 * i, "num_tokens": 10} for i in range(N)]
    self_spec = [{"wall_time_s": 0.5 * g["wall_time_s"], "num_tokens": 10, "num_accepted": 17.0, "num_drafted": 20.0}
                 for g in greedy]
    _write(fake_results, _summary("layerskip", "autoregressive", LS_AR), _records(LS_AR, greedy))
    _write(fake_results, _summary("layerskip", "self_speculative", LS_AR, options=twelve), _records(LS_AR, self_spec))
    # added later: its round's greedy ran 2x slower than the stored one (a busier minute), and so did it
    separate = _records(LS_AR, [{"wall_time_s": 1.6 * g["wall_time_s"], "num_tokens": 10} for g in greedy])
    for record, g in zip(separate, greedy, strict=True):
        record["reference_decode"] = {"wall_time_s": 2.0 * g["wall_time_s"], "num_tokens": 10}
    memory = {"what": "draft model: own copy of the first 12 layers, norm and head", "num_parameters": 70_000_000,
              "bytes": 280_000_000, "fraction_of_model": 0.52, "kv_cache_bytes_per_token": 18432}
    summary = _summary("layerskip", "speculative", LS_AR, options={"num_speculations": 1, "draft_layers": 12})
    _write(fake_results, {**summary, "extra_memory": memory}, separate)

    (verdict,) = _by_claim(fake_results)["ls-claim-shared-compute"]
    assert verdict.ours.estimate == pytest.approx(2.0 / 1.25)  # 2x vs 1.25x; the stored greedy would give 3.2
    assert verdict.verdict == REPRODUCED and "E=12 d=1" in verdict.subject
    assert any("70.0M parameters" in note and "MiB" in note for note in verdict.notes)

    slower = [{**r, "decode": {"wall_time_s": 0.9 * r["reference_decode"]["wall_time_s"], "num_tokens": 10}}
              for r in separate]  # the separate draft now 1.11x: self-speculation is 1.8x faster than it
    _write(fake_results, {**summary, "extra_memory": memory}, slower)
    (verdict,) = _by_claim(fake_results)["ls-claim-shared-compute"]
    assert verdict.ours.estimate == pytest.approx(2.0 / (1 / 0.9))
    faster = [{**r, "decode": {"wall_time_s": 0.4 * r["reference_decode"]["wall_time_s"], "num_tokens": 10}}
              for r in separate]  # the separate draft 2.5x: faster than self-speculation, the claim fails
    _write(fake_results, {**summary, "extra_memory": memory}, faster)
    (verdict,) = _by_claim(fake_results)["ls-claim-shared-compute"]
    assert verdict.verdict == NOT_REPRODUCED and verdict.ours.high < 1


def test_a_store_holding_other_settings_records_is_read_by_the_summarys_key(fake_results: Path) -> None:
    """An exact method's store may hold the same samples under an older key (another draft vocabulary): both
    groups score like greedy, so only the summary's ``settings_key`` tells which records are this run's."""
    twelve = {"exit_layer": 12, "num_speculations": 1}
    greedy = [{"wall_time_s": 1.0 + 0.01 * i, "num_tokens": 10} for i in range(N)]
    self_spec = [{"wall_time_s": 0.5 * g["wall_time_s"], "num_tokens": 10, "num_accepted": 17.0, "num_drafted": 20.0}
                 for g in greedy]
    _write(fake_results, _summary("layerskip", "autoregressive", LS_AR), _records(LS_AR, greedy))
    separate = _records(LS_AR, [{"wall_time_s": 0.8 * g["wall_time_s"], "num_tokens": 10} for g in greedy])
    twin = {"num_speculations": 1, "draft_layers": 12}
    _write(fake_results, _summary("layerskip", "speculative", LS_AR, options=twin), separate)
    old = [{**r, "settings_key": "old", "decode": {**r["decode"], "wall_time_s": 2 * r["decode"]["wall_time_s"]}}
           for r in _records(LS_AR, self_spec)]
    new = [{**r, "settings_key": "new"} for r in _records(LS_AR, self_spec)]
    summary = _summary("layerskip", "self_speculative", LS_AR, options=twelve)
    _write(fake_results, summary, old + new)
    (verdict,) = _by_claim(fake_results)["ls-claim-shared-compute"]
    assert verdict.verdict == NOT_MEASURED  # two groups cover the samples with the same quality: ambiguous
    _write(fake_results, {**summary, "settings_key": "new"}, old + new)
    (verdict,) = _by_claim(fake_results)["ls-claim-shared-compute"]
    assert verdict.ours.estimate == pytest.approx(2.0 / 1.25)
    _write(fake_results, {**summary, "settings_key": "old"}, old + new)
    (verdict,) = _by_claim(fake_results)["ls-claim-shared-compute"]
    assert verdict.ours.estimate == pytest.approx(1.0 / 1.25)


def test_evaluate_results_are_bounded_with_costs_timed_on_their_own_task(fake_results: Path) -> None:
    """Step costs relative to a greedy step depend on the context length, so the sweep's costs (timed on
    bench.task's prompts) bound only the evaluate results of that task."""
    row = {**_sweep_row(1.0, 12), "num_speculations": 1}
    for task, measured in (("topv2", True), ("cnndm", False), (None, True)):
        (fake_results / "bench" / "sweep.json").write_text(
            json.dumps({"rows": [row], "provenance": PROVENANCE, "task": task}))
        bound = {v.subject: v for v in _by_claim(fake_results)["ls-claim-spec-bound-ours"]}
        evaluate = bound["layerskip, self_speculative (evaluate)"]
        assert (evaluate.verdict != NOT_MEASURED) is measured, task


def test_mindskip_claims_read_its_quality_beside_greedy_and_beside_its_static_control(fake_results: Path) -> None:
    routed = [1.0] * 29 + [0.0] * 11  # 29 / 40 against greedy's 30 / 40 on the same ids
    static = [1.0] * 20 + [0.0] * 20
    calls = [{"layer_calls": {"routed": 15, "skipped": 6 + i % 2}} for i in range(40)]
    _write(fake_results, _summary("layerskip", "mindskip", routed, speed={"skip_rate": 0.42}), _records(routed, calls))
    control = _summary("layerskip", "mindskip@static", static, options={"routing": "static"}, speed={"skip_rate": 0.4})
    _write(fake_results, {**control, "base_method": "mindskip"}, _records(static))
    got = _by_claim(fake_results)
    (kept,) = got["rt-claim-quality-kept"]  # the control's label is not a subject
    assert kept.subject == "layerskip, topv2, mindskip"
    assert kept.paper_value == pytest.approx(69.4 / 69.7)
    expected = ratio_interval(routed, LS_AR)
    assert (kept.ours.low, kept.ours.high) == pytest.approx((expected.low, expected.high))
    assert kept.verdict == interval_verdict(expected, kept.band)
    assert "mindskip skipped 42% of its routed layers" in kept.notes
    (above,) = got["rt-claim-routing-above-static"]
    assert above.ours.estimate == pytest.approx(9 / 40) and above.verdict == REPRODUCED
    assert "mindskip@static skipped 40% of its routed layers" in above.notes
    for claim in ("rt-claim-quality-kept", "rt-claim-routing-above-static"):  # plain ran no mindskip
        assert all(v.subject.startswith("layerskip") for v in got[claim])


@pytest.mark.parametrize(("routed_rate", "comparable"), [(0.04, False), (0.33, False), (0.37, True), (0.43, True)])
def test_routing_above_static_is_judged_only_at_the_same_skip_rate(fake_results: Path, routed_rate: float,
                                                                  comparable: bool) -> None:
    """The claim is at the same skip rate: a learned run that skipped far less than its static control keeps more
    quality for that reason alone, so more than 5 points apart the verdict is not comparable (the figure shown)."""
    routed, static = [1.0] * 29 + [0.0] * 11, [1.0] * 20 + [0.0] * 20
    _write(fake_results, _summary("layerskip", "mindskip", routed, speed={"skip_rate": routed_rate}), _records(routed))
    control = _summary("layerskip", "mindskip@static", static, options={"routing": "static"}, speed={"skip_rate": 0.4})
    _write(fake_results, {**control, "base_method": "mindskip"}, _records(static))
    (above,) = _by_claim(fake_results)["rt-claim-routing-above-static"]
    assert above.ours.estimate == pytest.approx(9 / 40)
    if comparable:
        assert above.verdict == REPRODUCED and not above.reasons
    else:
        assert above.verdict == NOT_COMPARABLE
        assert f"mindskip skipped {routed_rate:.0%} and mindskip@static 40%" in above.reasons[0]


def test_mindskip_claims_without_a_reference_or_control_are_not_measured(fake_results: Path) -> None:
    _write(fake_results, _summary("calm", "mindskip", [1.0, 0.0]), _records([1.0, 0.0]))
    got = _by_claim(fake_results)
    (kept,) = [v for v in got["rt-claim-quality-kept"] if v.subject.startswith("calm")]
    assert kept.verdict == NOT_MEASURED and "no autoregressive result" in kept.reasons[0]
    (above,) = [v for v in got["rt-claim-routing-above-static"] if v.subject.startswith("calm")]
    assert above.verdict == NOT_MEASURED and "no mindskip@static result" in above.reasons[0]


def test_mindskip_claims_on_a_task_the_model_cannot_do_are_not_measured(fake_results: Path) -> None:
    zeros = [0.0] * 8
    for model, method in (("calm", "autoregressive"), ("calm", "mindskip"), ("calm", "mindskip@static")):
        summary = {**_summary(model, method, zeros), "base_method": method.split("@")[0]}
        _write(fake_results, summary, _records(zeros))
    got = _by_claim(fake_results)
    for claim in ("rt-claim-quality-kept", "rt-claim-routing-above-static"):
        (verdict,) = [v for v in got[claim] if v.subject.startswith("calm")]
        assert verdict.verdict == NOT_MEASURED
        assert "scores 0 exact_match on topv2 with every layer" in verdict.reasons[0]
