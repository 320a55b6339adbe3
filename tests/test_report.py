"""The report stage: result files -> README tables, CSV, metrics.json and plots (from fixture results)."""

from __future__ import annotations

import csv
import json
import runpy
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from exitbench.errors import ExitbenchError
from exitbench.replications import load_replications
from exitbench.report.plots import heatmap_label, renumber_clip_ids, write_plots
from exitbench.report.results import load_results
from exitbench.report.tables import calibration_section, render_readme, write_text_outputs
from exitbench.stats import Interval

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures" / "results"


def eval_path(root: Path, model: str, task: str, label: str) -> Path:
    """A summary's place: ``eval/<method stage>/<model>/<task>/<label>.json``."""
    return root / "eval" / label.split("@", 1)[0] / model / task / f"{label}.json"


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


def eval_part(readme: str, task: str) -> str:
    """One task's block of the per-task quality/speed section."""
    section = readme.split("## Quality, speed and exactness per task", 1)[1].split("\n## ", 1)[0]
    return section.split(f"### {task}", 1)[1].split("### ", 1)[0]


def test_readme_eval_table_rows(tmp_path: Path) -> None:
    """Summaries without intervals (written before evaluate stored them): each number with its n, no brackets."""
    readme = render_readme(load_results(FIXTURES), PAPERS, "cpu", [], tmp_path)
    topv2 = eval_part(readme, "topv2")
    assert (
        "| method | options | exact_match | ms/token | speed-up | acceptance | tokens/round | tokens/sample "
        "| ideal fraction | failed | exactness |" in topv2
    )
    assert (
        table_row(
            "self_speculative",
            "E=8 d=2",
            "0.620 (n=10)",
            "14.10",
            "(1.52x, n=10 < 16: not quoted)",
            "71.0% (n=10)",
            "2.30",
            "41.2",  # 412 tokens over 10 prompts
            "0.62",
            "0",
            "exact (10/10)",
        )
        in topv2
    )
    early = table_row(
        "early_exit",
        "E=15",
        "0.440 (n=10)",
        "9.80",
        "(2.18x, n=10 < 16: not quoted)",
        "–",
        "–",
        "41.2",
        "–",
        "0",
        "lossy: 9/10 differ, 1st divergence ~3",
    )
    assert early in topv2
    slower = "| self_speculative | E=8 d=2 | 0.558 (n=10) | 26.00 | (0.81x, n=10 < 16: not quoted) | 18.0% (n=10) |"
    assert slower in topv2
    # provenance line: model, dtype, samples, hardware, threads, commit, date, command
    assert (
        "model `layerskip` · float32 · 10 samples · AMD EPYC 7R13 Processor · 16 threads · commit `0123456789ab` "
        "· 2026-12-02T14:00:00+00:00 · `evaluate.py --config build/config/evaluate.json`"
    ) in topv2
    assert "| self_speculative | 0.700 (n=?) | 0.550 (n=?) |" in topv2  # per-domain: no counts stored
    assert "layerskip Table 6: Llama 1.5B, H100, E6 d8 · self_speculative **2.00x**" in topv2
    cnndm = eval_part(readme, "cnndm")
    assert "| method | options | rouge2 | rouge1 | rougeL |" in cnndm  # primary metric first
    assert "`python pipelines/use_profile.py cpu && dvc repro`" in readme


def test_readme_other_sections(tmp_path: Path) -> None:
    readme = render_readme(load_results(FIXTURES), PAPERS, "cpu", [], tmp_path)
    assert "- best for `layerskip` (float32): self_speculative E=15 d=1 → **(1.16x, n=4 < 16: not quoted)**" in readme
    assert (
        "| layerskip | float32 | self_speculative | 15 | 1 | 18.07 | 0.50 | (1.16x, n=4 < 16: not quoted) | - | "
        "76.0% (n=4) |"
    ) in readme
    assert "| layerskip | float32 | self_speculative | 15 | 1 | 18.07 |" in readme
    assert "| topv2 | layerskip | 0.32 | 0.79 | 0.97 | 1.00 |" in readme  # probe at layers 8, 15, 22, 30
    assert "| text | model | layer 8 | layer 15 | layer 22 | layer 30 |" in readme
    assert (
        table_row(
            "layerskip",
            "0.10",
            "propagate",
            "softmax",
            "0.70",
            "yes",
            "0.054",
            "0.059",
            "yes",
            "26.4",
            "(1.66x, n=8 < 16: not quoted)",
            "0.095 / 0.100",
        )
        in readme
    )
    assert "| curriculum | rotational | gradual |" in readme  # ours vs the paper's TOPv2 recipe
    assert "| ls-t6-llama-1.5b-topv2-self-spec-e6 | llama-1.5b |" in readme  # cost-model prediction


