"""results/index.html: the report and check as HTML with sortable tables, and outputs side by side, escaped."""

from __future__ import annotations

import json
from pathlib import Path

from exitbench.report.page import GREEDY, SHOWN_SAMPLES, render_page, shown_outputs
from exitbench.tasks.base import TaskSettings
from exitbench.tasks.registry import TASKS

ROWS = [{"id": f"{domain}-{i}", "domain": domain, "utterance": f"set {domain} {i}",
         "semantic_parse": f"[IN:{domain.upper()} set {i} ]"} for domain in ("alarm", "timer") for i in range(4)]
HOSTILE = "<script>alert('x')</script>"


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def make_results(tmp_path: Path) -> tuple[Path, Path]:
    data, results = tmp_path / "data", tmp_path / "results"
    write_jsonl(data / "topv2" / "test.jsonl", ROWS)
    samples = TASKS["topv2"](TaskSettings(seed=1234)).samples(ROWS, 4)
    greedy = [{"index": i, "sample_id": s.sample_id, "completion": s.reference, "scores": {"exact_match": 1.0}}
              for i, s in enumerate(samples)]
    early = [{"index": i, "sample_id": s.sample_id, "completion": HOSTILE if i == 0 else s.reference,
              "scores": {"exact_match": 0.0 if i == 0 else 1.0}} for i, s in enumerate(samples)]
    write_jsonl(results / "eval" / GREEDY / "m" / "topv2" / f"{GREEDY}.jsonl", greedy)
    write_jsonl(results / "eval" / "early_exit" / "m" / "topv2" / "early_exit@2.jsonl", early)
    (results / "README.md").write_text("# Results\n\n| method | EM |\n|---|---:|\n| a | 0.5 |\n| b | 0.25 |\n\n"
                                       "![plot](plots/x.png)\n")
    (results / "check.md").write_text("# Check\n\n| row | verdict |\n|---|---|\n| r1 | reproduced |\n")
    return results, data


def test_the_page_holds_the_report_the_check_and_sortable_tables(tmp_path):
    results, data = make_results(tmp_path)
    page = render_page(results, data, seed=1234)
    assert page.count("<table>") == 3 and "<th>verdict</th>" in page and 'src="plots/x.png"' in page
    assert "addEventListener(\"click\"" in page  # the tables sort on a click of their header


def test_outputs_are_shown_beside_greedy_with_their_reference_and_escaped(tmp_path):
    results, data = make_results(tmp_path)
    shown = shown_outputs(results / "eval", data, "m", "topv2", seed=1234)
    assert len(shown) == min(4, SHOWN_SAMPLES)
    first = shown[0]
    assert first.reference.startswith("[IN:") and first.outputs["early_exit@2"] == (HOSTILE, 0.0)
    assert first.outputs[GREEDY] == (first.reference, 1.0)
    page = render_page(results, data, seed=1234)
    assert HOSTILE not in page and "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page
    assert 'class="out wrong"' in page and 'class="out right"' in page


def test_without_prepared_data_the_outputs_still_show(tmp_path):
    results, _ = make_results(tmp_path)
    shown = shown_outputs(results / "eval", tmp_path / "absent", "m", "topv2", seed=1234)
    assert shown and shown[0].reference == "" and shown[0].outputs["early_exit@2"][0] == HOSTILE
