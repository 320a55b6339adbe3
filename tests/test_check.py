"""The check stage: verdict rules at the tolerance edges, comparability, replication files, CLI errors."""

from __future__ import annotations

import dataclasses
import json
import runpy
import shutil
from pathlib import Path

import pytest

from exitbench.errors import ExitbenchError
from exitbench.replications import Setting, load_paper, load_replications
from exitbench.report.check import OurSetting, hardware_kind, incomparability, run_check
from exitbench.report.results import EvalResult, load_results
from exitbench.report.verdicts import (
    FIGURE,
    INCONCLUSIVE,
    NOT_COMPARABLE,
    NOT_MEASURED,
    NOT_REPRODUCED,
    REPRODUCED,
    interval_verdict,
    point,
    relative_band,
)
from exitbench.stats import Interval

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures" / "results"
PAPERS = load_replications(REPO / "replications")
HEADLINES = {"ls-t4-llama2-7b-cnndm-self-spec": 2.16, "ls-t5-llama1-7b-humaneval-self-spec": 1.82,
             "ls-t6-llama-1.5b-topv2-self-spec-e6": 2.0}


def _row(row_id: str):
    return next(row for paper in PAPERS for row in paper.rows if row.id == row_id)


# ------------------------------------------------------------------------------------------ verdict rule


def speedup_verdict(ours: float, reported: float, tolerance: float) -> str:
    """A figure's rule on a point value: ours inside reported ± tolerance x reported."""
    return interval_verdict(point(ours, 32), relative_band(reported, tolerance))


@pytest.mark.parametrize("reported", [2.16, 1.82, 2.0, 1.86, 3.53, 0.7])
@pytest.mark.parametrize("tolerance", [0.15, 0.1, 0.05, 0.0])
def test_exactly_at_tolerance_is_reproduced(reported: float, tolerance: float) -> None:
    for ours in (reported * (1 + tolerance), reported * (1 - tolerance)):
        assert speedup_verdict(ours, reported, tolerance) == REPRODUCED


@pytest.mark.parametrize("reported", [2.16, 1.82, 2.0, 1.86])
def test_just_beyond_tolerance_is_not_reproduced(reported: float) -> None:
    for ours in (reported * (1.15 + 1e-6), reported * (0.85 - 1e-6)):
        assert speedup_verdict(ours, reported, 0.15) == NOT_REPRODUCED


def test_inside_tolerance_and_far_outside() -> None:
    assert speedup_verdict(2.0, 2.0, 0.15) == REPRODUCED
    assert speedup_verdict(1.0, 2.0, 0.15) == NOT_REPRODUCED


def test_a_figure_is_judged_on_our_interval_like_a_claim() -> None:
    band = relative_band(2.0, 0.15)  # [1.7, 2.3]
    assert interval_verdict(Interval(2.0, 1.8, 2.2, 64), band) == REPRODUCED
    assert interval_verdict(Interval(2.2, 2.1, 2.4, 64), band) == INCONCLUSIVE  # straddles 2.3
    assert interval_verdict(Interval(1.2, 1.1, 1.3, 64), band) == NOT_REPRODUCED


# ------------------------------------------------------------------------------------------ comparability

GPU_7B = Setting(model="Llama2 7B", params_b=7.0, hardware="H100", hardware_kind="gpu", metric="rouge2")


@pytest.mark.parametrize(
    ("device", "kind"),
    [("NVIDIA H200", "gpu"), ("NVIDIA A100-SXM4-80GB", "gpu"), ("AMD EPYC 7R13 Processor", "cpu"),
     ("Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz", "cpu"), ("TPU v4", "tpu"), ("", "unknown")],
)
def test_hardware_kind(device: str, kind: str) -> None:
    assert hardware_kind(device) == kind


def test_small_model_on_cpu_is_not_comparable_to_7b_on_gpu() -> None:
    reasons = incomparability(GPU_7B, OurSetting("AMD EPYC 7R13 Processor", "cpu", 134_515_008))
    assert len(reasons) == 2
    assert reasons[0].startswith("hardware: paper on H100 (GPU), ours on AMD EPYC 7R13 Processor (CPU)")
    assert reasons[1] == "model size: ours 135M vs paper 7B (52x smaller)"


def test_same_size_on_a_gpu_is_comparable() -> None:
    assert incomparability(GPU_7B, OurSetting("NVIDIA H200", "gpu", 6.74e9)) == []


@pytest.mark.parametrize(
    ("ours", "needle"),
    [
        (OurSetting("NVIDIA H200", "gpu", 13.0e9), "1.9x larger"),
        (OurSetting("NVIDIA H200", "gpu", None), "ours is not recorded"),
        (OurSetting("unknown", "unknown", 7e9), "our device is not recorded"),
        (OurSetting("NVIDIA H200", "gpu", 7e9, architecture="encoder-decoder"), "architecture"),
    ],
)
def test_not_comparable_reasons(ours: OurSetting, needle: str) -> None:
    reasons = incomparability(GPU_7B, ours)
    assert len(reasons) == 1 and needle in reasons[0]


