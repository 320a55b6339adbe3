"""How the report writes numbers and tables: one formatter per kind of number, and tables declared once.

A table is a list of :class:`Column` s (header, CSV field, how to get the value from a row, its format and
alignment), rendered to Markdown by :func:`markdown` (the README, check.md and, through them, the HTML page)
and to CSV rows by :func:`csv_rows` (``tables/*.csv``). A value that is an :class:`Estimate` is written with
its interval and n in Markdown and as ``<field>, <field>_low, <field>_high, <field>_n`` in CSV.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

from exitbench.report.results import MIN_SPEED_PROMPTS, too_few_timed
from exitbench.stats import Interval

Kind = Literal["num", "x", "pct", "g"]  # plain decimals, a speed-up (1.52x), a rate in %, significant digits
NONE = "–"


def fmt(value: Any, digits: int = 3, kind: Kind = "num") -> str:
    """A table cell: numbers as ``kind`` says, None (or a non-finite bound) as an en dash, booleans as yes/no."""
    if value is None:
        return NONE
    if isinstance(value, bool):
        return "yes" if value else "no"
    if not isinstance(value, float | int):
        return str(value)
    if kind == "x":
        return f"{value:.2f}x"
    if kind == "pct":
        return f"{100 * value:.1f}%"
    if kind == "g":
        return f"{value:.{digits}g}" if math.isfinite(value) else NONE
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def fmt_x(value: float | None) -> str:
    return fmt(value, kind="x")


def fmt_pct(value: float | None) -> str:
    return fmt(value, kind="pct")


@dataclass(frozen=True)
class Estimate:
    """A reported number, its 95% interval when the result file carries one, and its sample size."""

    value: float | None
    interval: Interval | None = None
    n: int | None = None
    detail: str = ""  # after n inside the parentheses, e.g. " texts, 1751 positions"

    @property
    def low(self) -> float | None:
        return self.interval.low if self.interval else None

    @property
    def high(self) -> float | None:
        return self.interval.high if self.interval else None


def _bound(value: float, kind: Kind, digits: int) -> str:
    if not math.isfinite(value):
        return "∞" if value > 0 else "-∞"
    return f"{100 * value:.1f}" if kind == "pct" else f"{value:.2f}" if kind == "x" else f"{value:.{digits}f}"


def fmt_bounds(estimate: Estimate, kind: Kind = "num", digits: int = 3) -> str:
    """``[low, high]`` in the estimate's unit (speed-up: x, rates: %), or "" without an interval."""
    if estimate.interval is None:
        return ""
    return f"[{_bound(estimate.interval.low, kind, digits)}, {_bound(estimate.interval.high, kind, digits)}]"


def fmt_estimate(estimate: Estimate, kind: Kind = "num", digits: int = 3) -> str:
    """``0.440 [0.370, 0.510] (n=200)``; kind "x" (speed-up, ``1.52x [1.40, 1.61]``) or "pct" (rates, in %).
    Without an interval: the number and n; without a number: an en dash; a speed-up timed on fewer than
    :data:`MIN_SPEED_PROMPTS` prompts: ``(1.31x, n=4 < 16: not quoted)``."""
    if estimate.value is None:
        return NONE
    text = fmt(estimate.value, digits, kind)
    bounds = fmt_bounds(estimate, kind, digits)
    n = estimate.n if estimate.n is not None else "?"
    if kind == "x" and too_few_timed(estimate.n):
        return f"({text}, n={n} < {MIN_SPEED_PROMPTS}: not quoted)"
    return f"{text} {bounds} (n={n}{estimate.detail})" if bounds else f"{text} (n={n}{estimate.detail})"


def estimate_columns(name: str, estimate: Estimate) -> dict[str, Any]:
    """CSV columns ``<name>, <name>_low, <name>_high, <name>_n`` (bounds empty without an interval, all four empty
    without a number)."""
    n = estimate.n if estimate.value is not None else None
    return {name: estimate.value, f"{name}_low": estimate.low, f"{name}_high": estimate.high, f"{name}_n": n}


def rounded(value: float | None, digits: int = 4) -> float | None:
    """A number for JSON: rounded; None (also for a non-finite number) stays None."""
    return None if value is None or not math.isfinite(value) else round(value, digits)


# ------------------------------------------------------------------------------------------ tables

Row = TypeVar("Row")


@dataclass(frozen=True)
class Column(Generic[Row]):
    """One column, declared once. ``header`` None: CSV only; ``field`` None: Markdown only. ``get`` gives the
    value (a number, text or :class:`Estimate`); ``text``, when given, the Markdown cell instead of formatting
    that value (a method name with a mark, options with a note)."""

    header: str | None
    field: str | None
    get: Callable[[Row], Any]
    kind: Kind = "num"
    digits: int = 3
    align: Literal["l", "r"] = "r"
    text: Callable[[Row], str] | None = None

    def cell(self, row: Row) -> str:
        if self.text is not None:
            return self.text(row)
        value = self.get(row)
        if isinstance(value, Estimate):
            return fmt_estimate(value, self.kind, self.digits)
        return fmt(value, self.digits, self.kind)


def escape(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[str]], align: str = "") -> list[str]:
    """Markdown table lines; ``align`` is one character per column: 'l' or 'r' (default 'l')."""
    aligns = [("---:" if a == "r" else "---") for a in align.ljust(len(header), "l")]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(aligns) + " |"]
    for row in rows:
        if len(row) != len(header):
            raise ValueError(f"markdown_table: a row of {len(row)} cells under {len(header)} headers: {row}")
        lines.append("| " + " | ".join(escape(cell) for cell in row) + " |")
    return lines


def markdown(columns: Sequence[Column[Row]], rows: Iterable[Row]) -> list[str]:
    """The Markdown table of ``rows`` under the columns that have a header."""
    shown = [c for c in columns if c.header is not None]
    body = [[c.cell(row) for c in shown] for row in rows]
    return markdown_table([c.header or "" for c in shown], body, "".join(c.align for c in shown))


def csv_rows(columns: Sequence[Column[Row]], rows: Iterable[Row]) -> list[dict[str, Any]]:
    """One dict per row over the columns that have a field (an :class:`Estimate` as four columns)."""
    out = []
    for row in rows:
        record: dict[str, Any] = {}
        for c in columns:
            if c.field is not None:
                value = c.get(row)
                record.update(estimate_columns(c.field, value) if isinstance(value, Estimate) else {c.field: value})
        out.append(record)
    return out


def write_csv(path: Path, rows: list[dict[str, Any]]) -> Path:
    """Write dict rows (columns = union of keys, first-seen order) as CSV; None becomes an empty cell."""
    columns: list[str] = []
    for row in rows:
        columns += [k for k in row if k not in columns]
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in columns})
    return path
