"""The report's one formatting module: a table declared once renders to Markdown and CSV alike."""

from __future__ import annotations

from exitbench.report.format import Column, Estimate, csv_rows, fmt, fmt_estimate, markdown
from exitbench.stats import Interval

ROWS = [
    {"name": "a|b", "speed": Estimate(1.5, Interval(1.5, 1.25, 1.75, 32, 0.95, "bootstrap"), 32), "secret": 7},
    {"name": "c", "speed": Estimate(None), "secret": None},
]
COLUMNS: list[Column[dict]] = [
    Column("name", "name", lambda r: r["name"], align="l"),
    Column("speed-up", "speedup", lambda r: r["speed"], "x"),
    Column(None, "secret", lambda r: r["secret"]),  # CSV only
    Column("note", None, lambda r: "shown", align="l", text=lambda r: f"*{r['name']}*"),  # Markdown only
]


def test_markdown_shows_the_headed_columns_with_intervals_and_escapes_cells():
    assert markdown(COLUMNS, ROWS) == [
        "| name | speed-up | note |",
        "| --- | ---: | --- |",
        "| a\\|b | 1.50x [1.25, 1.75] (n=32) | *a\\|b* |",
        "| c | – | *c* |",
    ]


def test_csv_has_the_fielded_columns_an_estimate_as_four():
    assert csv_rows(COLUMNS, ROWS) == [
        {"name": "a|b", "speedup": 1.5, "speedup_low": 1.25, "speedup_high": 1.75, "speedup_n": 32, "secret": 7},
        {"name": "c", "speedup": None, "speedup_low": None, "speedup_high": None, "speedup_n": None, "secret": None},
    ]


def test_number_formats():
    assert [fmt(None), fmt(True), fmt(3), fmt(0.12345), fmt(0.5, kind="x"), fmt(0.125, kind="pct")] == [
        "–", "yes", "3", "0.123", "0.50x", "12.5%",
    ]  # fmt: skip
    assert fmt(float("inf"), kind="g") == "–" and fmt(0.000123456, kind="g") == "0.000123"
    # a speed-up on too few prompts is not quoted
    assert fmt_estimate(Estimate(1.3, None, 4), "x") == "(1.30x, n=4 < 16: not quoted)"
    assert fmt_estimate(Estimate(0.25, None, 200), "pct") == "25.0% (n=200)"
