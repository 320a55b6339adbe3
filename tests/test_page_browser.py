"""results/index.html in a real browser (headless Chromium): tables, rows and images render, the screenshot is
not blank. CI installs Debian's `chromium` and sets EXITBENCH_REQUIRE_BROWSER=1, so there a missing browser
fails; elsewhere these tests skip without one."""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from exitbench.report.browser import find_chromium, render, screenshot, section_screenshot
from exitbench.report.page import render_page
from tests.test_page import make_results

ROOT = Path(__file__).resolve().parents[1]

if find_chromium() is None:
    if os.environ.get("EXITBENCH_REQUIRE_BROWSER") == "1":
        raise RuntimeError("EXITBENCH_REQUIRE_BROWSER=1 but no Chromium is installed (apt-get install chromium)")
    pytest.skip("no Chromium installed (apt-get install chromium)", allow_module_level=True)


def ink(path: Path) -> tuple[float, int]:
    """The fraction of pixels that are not background white, and how many colours the picture has."""
    with Image.open(path) as image:
        pixels = np.asarray(image.convert("RGB"))
    return float((pixels != 255).any(axis=2).mean()), len(np.unique(pixels.reshape(-1, 3), axis=0))


def write_page(tmp_path: Path, plot: bool = True) -> Path:
    results, data = make_results(tmp_path)
    if plot:
        (results / "plots").mkdir()
        Image.new("RGB", (120, 80), (30, 90, 200)).save(results / "plots" / "x.png")
    page = results / "index.html"
    page.write_text(render_page(results, data, seed=1234))
    return page


def test_the_page_renders_its_tables_rows_and_plots_in_chromium(tmp_path):
    page = write_page(tmp_path)
    rendered = render(page)
    assert rendered.table_rows() == [1, 2, 4]  # the check's verdicts, the report's table, the outputs side by side
    assert rendered.images() == {"plots/x.png": "yes"}
    assert rendered.section_top("check") < rendered.section_top("results")  # the verdicts first
    shot = screenshot(page, tmp_path / "shot.png", width=900, height=700)
    covered, colours = ink(shot)
    assert covered > 0.02 and colours > 20  # text, table borders, the blue plot: not a blank page


def test_a_plot_that_is_not_there_is_marked_and_named_on_the_page(tmp_path):
    page = write_page(tmp_path, plot=False)
    rendered = render(page)
    assert rendered.images() == {"plots/x.png": "no"}
    assert "[missing image: plots/x.png]" in rendered.dom


def test_a_section_screenshot_starts_at_its_heading(tmp_path):
    page = write_page(tmp_path)
    out = section_screenshot(page, "outputs-m-topv2", tmp_path / "outputs.png", width=900, height=400)
    with Image.open(out) as image:
        assert image.width == 900 and 40 < image.height <= 400
    assert ink(out)[0] > 0.02


def test_the_committed_page_renders_and_its_screenshots_are_linked_from_the_readme():
    page = ROOT / "results" / "index.html"
    rendered = render(page)
    assert len(rendered.table_rows()) == page.read_text().count("<table>") >= 10
    assert sum(rendered.table_rows()) >= 100
    assert rendered.images() and set(rendered.images().values()) == {"yes"}, rendered.images()
    readme = (ROOT / "README.md").read_text()
    for name in ("verdicts.png", "topv2_table.png"):
        shot = ROOT / "results" / "screenshots" / name
        assert f"results/screenshots/{name}" in readme
        covered, colours = ink(shot)
        assert covered > 0.02 and colours > 20, name
    assert re.search(r'<h2 id="quality-speed-and-exactness-per-task"', rendered.dom)