def table_row(*cells: str) -> str:
    return "| " + " | ".join(cells) + " |"


def synthetic_calibration(model: str) -> dict:
    """A calibrate-stage file: certified, uncertified (too few rows), a test-risk violation, no speed-up."""

    def row(task: str, delta: float, kv: str, **changes) -> dict:
        base = {
            "task": task,
            "measure": "softmax",
            "kv_strategy": kv,
            "delta": delta,
            "epsilon": 0.05,
            "threshold": 0.7,
            "threshold_index": 1,
            "certified": True,
            "calibration_mean_risk": 0.05,
            "test_risk": 0.04,
            "risk_ok": True,
            "avg_exit_layer": 20.5,
            "speedup_vs_greedy": 1.25,
            "quality": {"metric": "exact_match", "calm": 0.4, "greedy": 0.5},
            "num_calibration": 12,
            "min_num_calibration": 9,
            "num_test": 3,
        }
        return {**base, **changes}

    return {
        "model": model,
        "num_layers": 30,
        "risk": "textual",
        "speedup_measures": "decode phase only",
        "results": [
            row("topv2", 0.3, "propagate"),
            row(
                "topv2",
                0.1,
                "recompute",
                threshold=1.0,
                threshold_index=-1,
                certified=False,
                calibration_mean_risk=0.0,
                test_risk=0.0,
                avg_exit_layer=30.0,
                speedup_vs_greedy=0.97,
                min_num_calibration=29,
            ),
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
    certified = ("0.70", "yes", "0.050", "0.040", "yes", "20.5", "(1.25x, n=3 < 16: not quoted)")
    assert table_row("calm", "0.30", "propagate", "softmax", *certified, "0.400 / 0.500") in lines
    assert table_row("calm", "0.30", "propagate", "softmax", *certified, "0.000 / 0.000") in lines  # humaneval
    assert (
        table_row(
            "layerskip",
            "0.10",
            "recompute",
            "softmax",
            "fallback λ=1",
            "no (n=12 < 29)",
            "0.000",
            "0.000",
            "yes",
            "30.0",
            "(0.97x, n=3 < 16: not quoted)",
            "0.400 / 0.500",
        )
        in lines
    )
    assert (
        table_row(
            "layerskip",
            "0.30",
            "monotonic",
            "softmax",
            "0.70",
            "yes",
            "0.050",
            "0.450",
            "**no: violation**",
            "20.5",
            "–",
            "0.400 / 0.500",
        )
        in lines
    )
    header = next(line for line in lines if line.startswith("| model | δ |"))
    assert header.endswith("| quality calm / greedy (pass@1) |")
    topv2 = lines[lines.index("### topv2") :]
    assert [line.split(" | ")[0] for line in topv2 if line.startswith("| calm") or line.startswith("| layerskip")] == [
        "| calm"
    ] * 3 + ["| layerskip"] * 3  # sorted by model, then δ, then KV strategy
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
    assert {
        "README.md",
        "metrics.json",
        "tables/eval.csv",
        "tables/sweep.csv",
        "tables/probe.csv",
        "tables/calibrate.csv",
        "tables/predicted_vs_reported.csv",
        "tables/paper_rows.csv",
    } <= names
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    entry = metrics["eval"]["layerskip/topv2/self_speculative"]
    assert entry == {
        "speedup": round(21.4 / 14.1, 4),
        "speedup_n": 10,
        "ms_per_token": 14.1,
        "acceptance": 0.71,
        "acceptance_n": 10,
        "exact_match": 0.62,
        "exact_match_n": 10,
        "mismatch_rate": 0.0,
        "mismatch_rate_n": 10,
    }  # no intervals stored: no _low/_high keys
    assert metrics["sweep"]["layerskip/float32"]["best_exit_layer"] == 15
    header = (tmp_path / "tables" / "eval.csv").read_text().splitlines()[0]
    assert header.startswith(
        "model,task,method,base_method,options,dtype,num_samples,quality_exact_match,"
        "quality_exact_match_low,quality_exact_match_high,quality_exact_match_n"
    )
    # every number the README's table shows is in the CSV too (one column list renders both)
    for field in ("tokens_per_sample", "speedup_vs_framework_greedy", "num_failed", "ideal_fraction"):
        assert f",{field}," in header


def test_malformed_result_file_is_one_clear_error(results_copy: Path) -> None:
    path = eval_path(results_copy, "layerskip", "topv2", "self_speculative")
    _edit(path, lambda d: d["speed"].update(time_per_token_ms="fast"))
    with pytest.raises(ExitbenchError) as err:
        load_results(results_copy)
    message = str(err.value)
    assert "\n" not in message
    assert str(path) in message and "'speed.time_per_token_ms'" in message and "'fast'" in message


@pytest.mark.parametrize(
    ("relative", "change", "expected"),
    [
        ("eval/early_exit/base/topv2/early_exit.json", lambda d: d.pop("correctness"), "'correctness' is missing"),
        (
            "eval/early_exit/base/topv2/early_exit.json",
            lambda d: d.update(method="self_speculative"),
            "the path says 'early_exit'",
        ),
        ("bench/sweep.json", lambda d: d["rows"][3].update(acceptance_rate=1.7), "'rows.3.acceptance_rate'"),
        ("probe/base.json", lambda d: d["texts"]["code"].update(confidence=[0.5]), "confidence has 1 layers"),
        (
            "cost_model/cpu-float32.json",
            lambda d: d["shapes"]["llama2-7b"]["c_verify"].update({"8-12": 0.8}),
            "keys must be 'E,d'",
        ),
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
    assert pngs == [
        "acceptance_vs_exit.png",
        "calm_cnndm.png",
        "calm_topv2.png",
        "readability.png",
        "speedup_vs_quality_cnndm.png",
        "speedup_vs_quality_humaneval.png",
        "speedup_vs_quality_topv2.png",
        "sweep_heatmap.png",
    ]
    for path in files:
        assert path.exists() and path.stat().st_size > 0
        if path.suffix == ".png":
            assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
            assert path.with_suffix(".svg").exists()
    data = {p.name: p.read_text().splitlines()[0] for p in files if p.suffix == ".csv"}
    assert data == {
        "speedup_vs_quality.csv": "source,task,model,method,config,quality_metric,quality,quality_low,quality_high,"
        "quality_n,speedup,speedup_low,speedup_high,speedup_n",
        "sweep_speedup.csv": "model,dtype,method,exit_layer,num_speculations,speedup_vs_greedy,speedup_vs_greedy_low,"
        "speedup_vs_greedy_high,speedup_vs_greedy_n,acceptance_rate,acceptance_rate_low,acceptance_rate_high,"
        "acceptance_rate_n",
        "acceptance_vs_exit.csv": "model,method,dtype,num_speculations,exit_layer,acceptance_rate,acceptance_rate_low,"
        "acceptance_rate_high,acceptance_rate_n",
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
    code = (
        "import sys, exitbench.report.plots, exitbench.report.check, exitbench.report.tables; "
        "sys.exit(1 if 'torch' in sys.modules or 'transformers' in sys.modules else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO).returncode == 0


def test_a_draft_vocabulary_beside_the_summaries_is_not_a_result(results_copy: Path) -> None:
    from exitbench.report.results import load_evals

    before = len(load_evals(results_copy))
    task_dir = next(path.parent for path in sorted((results_copy / "eval").glob("*/*/*/*.json")))
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


# ------------------------------------------------------------------------------------------ intervals + control


def interval(estimate: float, low: float, high: float, n: int) -> dict:
    return Interval(estimate, low, high, n).to_dict()


def add_contract_fields(root: Path) -> None:
    """Give ``layerskip/topv2`` the evaluate stage's intervals, sample ids and sample block (the contract), and an
    exit-layer instance ``early_exit@8``."""

    def topv2(label: str) -> Path:
        return eval_path(root, "layerskip", "topv2", label)

    sample = {"seed": 1234, "strategy": "stratified", "num_samples": 10, "strata": {"alarm": 5, "weather": 5}}

    def greedy(d: dict) -> None:
        d["quality"]["per_domain"]["music"] = 0.5  # a domain only this result has
        d.update(
            sample_ids=[str(i) for i in range(10)],
            sample=sample,
            intervals={
                "exact_match": interval(0.62, 0.4, 0.8, 10),
                "per_domain/alarm": interval(0.7, 0.4, 0.9, 5),
                "per_domain/weather": interval(0.55, 0.2, 0.8, 5),
                "per_domain/music": interval(0.5, 0.1, 0.9, 2),
                "speedup_vs_greedy": interval(1.0, 1.0, 1.0, 10),
                "mismatch_rate": interval(0.0, 0.0, 0.0, 10),
            },
        )

    def early(d: dict) -> None:
        d.update(
            sample=sample,
            intervals={
                "exact_match": interval(0.44, 0.2, 0.65, 10),
                "speedup_vs_greedy": interval(2.18, 2.05, 2.31, 10),
                "mismatch_rate": interval(0.9, 0.7, 1.0, 10),
            },
        )

    def speculative(d: dict) -> None:
        d.update(
            sample=sample,
            intervals={
                "exact_match": interval(0.62, 0.4, 0.8, 10),
                "speedup_vs_greedy": interval(1.5177, 1.31, 1.74, 10),
                "acceptance_rate": interval(0.71, 0.64, 0.775, 10),
            },
        )

    _edit(topv2("autoregressive"), greedy)
    _edit(topv2("early_exit"), early)
    _edit(topv2("self_speculative"), speculative)
    instance = json.loads(topv2("early_exit").read_text())
    instance.update(
        method="early_exit@8",
        base_method="early_exit",
        options={"exit_layer": 8},
        quality={"exact_match": 0.2},
        intervals={"exact_match": interval(0.2, 0.05, 0.4, 10)},
    )
    topv2("early_exit@8").write_text(json.dumps(instance))


def add_control(root: Path) -> None:
    """A ``plain`` model on topv2 (layerskip's files, other numbers, no intervals) and its probe."""
    for label in ("autoregressive", "early_exit", "self_speculative"):
        source, target = (eval_path(root, model, "topv2", label).parent for model in ("layerskip", "plain"))
        shutil.copytree(source, target)
        for path in eval_path(root, "plain", "topv2", label).parent.glob("*.json"):
            _edit(path, lambda d: d.update(model="plain", intervals={}))
    eval_path(root, "plain", "topv2", "early_exit@8").unlink(missing_ok=True)
    _edit(eval_path(root, "plain", "topv2", "autoregressive"), lambda d: d["quality"].update(exact_match=0.6))
    _edit(eval_path(root, "plain", "topv2", "early_exit"), lambda d: d["quality"].update(exact_match=0.1))
    _edit(eval_path(root, "plain", "topv2", "self_speculative"), lambda d: d["speed"].update(acceptance_rate=0.2))
    probe = json.loads((root / "probe" / "layerskip.json").read_text())
    probe["model"] = "plain"
    probe["texts"]["topv2"]["top1_agreement"] = [0.05] * 30
    (root / "probe" / "plain.json").write_text(json.dumps(probe))


def test_intervals_render_in_the_markdown_tables(results_copy: Path, tmp_path: Path) -> None:
    add_contract_fields(results_copy)
    topv2 = eval_part(render_readme(load_results(results_copy), PAPERS, "cpu", [], tmp_path), "topv2")
    assert (
        table_row(
            "self_speculative",
            "E=8 d=2",
            "0.620 [0.400, 0.800] (n=10)",
            "14.10",
            "(1.52x, n=10 < 16: not quoted)",
            "71.0% [64.0, 77.5] (n=10)",
            "2.30",
            "41.2",  # 412 tokens over 10 prompts
            "0.62",
            "0",
            "exact (10/10)",
        )
        in topv2
    )
    assert (
        table_row(
            "early_exit",
            "E=15",
            "0.440 [0.200, 0.650] (n=10)",
            "9.80",
            "(2.18x, n=10 < 16: not quoted)",
            "–",
            "–",
            "41.2",
            "–",
            "0",
            "lossy: 9/10 differ (90.0% [70.0, 100.0]), 1st divergence ~3",
        )
        in topv2
    )
    assert "| early_exit@8 | E=8 | 0.200 [0.050, 0.400] (n=10) |" in topv2  # an instance label (base_method)
    layerskip = topv2.split("model `layerskip`", 1)[1].split("Per-domain", 1)[0]
    order = [line.split(" | ")[0].lstrip("| ") for line in layerskip.splitlines() if line.startswith("| early_exit")]
    assert order == ["early_exit@8", "early_exit"]  # instances of one method sorted by exit layer
    # TOPv2 per domain: every domain of any result, each cell with interval and n (strata where no interval)
    assert "| method | alarm | music | weather |" in topv2
    assert (
        table_row(
            "autoregressive", "0.700 [0.400, 0.900] (n=5)", "0.500 [0.100, 0.900] (n=2)", "0.550 [0.200, 0.800] (n=5)"
        )
        in topv2
    )
    assert table_row("early_exit", "0.497 (n=5)", "–", "0.391 (n=5)") in topv2


def test_intervals_in_csv_and_metrics_json(results_copy: Path, tmp_path: Path) -> None:
    add_contract_fields(results_copy)
    write_text_outputs(load_results(results_copy), PAPERS, tmp_path, "cpu", [])
    with (tmp_path / "tables" / "eval.csv").open() as handle:
        rows = {(r["model"], r["task"], r["method"]): r for r in csv.DictReader(handle)}
    speculative = rows[("layerskip", "topv2", "self_speculative")]
    assert (
        speculative["quality_exact_match"],
        speculative["quality_exact_match_low"],
        speculative["quality_exact_match_high"],
        speculative["quality_exact_match_n"],
    ) == ("0.62", "0.4", "0.8", "10")
    assert (speculative["speedup_vs_greedy_low"], speculative["speedup_vs_greedy_high"]) == ("1.31", "1.74")
    assert (speculative["acceptance_rate_low"], speculative["acceptance_rate_high"]) == ("0.64", "0.775")
    early = rows[("layerskip", "topv2", "early_exit")]
    assert (early["mismatch_rate_low"], early["mismatch_rate_high"], early["mismatch_rate_n"]) == ("0.7", "1.0", "10")
    assert rows[("layerskip", "topv2", "early_exit@8")]["base_method"] == "early_exit"
    old = rows[("base", "topv2", "self_speculative")]  # no intervals stored: empty bounds, n still given
    assert old["quality_exact_match_low"] == "" and old["quality_exact_match_n"] == "10"
    with (tmp_path / "tables" / "per_domain.csv").open() as handle:
        domains = [r for r in csv.DictReader(handle) if (r["model"], r["method"]) == ("layerskip", "autoregressive")]
    assert [(r["domain"], r["exact_match_low"], r["exact_match_n"]) for r in domains] == [
        ("alarm", "0.4", "5"),
        ("music", "0.1", "2"),
        ("weather", "0.2", "5"),
    ]
    entry = json.loads((tmp_path / "metrics.json").read_text())["eval"]["layerskip/topv2/self_speculative"]
    assert entry["speedup_low"] == 1.31 and entry["speedup_high"] == 1.74 and entry["speedup_n"] == 10
    assert entry["acceptance_low"] == 0.64 and entry["exact_match_high"] == 0.8 and entry["exact_match_n"] == 10


def test_comparison_of_plain_and_layerskip(results_copy: Path, tmp_path: Path) -> None:
    add_contract_fields(results_copy)
    add_control(results_copy)
    written = write_text_outputs(load_results(results_copy), PAPERS, tmp_path, "cpu", [])
    readme = (tmp_path / "README.md").read_text()
    section = readme.split("## plain vs layerskip (vs calm)", 1)[1].split("\n## ", 1)[0]
    assert (
        "`plain` is the control: the same finetune as `layerskip` (same data, steps, optimizer and seed) without "
        "layer dropout and with the loss on the last layer only" in section
    )
    topv2 = section.split("### topv2", 1)[1]
    assert "|  | `plain` | `layerskip` |" in topv2  # calm has no results: no column
    assert table_row("last layer: exact_match", "0.600 (n=10)", "0.620 [0.400, 0.800] (n=10)") in topv2
    assert table_row("early exit E=8: exact_match", "–", "0.200 [0.050, 0.400] (n=10)") in topv2
    assert table_row("early exit E=15: exact_match", "0.100 (n=10)", "0.440 [0.200, 0.650] (n=10)") in topv2
    # fraction of the same model's last layer: 0.1/0.6 and 0.4402/0.62, with [0.2/0.8, 0.65/0.4] where both intervals
    assert (
        table_row("early exit E=15 / last layer (≥90% interval)", "0.167 (n=10)", "0.710 [0.250, 1.625] (n=10)")
        in topv2
    )
    assert (
        table_row(
            "agreement with the last layer at layer 8",
            "0.050 (n=1 text, 256 positions of `topv2`)",
            "0.321 (n=1 text, 256 positions of `topv2`)",
        )
        in topv2
    )
    assert table_row("self-speculative acceptance (E=8, d=2)", "20.0% (n=10)", "71.0% [64.0, 77.5] (n=10)") in topv2
    assert "cannot separate" not in section  # the control is present
    assert tmp_path / "tables" / "compare.csv" in written
    with (tmp_path / "tables" / "compare.csv").open() as handle:
        cells = list(csv.DictReader(handle))
    fraction = next(
        c
        for c in cells
        if (c["task"], c["model"], c["quantity"], c["exit_layer"])
        == ("topv2", "layerskip", "early_exit_fraction_of_last_layer", "15")
    )
    assert float(fraction["estimate"]) == pytest.approx(0.4402 / 0.62)
    assert (float(fraction["low"]), float(fraction["high"]), fraction["n"], fraction["confidence"]) == (
        pytest.approx(0.25),
        pytest.approx(1.625),
        "10",
        "0.9",
    )
    assert {c["model"] for c in cells if c["task"] == "topv2"} == {"plain", "layerskip"}


def test_comparison_without_the_control_says_so(tmp_path: Path) -> None:
    readme = render_readme(load_results(FIXTURES), PAPERS, "cpu", [], tmp_path)
    section = readme.split("## plain vs layerskip (vs calm)", 1)[1].split("\n## ", 1)[0]
    assert "_`plain` has no results in this run, so these tables cannot separate" in section
    assert "|  | `layerskip` |" in section and "`base`" not in section
    assert table_row("early exit E=15 / last layer (≥90% interval)", "0.710 (n=10)") in section  # no intervals


def test_exact_method_timed_on_fewer_samples_reports_greedys_quality(results_copy: Path, tmp_path: Path) -> None:
    add_contract_fields(results_copy)
    _edit(
        eval_path(results_copy, "layerskip", "topv2", "self_speculative"),
        lambda d: d.update(
            quality={},
            quality_from={"method": "autoregressive", "n": 10, "why": "exact method"},
            num_samples=4,
            intervals={"speedup_vs_greedy": interval(1.5177, 1.2, 1.9, 4)},
        ),
    )
    topv2 = eval_part(render_readme(load_results(results_copy), PAPERS, "cpu", [], tmp_path), "topv2")
    assert (
        "| self_speculative † | E=8 d=2 | 0.620 [0.400, 0.800] (n=10) | 14.10 | (1.52x, n=4 < 16: not quoted) |"
        in topv2
    )
    assert "its quality is `autoregressive`'s (n=10) by construction" in topv2
    assert (
        table_row(
            "self_speculative", "0.700 [0.400, 0.900] (n=5)", "0.500 [0.100, 0.900] (n=2)", "0.550 [0.200, 0.800] (n=5)"
        )
        in topv2
    )  # per domain too


def sweep_with_intervals(root: Path) -> None:
    def change(d: dict) -> None:
        for row in d["rows"]:
            row.update(
                speedup_vs_greedy_low=row["speedup_vs_greedy"] - 0.1,
                speedup_vs_greedy_high=row["speedup_vs_greedy"] + 0.1,
                speedup_vs_greedy_n=16,
            )
            if row["acceptance_rate"] is not None:
                row.update(
                    acceptance_rate_low=row["acceptance_rate"] - 0.05,
                    acceptance_rate_high=row["acceptance_rate"] + 0.05,
                    acceptance_rate_n=16,
                )

    _edit(root / "bench" / "sweep.json", change)


def test_sweep_intervals_in_table_csv_heatmap_and_metrics(results_copy: Path, tmp_path: Path) -> None:
    sweep_with_intervals(results_copy)
    results = load_results(results_copy)
    written = write_text_outputs(results, PAPERS, tmp_path, "cpu", [])
    readme = (tmp_path / "README.md").read_text()
    assert (
        "| layerskip | float32 | self_speculative | 15 | 1 | 18.07 | 0.50 | 1.16x [1.06, 1.26] (n=16) | - | "
        "76.0% [71.0, 81.0] (n=16) |" in readme
    )
    assert "→ **1.16x [1.06, 1.26] (n=16)**" in readme
    best = json.loads((tmp_path / "metrics.json").read_text())["sweep"]["layerskip/float32"]
    assert (
        best["best_speedup_low"] == pytest.approx(best["best_speedup"] - 0.1, abs=1e-4)
        and best["best_acceptance_n"] == 16
    )
    with next(p for p in written if p.name == "sweep.csv").open() as handle:
        row = next(r for r in csv.DictReader(handle) if r["method"] == "self_speculative" and r["model"] == "layerskip")
    assert row["speedup_vs_greedy_low"] and row["acceptance_rate_high"] and row["acceptance_rate_n"] == "16"
    label = heatmap_label(
        next(r for r in results.sweep.rows if r.exit_layer == 15 and r.num_speculations == 1 and r.model == "layerskip")
    )
    assert label == "1.16x [1.06, 1.26]\nacc 76% [71, 81]"


def test_plots_carry_error_bar_data(results_copy: Path, tmp_path: Path) -> None:
    add_contract_fields(results_copy)
    sweep_with_intervals(results_copy)
    files = write_plots(load_results(results_copy), PAPERS, tmp_path)
    with (tmp_path / "data" / "speedup_vs_quality.csv").open() as handle:
        points = [
            r
            for r in csv.DictReader(handle)
            if (r["source"], r["task"], r["model"], r["method"]) == ("ours", "topv2", "layerskip", "early_exit")
        ]
    assert [(p["quality_low"], p["quality_high"], p["speedup_low"], p["speedup_high"]) for p in points] == [
        ("0.2", "0.65", "2.05", "2.31")
    ]
    with (tmp_path / "data" / "acceptance_vs_exit.csv").open() as handle:
        accepted = [r for r in csv.DictReader(handle) if r["model"] == "layerskip"]
    assert accepted and all(float(r["acceptance_rate_low"]) < float(r["acceptance_rate"]) for r in accepted)
    assert any(p.name == "speedup_vs_quality_topv2.png" for p in files)


def test_sweep_table_shows_the_roofline_and_the_a_a_noise_floor(results_copy: Path, tmp_path: Path) -> None:
    def change(d: dict) -> None:
        greedy = next(r for r in d["rows"] if r["method"] == "autoregressive" and r["model"] == "layerskip")
        greedy.update(bytes_per_token=5.38e8, roofline_ms_per_token=26.0, roofline_fraction=0.48)
        control = {**greedy, "method": "autoregressive (A/A)", "speedup_vs_greedy": 1.01}
        control["speedup_passes"] = [0.98, 1.04, 1.01]
        control.update(speedup_vs_greedy_low=0.97, speedup_vs_greedy_high=1.05, speedup_vs_greedy_n=16)
        drifted = {**control, "model": "plain", "speedup_vs_greedy_low": 1.02, "speedup_vs_greedy_high": 1.08}
        d["rows"] += [control, drifted]
        d["provenance"]["memory_bandwidth"] = {"float32": {"gb_per_s": 20.7, "mib_per_array": 256}}
        d["provenance"]["cpu_features"] = {"torch_capability": "AVX512", "flags": ["avx512f", "amx_bf16"]}
        d["provenance"]["verify_scaling"] = {
            "layerskip/float32": {
                "exit_layer": 15,
                "rows": [1, 2, 9],
                "relative_cost": [1.0, 1.09, 2.2],
                "one_row_ms": 31.0,
            }
        }

    _edit(results_copy / "bench" / "sweep.json", change)
    write_text_outputs(load_results(results_copy), PAPERS, tmp_path, "cpu", [])
    readme = (tmp_path / "README.md").read_text()
    assert "float32 triad 20.7 GB/s" in readme and "(avx512f, amx_bf16)" in readme
    greedy_line = next(
        line for line in readme.splitlines() if line.startswith("| layerskip | float32 | autoregressive |")
    )
    assert greedy_line.endswith("| 538 | 48 | yes |")
    assert (
        "- A/A control `layerskip` (float32): greedy against greedy 1.01x [0.97, 1.05] (n=16) (contains 1.00x); "
        "noise floor ±0.040x; one pass alone 0.98-1.04x" in readme
    )
    control_line = next(line for line in readme.splitlines() if "| autoregressive (A/A) |" in line)
    assert "| 0.98-1.04x |" in control_line
    assert "A/A control `plain` (float32): greedy against greedy 1.01x [1.02, 1.08] (n=16) (**misses 1.00x" in readme
    assert (
        "- verification over r rows (layers 15..L-1 and the head) costs, relative to one row (31.0 ms), "
        "`layerskip/float32`: 1: 1.00, 2: 1.09, 9: 2.20" in readme
    )
    assert "best for `layerskip` (float32): autoregressive" not in readme  # the control is never a method's best


def test_eval_table_prints_the_a_a_control_and_its_noise_floor(results_copy: Path, tmp_path: Path) -> None:
    """Greedy timed against greedy under its own label: its interval and half-width under the task's table."""
    folder = results_copy / "eval" / "autoregressive" / "layerskip" / "topv2"
    control = json.loads((folder / "autoregressive.json").read_text())
    control.update(method="autoregressive@aa", base_method="autoregressive")
    control["speed"]["speedup_vs_greedy"] = 1.01
    control["intervals"] = {"speedup_vs_greedy": {"estimate": 1.01, "low": 0.98, "high": 1.04, "n": 32}}
    (folder / "autoregressive@aa.json").write_text(json.dumps(control))
    readme = render_readme(load_results(results_copy), PAPERS, "cpu", [], tmp_path)
    assert (
        "A/A control (`autoregressive@aa`: greedy timed against greedy like a method): 1.01x [0.98, 1.04] (n=32) "
        "(contains 1.00x); noise floor ±0.030x." in eval_part(readme, "topv2")
    )


def test_a_summary_states_its_primary_metric_and_an_older_one_is_one_line_naming_the_migration(
    tmp_path: Path,
) -> None:
    """Summaries name their task's primary metric (the table's first quality column follows it); a summary of
    schema 1 is refused in one line that names the one-off migration, which makes it readable, numbers unchanged."""
    results = tmp_path / "results"
    shutil.copytree(FIXTURES, results)
    for path in (results / "eval").glob("*/*/cnndm/*.json"):
        _edit(path, lambda d: d.update(primary_metric="rouge1"))
    readme = render_readme(load_results(results), PAPERS, "cpu", [], tmp_path)
    assert "| method | options | rouge1 | rouge2 | rougeL |" in eval_part(readme, "cnndm")
    assert "| method | options | exact_match |" in eval_part(readme, "topv2")
    old = eval_path(results, "layerskip", "topv2", "autoregressive")
    before = json.loads(old.read_text())
    _edit(old, lambda d: [d.pop(key) for key in ("schema_version", "primary_metric", "framework")])
    with pytest.raises(ExitbenchError) as err:
        load_results(results)
    assert str(err.value).count("\n") == 0 and "scripts/migrate_summaries.py" in str(err.value)
    migrate = runpy.run_path(str(REPO / "scripts" / "migrate_summaries.py"))["main"]
    assert migrate([str(results)]) == 0
    after = json.loads(old.read_text())
    assert after == before  # the migration restores exactly what schema 2 states
    load_results(results)


def test_file_options_show_as_flags_not_paths():
    from exitbench.report.tables import options_text

    text = options_text({"calibration_file": "results/eval/swift/plain/topv2/calibration.json", "num_speculations": 8,
                         "draft_vocab_file": ""})
    assert text == "+calibration d=8"
    assert options_text({}) == "–"


def test_the_add_ons_training_reports_get_a_table_each(results_copy: Path, tmp_path: Path) -> None:
    assert "## Trained add-ons" not in render_readme(load_results(results_copy), PAPERS, "cpu", [], tmp_path)
    (results_copy / "adapters").mkdir()
    (results_copy / "adapters" / "base.json").write_text(json.dumps({
        "exit_layer": 2, "steps": 200, "seconds": 355.2, "held_out_positions": 1010,
        "agreement": {"early_exit": 0.044, "adapter_untrained": 0.044, "adapter_trained": 0.16},
        "kl": {"early_exit": 16.3, "adapter_untrained": 16.3, "adapter_trained": 4.95}}))
    (results_copy / "routers").mkdir()
    (results_copy / "routers" / "base.json").write_text(json.dumps({
        "granularity": "attention", "routing_context": "prompt", "routed_layers": list(range(14, 29)),
        "target_capacity": 0.5,
        "steps": 200, "seconds": 630.0, "held_out_positions": 1010,
        "routed": {"capacity": 0.65, "agreement": 0.703, "kl": 0.343},
        "static_control": {"skip": [14, 17, 22, 25, 26], "agreement": 0.696, "kl": 0.311}}))
    (results_copy / "routers" / "calm.json").write_text("[1, 2]")
    with pytest.raises(ExitbenchError, match=r"calm\.json: expected a JSON object"):
        load_results(results_copy)
    (results_copy / "routers" / "calm.json").unlink()
    readme = render_readme(load_results(results_copy), PAPERS, "cpu", [], tmp_path)
    section = readme[readme.index("## Trained add-ons"):]
    assert "| base | 2 | 200 | 355 | 1010 | 0.044 | 0.044 | 0.160 | 16.30 | 4.95 |" in section
    router_row = ("| base | attention | 14..28 | prompt | 0.50 | 200 | 630 | 1010 | 0.65 | 0.703 | 0.34 "
                  "| [14, 17, 22, 25, 26] |")
    assert router_row in section


def test_the_best_per_task_names_the_fastest_exact_method_and_the_lossy_front(results_copy: Path, tmp_path) -> None:
    """Per (task, model): the fastest exact method with its interval, the fastest lossy point keeping 90% of greedy's
    primary metric, and the lossy front; greedy's own variants are never contenders, thin timings never quoted."""
    def timed(label: str, speedup: float, n: int = 32, **change) -> None:
        path = eval_path(results_copy, "layerskip", "topv2", label)
        if not path.exists():  # a new lossy instance, copied from early exit
            path.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(eval_path(results_copy, "layerskip", "topv2", "early_exit"), path)
            _edit(path, lambda d: d.update(method=label, base_method=label.split("@")[0]))
        spread = interval(speedup, speedup - 0.1, speedup + 0.1, n)
        _edit(path, lambda d: (d["speed"].update(speedup_vs_greedy=speedup),
                               d.update(intervals={"speedup_vs_greedy": spread}, **change)))  # fmt: skip

    def row(results: Path) -> str:
        readme = render_readme(load_results(results), PAPERS, "cpu", [], tmp_path)
        section = readme.split("## The best per task")[1].split("\n## ")[0]
        return next(line for line in section.splitlines() if line.startswith("| topv2 | layerskip |"))

    timed("self_speculative", 1.5, n=8)
    assert "| – (none timed on 16 prompts or more) |" in row(results_copy)
    timed("self_speculative", 1.5)
    timed("autoregressive@linear", 1.9, correctness={"exact_claimed": True, "num_mismatched": 0})
    timed("early_exit", 2.2)  # EM 0.44 of greedy's 0.62: 0.71 kept
    timed("depth_pruning@4", 1.2, quality={"exact_match": 0.60}, options={})  # 0.97 kept, slower
    timed("depth_pruning@8", 1.1, quality={"exact_match": 0.50}, options={})  # beaten on both by depth_pruning@4
    line = row(results_copy)
    assert "| `self_speculative` (E=8 d=2) 1.50x [1.40, 1.60] (n=32) |" in line  # not greedy's linear kernel
    assert "| `depth_pruning@4` 1.20x [1.10, 1.30] (n=32), keeps 0.97 |" in line
    assert line.endswith("| early_exit 2.20x / 0.71; depth_pruning@4 1.20x / 0.97 |")