def test_paper_without_a_size_is_not_comparable() -> None:
    setting = GPU_7B.model_copy(update={"params_b": None})
    reasons = incomparability(setting, OurSetting("NVIDIA H200", "gpu", 7e9))
    assert reasons == ["model size: the paper does not state it"]


# ------------------------------------------------------------------------------------------ whole check


def test_every_headline_figure_gets_a_verdict_with_our_figure() -> None:
    verdicts = run_check(PAPERS, load_results(FIXTURES), 0.15)
    for row_id, reported in HEADLINES.items():
        mine = [v for v in verdicts if v.claim_id == row_id]
        assert mine, row_id
        for v in mine:
            assert v.headline and v.paper_value == reported and v.kind == FIGURE
            assert v.verdict == NOT_COMPARABLE  # a 135M model on a CPU vs the paper's GPU models
            assert v.ours is not None and v.ratio == pytest.approx(v.ours.estimate / reported)
            assert any(r.startswith("hardware:") for r in v.reasons)
    topv2 = {v.model: v for v in verdicts if v.claim_id == "ls-t6-llama-1.5b-topv2-self-spec-e6"}
    assert set(topv2) == {"base", "layerskip"}
    assert topv2["layerskip"].ours.estimate == pytest.approx(21.4 / 14.1)
    assert "E differs: ours 8, paper 6" in topv2["layerskip"].notes


def test_unmeasured_rows_and_ablations_say_why() -> None:
    verdicts = {v.claim_id: v for v in run_check(PAPERS, load_results(FIXTURES), 0.15)}
    xsum = verdicts["ls-t3-llama2-7b-xsum-self-spec"]
    assert xsum.verdict == NOT_MEASURED and xsum.ours is None
    assert "no result for task 'xsum'" in xsum.reasons[0]
    kvq = verdicts["ls-t7-topv2-self-spec-e18-kvq-reuse"]
    assert kvq.verdict == NOT_MEASURED and "kvq_reuse" in kvq.reasons[0]
    calm = verdicts["calm-t2-cnndm-risk-0.05-softmax"]  # timed on the fixture's few test prompts: shown, not judged
    assert calm.verdict == NOT_MEASURED and calm.ours is not None
    why = calm.reasons[0]
    assert why.startswith("timed on ") and why.endswith("fewer than the 16 a quoted speed-up needs")
    assert any(r.startswith("architecture") for r in calm.reasons)


def _gpu_results(speedup: float):
    """The fixture results, with layerskip/topv2/self_speculative re-measured as a 1.5B model on an H100."""
    results = load_results(FIXTURES)
    evals = []
    for r in results.evals:
        if (r.model, r.task, r.method) == ("layerskip", "topv2", "self_speculative"):
            data = r.model_dump()
            data["speed"]["speedup_vs_greedy"] = speedup
            data["options"] = {"exit_layer": 6, "num_speculations": 8}
            data["provenance"].update(device="NVIDIA H100 80GB HBM3", num_parameters=1_500_000_000)
            r = EvalResult.model_validate(data)
        evals.append(r)
    return dataclasses.replace(results, evals=tuple(evals))


@pytest.mark.parametrize(("speedup", "verdict"), [(2.0 * 1.15, REPRODUCED), (2.0 * 0.85, REPRODUCED),
                                                  (2.0 * 1.16, NOT_REPRODUCED), (1.2, NOT_REPRODUCED)])
def test_comparable_measurement_gets_a_tolerance_verdict(speedup: float, verdict: str) -> None:
    verdicts = run_check(PAPERS, _gpu_results(speedup), 0.15)
    mine = next(v for v in verdicts if v.claim_id == "ls-t6-llama-1.5b-topv2-self-spec-e6" and v.model == "layerskip")
    assert mine.verdict == verdict and mine.reasons == ()
    assert mine.ratio == pytest.approx(speedup / 2.0)
    assert f"ours/paper {speedup / 2.0:.2f}" in mine.notes
    assert not any("differs" in n for n in mine.notes)


def test_row_tolerance_overrides_the_default() -> None:
    paper = PAPERS[[p.id for p in PAPERS].index("layerskip")]
    rows = tuple(r.model_copy(update={"tolerance": 0.5}) if r.id == "ls-t6-llama-1.5b-topv2-self-spec-e6" else r
                 for r in paper.rows)
    papers = (paper.model_copy(update={"rows": rows}),)
    mine = next(v for v in run_check(papers, _gpu_results(1.2), 0.15)
                if v.claim_id == "ls-t6-llama-1.5b-topv2-self-spec-e6" and v.model == "layerskip")
    assert mine.tolerance == 0.5 and mine.verdict == REPRODUCED


# ------------------------------------------------------------------------------------------ replication files


