"""The report stage: result files -> README tables, CSV, metrics.json and plots (from fixture results)."""

from __future__ import annotations

import json
import runpy
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from exitbench.errors import ExitbenchError
from exitbench.replications import load_replications
from exitbench.report.plots import renumber_clip_ids, write_plots
from exitbench.report.results import load_results
from exitbench.report.tables import calibration_section, render_readme, write_text_outputs

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures" / "results"
PAPERS = load_replications(REPO / "replications")


@pytest.fixture()
def results_copy(tmp_path: Path) -> Path:
    """A writable copy of the fixture results, named ``results`` like the real directory."""
    target = tmp_path / "results"
    shutil.copytree(FIXTURES, target)
    return target


def _edit(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def test_fixtures_load_every_stage() -> None:
    results = load_results(FIXTURES)
    assert len(results.evals) == 12
    assert results.eval_models() == ["base", "layerskip"]
    assert results.eval_tasks() == ["cnndm", "humaneval", "topv2"]
    assert results.sweep is not None and len(results.sweep.rows) == 26
    assert [p.model for p in results.probes] == ["base", "layerskip"]
    assert len(results.calibrations) == 1 and len(results.cost_models) == 1 and len(results.trains) == 1
    assert results.evals[0].provenance.extra("num_parameters") == 134515008


def test_fixture_field_names_and_documented_names_both_load(results_copy: Path) -> None:
    """Fixtures use the stage writers' names; the documented ones (agreement, rows, risk, ...) load too."""
    before = load_results(results_copy)
    cal = before.calibrations[0]
    assert cal.consistency == "textual"  # the top-level "risk" objective
    assert cal.rows[0].calibration_risk == 0.054 and cal.rows[0].quality_vs_greedy == pytest.approx(0.946)

    def documented_probe(d: dict) -> None:
        for curve in d["texts"].values():
            curve["agreement"] = curve.pop("top1_agreement")

    def documented_calibration(d: dict) -> None:
        d["rows"] = d.pop("results")
        d.pop("risk")
        for row in d["rows"]:
            row["calibration_risk"] = row.pop("calibration_mean_risk")
            row["quality_vs_greedy"] = 0.5
            row.pop("quality")
        for curve in d["curves"]:
            curve["risk"], curve["speedup"] = curve.pop("calibration_mean_risk"), curve.pop("speedup_vs_greedy")

    _edit(results_copy / "probe" / "base.json", documented_probe)
    _edit(results_copy / "calibrate" / "layerskip.json", documented_calibration)
    after = load_results(results_copy)
    assert after.probes[0].texts == before.probes[0].texts
    assert after.calibrations[0].curves == cal.curves
    assert after.calibrations[0].rows[0].calibration_risk == cal.rows[0].calibration_risk
    assert after.calibrations[0].rows[0].quality_vs_greedy == 0.5 and after.calibrations[0].consistency is None


def test_readme_eval_table_rows(tmp_path: Path) -> None:
    readme = render_readme(load_results(FIXTURES), PAPERS, "cpu", [], tmp_path)
    topv2 = readme.split("### topv2", 1)[1].split("### ", 1)[0]
    assert (
        "| method | options | exact_match | ms/token | speed-up | acceptance | tokens/round | ideal fraction | failed "
        "| exactness |" in topv2
    )
    assert "| self_speculative | E=8 d=2 | 0.620 | 14.10 | 1.52x | 71.0% | 2.30 | 0.62 | 0 | exact (10/10) |" in topv2
    early = "| early_exit | E=15 | 0.440 | 9.80 | 2.18x | – | – | – | 0 | lossy: 9/10 differ, 1st divergence ~3 |"
    assert early in topv2
    assert "| self_speculative | E=8 d=2 | 0.558 | 26.00 | 0.81x | 18.0% |" in topv2  # base model: a slow-down
    # provenance line: model, dtype, samples, hardware, threads, commit, date, command
    assert ("model `layerskip` · float32 · 10 samples · AMD EPYC 7R13 Processor · 16 threads · commit `0123456789ab` "
            "· 2026-12-02T14:00:00+00:00 · `evaluate.py --config build/config/evaluate.json`") in topv2
    assert "| self_speculative | 0.700 | 0.550 |" in topv2  # per-domain exact match
    assert "layerskip Table 6: Llama 1.5B, H100, E6 d8 · self_speculative **2.00x**" in topv2
    cnndm = readme.split("### cnndm", 1)[1].split("### ", 1)[0]
    assert "| method | options | rouge2 | rouge1 | rougeL |" in cnndm  # primary metric first
    assert "`python pipelines/use_profile.py cpu && dvc repro`" in readme


def test_readme_other_sections(tmp_path: Path) -> None:
    readme = render_readme(load_results(FIXTURES), PAPERS, "cpu", [], tmp_path)
    assert "- best for `layerskip` (float32): self_speculative E=15 d=1 → **1.16x**" in readme
    assert "| layerskip | float32 | self_speculative | 15 | 1 | 18.07 |" in readme
    assert "| topv2 | layerskip | 0.32 | 0.79 | 0.97 | 1.00 |" in readme  # probe at layers 8, 15, 22, 30
    assert "| text | model | layer 8 | layer 15 | layer 22 | layer 30 |" in readme
    assert table_row("layerskip", "0.10", "propagate", "softmax", "0.70", "yes", "0.054", "0.059", "yes", "26.4",
                     "1.66x", "0.095 / 0.100") in readme
    assert "| curriculum | rotational | gradual |" in readme  # ours vs the paper's TOPv2 recipe
    assert "| ls-t6-llama-1.5b-topv2-self-spec-e6 | llama-1.5b |" in readme  # cost-model prediction


def table_row(*cells: str) -> str:
    return "| " + " | ".join(cells) + " |"


def synthetic_calibration(model: str) -> dict:
    """A calibrate-stage file: certified, uncertified (too few rows), a test-risk violation, no speed-up."""
    def row(task: str, delta: float, kv: str, **changes) -> dict:
        base = {"task": task, "measure": "softmax", "kv_strategy": kv, "delta": delta, "epsilon": 0.05,
                "threshold": 0.7, "threshold_index": 1, "certified": True, "calibration_mean_risk": 0.05,
                "test_risk": 0.04, "risk_ok": True, "avg_exit_layer": 20.5, "speedup_vs_greedy": 1.25,
                "quality": {"metric": "exact_match", "calm": 0.4, "greedy": 0.5},
                "num_calibration": 12, "min_num_calibration": 9, "num_test": 3}
        return {**base, **changes}

    return {
        "model": model, "num_layers": 30, "risk": "textual", "speedup_measures": "decode phase only",
        "results": [
            row("topv2", 0.3, "propagate"),
            row("topv2", 0.1, "recompute", threshold=1.0, threshold_index=-1, certified=False,
                calibration_mean_risk=0.0, test_risk=0.0, avg_exit_layer=30.0, speedup_vs_greedy=0.97,
                min_num_calibration=29),
            row("topv2", 0.3, "monotonic", test_risk=0.45, risk_ok=False, speedup_vs_greedy=None),
            row("humaneval", 0.3, "propagate", quality={"metric": "pass@1", "calm": 0.0, "greedy": 0.0}),
        ],
        "curves": [],
        "provenance": {"git_commit": "0123456789abcdef", "device": "cpu", "date": "2026-01-01", "command": "x"},
    }


def test_calibration_table_on_a_synthetic_file(results_copy: Path) -> None:
    (results_copy / "calibrate" / "layerskip.json").write_text(json.dumps(synthetic_calibration("layerskip")))
    (results_copy / "calibrate" / "calm.json").write_text(json.dumps(synthetic_calibration("calm")))
    (results_copy / "calibrate" / "calm").mkdir()  # the generations folder is not a result file
    (results_copy / "calibrate" / "calm" / "generations.jsonl").write_text("{}\n")
    lines = calibration_section(load_results(results_copy))
    text = "\n".join(lines)
    assert "Speed-up: decode phase only." in text and "(2 of 8 rows)" in text
    assert text.index("### humaneval") < text.index("### topv2")
    certified = ("0.70", "yes", "0.050", "0.040", "yes", "20.5", "1.25x")
    assert table_row("calm", "0.30", "propagate", "softmax", *certified, "0.400 / 0.500") in lines
    assert table_row("calm", "0.30", "propagate", "softmax", *certified, "0.000 / 0.000") in lines  # humaneval
    assert table_row("layerskip", "0.10", "recompute", "softmax", "fallback λ=1", "no (n=12 < 29)", "0.000", "0.000",
                     "yes", "30.0", "0.97x", "0.400 / 0.500") in lines
    assert table_row("layerskip", "0.30", "monotonic", "softmax", "0.70", "yes", "0.050", "0.450", "**no: violation**",
                     "20.5", "–", "0.400 / 0.500") in lines
    header = next(line for line in lines if line.startswith("| model | δ |"))
    assert header.endswith("| quality calm / greedy (pass@1) |")
    topv2 = lines[lines.index("### topv2"):]
    assert [line.split(" | ")[0] for line in topv2 if line.startswith("| calm") or line.startswith("| layerskip")] == \
        ["| calm"] * 3 + ["| layerskip"] * 3  # sorted by model, then δ, then KV strategy
    row = load_results(results_copy).calibrations[0].rows[1]
    assert row.certified is False and row.quality_metric == "exact_match" and row.quality_vs_greedy == 0.8


def test_missing_optional_stages_say_not_run(results_copy: Path, tmp_path: Path) -> None:
    for stage in ("bench", "probe", "calibrate", "cost_model", "train"):
        shutil.rmtree(results_copy / stage)
    results = load_results(results_copy)
    assert results.sweep is None and not results.probes and not results.calibrations
    readme = render_readme(results, PAPERS, "cpu", [], tmp_path)
    assert readme.count("_not run in this profile (no result files)._") == 5
    assert write_plots(results, PAPERS, tmp_path / "plots")  # eval plots are still drawn


def test_text_outputs_csv_and_metrics(tmp_path: Path) -> None:
    written = write_text_outputs(load_results(FIXTURES), PAPERS, tmp_path, "cpu", [])
    names = {p.relative_to(tmp_path).as_posix() for p in written}
    assert {"README.md", "metrics.json", "tables/eval.csv", "tables/sweep.csv", "tables/probe.csv",
            "tables/calibrate.csv", "tables/predicted_vs_reported.csv", "tables/paper_rows.csv"} <= names
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    entry = metrics["eval"]["layerskip/topv2/self_speculative"]
    assert entry == {"speedup": round(21.4 / 14.1, 4), "ms_per_token": 14.1, "acceptance": 0.71, "exact_match": 0.62}
    assert metrics["sweep"]["layerskip/float32"]["best_exit_layer"] == 15
    header = (tmp_path / "tables" / "eval.csv").read_text().splitlines()[0]
    assert header.startswith("model,task,method,options,dtype,num_samples,num_failed,quality_exact_match")


def test_malformed_result_file_is_one_clear_error(results_copy: Path) -> None:
    path = results_copy / "eval" / "layerskip" / "topv2" / "self_speculative.json"
    _edit(path, lambda d: d["speed"].update(time_per_token_ms="fast"))
    with pytest.raises(ExitbenchError) as err:
        load_results(results_copy)
    message = str(err.value)
    assert "\n" not in message
    assert str(path) in message and "'speed.time_per_token_ms'" in message and "'fast'" in message


@pytest.mark.parametrize(
    ("relative", "change", "expected"),
    [
        ("eval/base/topv2/early_exit.json", lambda d: d.pop("correctness"), "'correctness' is missing"),
        ("eval/base/topv2/early_exit.json", lambda d: d.update(method="self_speculative"),
         "the path says 'early_exit'"),
        ("bench/sweep.json", lambda d: d["rows"][3].update(acceptance_rate=1.7), "'rows.3.acceptance_rate'"),
        ("probe/base.json", lambda d: d["texts"]["code"].update(confidence=[0.5]), "confidence has 1 layers"),
        ("cost_model/cpu-float32.json", lambda d: d["shapes"]["llama2-7b"]["c_verify"].update({"8-12": 0.8}),
         "keys must be 'E,d'"),
        ("calibrate/layerskip.json", lambda d: d["curves"][0].update(risk=[0.1]), "risk has 1 values"),
    ],
)
def test_malformed_fields_name_file_and_field(results_copy: Path, relative: str, change, expected: str) -> None:
    _edit(results_copy / relative, change)
    with pytest.raises(ExitbenchError, match=None) as err:
        load_results(results_copy)
    assert relative in str(err.value) and expected in str(err.value)
    assert "\n" not in str(err.value)


def test_invalid_json_and_missing_directory(results_copy: Path, tmp_path: Path) -> None:
    (results_copy / "train" / "layerskip.json").write_text('{"steps": 3,')
    with pytest.raises(ExitbenchError, match=r"train/layerskip\.json: not valid JSON \(line 1"):
        load_results(results_copy)
    with pytest.raises(ExitbenchError, match="results directory not found"):
        load_results(tmp_path / "absent")


def test_plots_are_written_as_png_and_svg(tmp_path: Path) -> None:
    files = write_plots(load_results(FIXTURES), PAPERS, tmp_path)
    pngs = sorted(p.name for p in files if p.suffix == ".png")
    assert pngs == ["acceptance_vs_exit.png", "calm_cnndm.png", "calm_topv2.png", "readability.png",
                    "speedup_vs_quality_cnndm.png", "speedup_vs_quality_humaneval.png",
                    "speedup_vs_quality_topv2.png", "sweep_heatmap.png"]
    for path in files:
        assert path.exists() and path.stat().st_size > 0
        if path.suffix == ".png":
            assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
            assert path.with_suffix(".svg").exists()
    data = {p.name: p.read_text().splitlines()[0] for p in files if p.suffix == ".csv"}
    assert data == {
        "speedup_vs_quality.csv": "source,task,model,method,config,quality_metric,quality,speedup",
        "sweep_speedup.csv": "model,dtype,method,exit_layer,num_speculations,speedup_vs_greedy",
        "acceptance_vs_exit.csv": "model,method,dtype,num_speculations,exit_layer,acceptance_rate",
        "readability.csv": "model,text,layer,agreement",
        "calm_threshold.csv": "model,task,measure,kv_strategy,threshold,risk,speedup",
    }


def test_report_cli(results_copy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "report.json"
    config.write_text(json.dumps({"profile": "cpu", "base": {}}))
    main = runpy.run_path(str(REPO / "pipelines" / "report.py"))["main"]
    out = tmp_path / "out"
    args = ["--config", str(config), "--results", str(results_copy), "--replications", str(REPO / "replications")]
    assert main([*args, "--out", str(out)]) == 0
    readme = (out / "README.md").read_text()
    assert "![sweep heatmap](plots/sweep_heatmap.png)" in readme
    assert (out / "plots" / "data" / "acceptance_vs_exit.csv").exists()
    _edit(results_copy / "probe" / "base.json", lambda d: d.update(num_layers="thirty"))
    assert main([*args, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "probe/base.json" in err and "'num_layers'" in err and "\n" not in err


def test_report_package_never_imports_torch() -> None:
    code = ("import sys, exitbench.report.plots, exitbench.report.check, exitbench.report.tables; "
            "sys.exit(1 if 'torch' in sys.modules or 'transformers' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO).returncode == 0


def test_a_draft_vocabulary_beside_the_summaries_is_not_a_result(results_copy: Path) -> None:
    from exitbench.report.results import load_evals

    before = len(load_evals(results_copy))
    task_dir = next(path.parent for path in sorted((results_copy / "eval").glob("*/*/*.json")))
    (task_dir / "draft_vocab.json").write_text("[0, 1, 2]\n")
    assert len(load_evals(results_copy)) == before


def test_unchanged_results_give_byte_identical_svgs(tmp_path: Path) -> None:
    """Re-running report on the same results must not rewrite tracked plots (no per-run ids or dates)."""
    first = write_plots(load_results(FIXTURES), PAPERS, tmp_path / "a")
    write_plots(load_results(FIXTURES), PAPERS, tmp_path / "b")
    for path in (p for p in first if p.suffix == ".svg"):
        assert path.read_bytes() == (tmp_path / "b" / path.name).read_bytes(), path.name


def test_clip_ids_are_renumbered_in_order_of_use() -> None:
    run_a = '<clipPath id="p0fd0d3242f"/><clipPath id="pc652e88a11"/><g clip-path="url(#pc652e88a11)"/>'
    run_b = '<clipPath id="p9b87895e5d"/><clipPath id="p0123456789"/><g clip-path="url(#p0123456789)"/>'
    expected = '<clipPath id="clip0"/><clipPath id="clip1"/><g clip-path="url(#clip1)"/>'
    assert renumber_clip_ids(run_a) == renumber_clip_ids(run_b) == expected
    glyphs = '<path id="DejaVuSans-41"/><image id="image1bb7e569fd"/>'  # content-derived ids stay
    assert renumber_clip_ids(glyphs) == glyphs