def test_replication_files_hold_the_papers_figures() -> None:
    rows = {row.id: row for paper in PAPERS for row in paper.rows}
    assert {r for r, row in rows.items() if row.headline} == set(HEADLINES)
    assert rows["ls-t3-llama2-7b-cnndm-self-spec"].reported.acceptance == 0.689
    assert (rows["ls-t3-llama2-7b-cnndm-self-spec"].setting.exit_layer,
            rows["ls-t3-llama2-7b-cnndm-self-spec"].setting.num_speculations) == (8, 12)
    assert rows["ls-t6-llama-1.5b-topv2-self-spec-e6"].reported.acceptance == 0.76
    assert rows["ls-t6-llama-1.5b-topv2-self-spec-e6"].reported.baseline.quality == {"exact_match": 0.859}
    assert rows["calm-t2-cnndm-risk-0.05-softmax"].reported.speedup == 3.53
    assert all(row.notes for row in rows.values() if row.unverified)
    training = {t.id: t for paper in PAPERS for t in paper.training}
    assert (training["continual-llama2-7b"].p_max, training["continual-llama2-7b"].e_scale,
            training["continual-llama2-7b"].rotation, training["continual-llama2-7b"].lr) == (0.1, 0.2, 8, 3e-5)
    topv2 = training["topv2-llama-1.5b"]
    assert (topv2.p_max, topv2.e_scale, topv2.early_exit_curriculum, topv2.lr, topv2.batch_size, topv2.steps) == (
        0.2, 1.0, "gradual", 1e-4, 32, 5800)
    assert (training["code-llama1-7b"].p_max, training["code-llama1-7b"].e_scale,
            training["code-llama1-7b"].rotation) == (0.1, 1.0, 16)


def test_malformed_replication_file_is_one_line(tmp_path: Path) -> None:
    text = (REPO / "replications" / "layerskip.yaml").read_text()
    text = text.replace("      exit_layer: 8\n", "      exit_layr: 8\n", 1)
    path = tmp_path / "layerskip.yaml"
    path.write_text(text)
    with pytest.raises(ExitbenchError) as err:
        load_paper(path)
    assert str(err.value) == f"{path}: unknown key 'rows.0.setting.exit_layr'"


def test_unverified_row_needs_a_note(tmp_path: Path) -> None:
    text = (REPO / "replications" / "layerskip.yaml").read_text()
    marker = "    maps_to: {task: cnndm, method: early_exit}\n"
    path = tmp_path / "bad.yaml"
    path.write_text(text.replace(marker, marker + "    unverified: true\n", 1))
    with pytest.raises(ExitbenchError, match=r"bad\.yaml: 'rows\.0': Value error, an unverified row needs a note"):
        load_paper(path)


# ------------------------------------------------------------------------------------------ CLI


def _cli(tmp_path: Path, results: Path) -> tuple[int, Path]:
    config = tmp_path / "check.json"
    config.write_text(json.dumps({"profile": "cpu", "base": {}, "check": {"default_tolerance": 0.15}}))
    main = runpy.run_path(str(REPO / "pipelines" / "check.py"))["main"]
    out = tmp_path / "out"
    code = main(["--config", str(config), "--results", str(results), "--replications", str(REPO / "replications"),
                 "--out", str(out)])
    return code, out


def test_check_cli_writes_markdown_and_json(tmp_path: Path) -> None:
    code, out = _cli(tmp_path, FIXTURES)
    assert code == 0  # misses and incomparable rows are results, not failures
    report = json.loads((out / "check.json").read_text())
    figures = [v for v in report["verdicts"] if v["kind"] == "figure"]
    own = [v for v in report["verdicts"] if v["kind"] == "speculative_bound_paper"]
    claims = [v for v in report["verdicts"] if v not in figures and v not in own]
    assert own and sum(report["summary_paper_consistency"].values()) == len(own)  # counted apart
    assert sum(report["summary"].values()) == len(figures) + len(claims)
    assert sum(report["summary_claims"].values()) == len(claims) > 0
    assert sum(report["summary_figures"].values()) == len(figures)
    assert {key.split("/")[0] for key in report["headline"]} == set(HEADLINES)
    claim_ids = {c.id for paper in PAPERS for c in paper.claims}
    assert {c["id"] for c in [*claims, *own]} == claim_ids  # every claim gets at least one verdict
    markdown = (out / "check.md").read_text()
    assert markdown.index("## Claims") < markdown.index("## The papers' own consistency") < markdown.index(
        "## Published figures") < markdown.index("### Headline")
    assert "| `ls-t6-llama-1.5b-topv2-self-spec-e6` ★: Llama 1.5B" in markdown
    assert "**not comparable** | hardware: paper on H100 (GPU)" in markdown
    rules = markdown.split("[replications/README.md](")[1].split(")")[0]
    assert (out / rules.split("#")[0]).resolve() == REPO / "replications" / "README.md"
    assert "## Verdict rules" in (REPO / "replications" / "README.md").read_text()


def test_check_cli_broken_input_is_exit_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results = tmp_path / "results"
    shutil.copytree(FIXTURES, results)
    path = results / "eval" / "autoregressive" / "base" / "topv2" / "autoregressive.json"
    path.write_text(path.read_text().replace('"num_samples": 10', '"num_samples": -1'))
    code, _ = _cli(tmp_path, results)
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert err.startswith(f"error: {path}: 'num_samples': Input should be greater than or equal to 0")
    code, _ = _cli(tmp_path, tmp_path / "missing")
    assert code == 2 and "results directory not found" in capsys.readouterr().err
