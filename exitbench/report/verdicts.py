"""One verdict pipeline for the `check` stage: one record (:class:`Verdict`) for a claim and for a published
figure alike, one rule that decides it (:func:`interval_verdict`: our interval against the paper's band), and
one writer of ``check.md`` and ``check.json``. The rules in words are stated once, in
``replications/README.md`` (section "Verdict rules"), which ``check.md`` links to.

A published figure is a claim with a point value and a relative band (``value ± tolerance x value``);
:mod:`exitbench.report.check` matches figures to results, :mod:`exitbench.report.claims` computes the claims.
A claim computed from the paper's own printed numbers alone (:data:`PAPER_ONLY_KINDS`) checks the paper's
consistency, not our replication: it is counted and shown apart.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exitbench.replications import CLAIM_KINDS, Paper
from exitbench.report.format import NONE, Column, escape, fmt, markdown, rounded
from exitbench.stats import Interval

REPRODUCED = "reproduced"
NOT_REPRODUCED = "not reproduced"
INCONCLUSIVE = "inconclusive"
NOT_COMPARABLE = "not comparable"
NOT_MEASURED = "not measured"
VERDICTS = (REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE, NOT_COMPARABLE, NOT_MEASURED)

FIGURE = "figure"  # the kind of a published figure's verdict (claims carry their claim kind)
PAPER_ONLY_KINDS = frozenset({"speculative_bound_paper"})  # computed from the paper's numbers alone
EDGE = 1e-9  # floating-point slack so that exactly at a band's edge counts as inside


@dataclass(frozen=True)
class Band:
    """The paper's side: ``[low, high]`` (``low`` excluded when ``open_low``); infinite ends allowed."""

    low: float
    high: float
    open_low: bool = False

    def describe(self, digits: int = 3) -> str:
        def g(x: float) -> str:
            return f"{x:.{digits}g}"

        if math.isinf(self.low):
            return f"≤ {g(self.high)}"
        if math.isinf(self.high):
            return f"{'>' if self.open_low else '≥'} {g(self.low)}"
        return f"[{g(self.low)}, {g(self.high)}]"


def relative_band(value: float, tolerance: float) -> Band:
    """A published figure's band: ``value ± tolerance x |value|``."""
    half = tolerance * abs(value)
    return Band(value - half, value + half)


def point(value: float, n: int, why: str = "point only (no interval recorded)") -> Interval:
    """A value without an interval (``n`` = 0: its sample size is not stated)."""
    return Interval(value, value, value, n, method=why)


def interval_verdict(ours: Interval, band: Band) -> str:
    """reproduced: ``ours`` inside ``band`` (an edge counts as inside); not reproduced: entirely outside;
    inconclusive: it straddles an edge."""
    above_low = ours.low > band.low if band.open_low else ours.low >= band.low - EDGE
    if above_low and ours.high <= band.high + EDGE:
        return REPRODUCED
    below = ours.high <= band.low if band.open_low else ours.high < band.low - EDGE
    if below or ours.low > band.high + EDGE:
        return NOT_REPRODUCED
    return INCONCLUSIVE


@dataclass(frozen=True)
class Verdict:
    """One claim or published figure judged on one subject of ours (a model and its setting, or a paper table
    for the paper-only rules): our interval against the paper's band."""

    claim_id: str  # the claim's id, or the figure's row id
    paper: str
    kind: str  # a claim kind (replications.CLAIM_KINDS), or FIGURE
    statement: str
    source: str
    subject: str
    paper_value: float | None
    paper_text: str
    band: Band | None
    ours: Interval | None
    tolerance: float
    tolerance_mode: str  # absolute | relative
    verdict: str
    our_source: str
    reasons: tuple[str, ...]
    notes: tuple[str, ...]
    headline: bool = False  # a figure quoted in the paper's abstract
    model: str | None = None  # our model, where the subject is one

    @property
    def is_figure(self) -> bool:
        return self.kind == FIGURE

    @property
    def paper_only(self) -> bool:
        return self.kind in PAPER_ONLY_KINDS

    @property
    def ratio(self) -> float | None:
        """Ours over the paper's value (figures)."""
        if self.ours is None or not self.paper_value:
            return None
        return self.ours.estimate / self.paper_value


def summarize(verdicts: Sequence[Verdict]) -> dict[str, int]:
    """Counts per verdict name."""
    return {name: sum(v.verdict == name for v in verdicts) for name in VERDICTS}


def split(verdicts: Sequence[Verdict]) -> tuple[list[Verdict], list[Verdict], list[Verdict]]:
    """(claims, the paper's own consistency, published figures)."""
    figures = [v for v in verdicts if v.is_figure]
    own = [v for v in verdicts if v.paper_only]
    claims = [v for v in verdicts if not v.is_figure and not v.paper_only]
    return claims, own, figures


# ------------------------------------------------------------------------------------------ Markdown


def describe_interval(interval: Interval | None) -> str:
    """'0.718 [0.664, 0.771] n=25' (the bounds left out when the interval is a point)."""
    if interval is None:
        return "–"
    text = fmt(interval.estimate, kind="g")
    if interval.low != interval.high:
        text += f" [{fmt(interval.low, kind='g')}, {fmt(interval.high, kind='g')}]"
    return f"{text} n={interval.n if interval.n else 'not stated'}"


def tolerance_text(v: Verdict) -> str:
    if v.tolerance_mode == "relative":
        return f"±{v.tolerance:.0%}"
    bound = CLAIM_KINDS[v.kind][2] if v.kind in CLAIM_KINDS else "within"
    return {"at_most": f"+{v.tolerance:g} (at most)", "above": f"{v.tolerance:g} (margin)"}.get(
        bound, f"±{v.tolerance:g}"
    )


VERDICT_COLUMNS: list[Column[Verdict]] = [
    Column("claim or row", None, lambda v: f"`{v.claim_id}`{' ★' if v.headline else ''}: {v.subject}", align="l"),
    Column("source", None, lambda v: v.source, align="l"),
    Column("paper", None, lambda v: v.paper_text + (f"; band {v.band.describe()}" if v.band else ""), align="l"),
    Column("ours (interval, n)", None, lambda v: describe_interval(v.ours), align="l"),
    Column("tol.", None, tolerance_text),
    Column("verdict", None, lambda v: f"**{v.verdict}**", align="l"),
    Column("note", None, lambda v: "; ".join([*v.reasons, *v.notes]) or NONE, align="l"),
]


def verdict_table(verdicts: Sequence[Verdict], empty: str) -> list[str]:
    """The one verdict table (claims, the paper's consistency and figures alike); ``empty``: said instead of a
    table without rows."""
    return markdown(VERDICT_COLUMNS, verdicts) if verdicts else [empty]


def _counts(verdicts: Sequence[Verdict]) -> str:
    return " · ".join(f"{name}: {n}" for name, n in summarize(verdicts).items())


def render_markdown(
    verdicts: Sequence[Verdict], papers: tuple[Paper, ...], default_tolerance: float, profile: str, rules: str
) -> str:
    """``check.md``: the claims, then the paper's own consistency apart, then the published figures per paper;
    ``rules``: the link to the rules' one statement."""
    claims, own, figures = split(verdicts)
    lines = [
        "# Replication check",
        "",
        f"Profile `{profile}` · default tolerance ±{default_tolerance:.0%} on speed-up (relative) · "
        "generated by `pipelines/check.py` from `results/` and `replications/*.yaml`. Our side is an interval "
        "(95%, with n), the paper's a band; the verdict rules, for claims and figures alike: "
        f"[replications/README.md]({rules}).",
        "",
        f"Summary (claims and figures): {_counts([*claims, *figures])}",
        "",
        "## Claims (independent of hardware kind and model size)",
        "",
        f"Claims: {_counts(claims)}",
        "",
        *verdict_table(claims, "_No claims in replications/*.yaml._"),
        "",
        "Claim statements:",
        "",
    ]
    for paper in papers:
        for claim in paper.claims:
            extra = f" _{escape(' '.join(claim.notes))}_" if claim.notes else ""
            lines.append(
                f"- `{claim.id}` ({claim.kind}{', unverified' if claim.unverified else ''}): "
                f"{escape(claim.statement)}{extra}"
            )
    lines += [
        "",
        "## The papers' own consistency (not a replication)",
        "",
        "Computed from the papers' printed numbers alone, so they check the paper, not exitbench; not counted "
        f"above. {_counts(own)}",
        "",
        *verdict_table(own, "_None._"),
        "",
        "## Published figures (absolute)",
        "",
        f"Figures: {_counts(figures)}. ★ = a figure from the abstract.",
        "",
        "### Headline figures",
        "",
        *verdict_table([v for v in figures if v.headline], "_No headline figures._"),
        "",
    ]
    for paper in papers:
        lines += [
            f"### {paper.title} ({paper.venue})",
            "",
            f"arXiv:{paper.arxiv}, figures read from {paper.version}.",
            "",
            *verdict_table([v for v in figures if v.paper == paper.id],
                           "_No published figure of this file is checked (its claims are in the table above)._"),
            "",
            "Caveats from the paper:",
            "",
            *[f"- {escape(c)}" for c in paper.caveats],
            "",
        ]  # fmt: skip
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------ JSON


def _interval_json(interval: Interval | None) -> dict[str, Any] | None:
    if interval is None:
        return None
    return {"estimate": rounded(interval.estimate), "low": rounded(interval.low), "high": rounded(interval.high),
            "n": interval.n, "confidence": interval.confidence, "method": interval.method}  # fmt: skip


def verdict_json(v: Verdict) -> dict[str, Any]:
    """One verdict as JSON (reasons and notes joined)."""
    band = None if v.band is None else {"low": rounded(v.band.low), "high": rounded(v.band.high),
                                        "open_low": v.band.open_low, "text": v.band.describe()}  # fmt: skip
    return {
        "id": v.claim_id, "paper": v.paper, "kind": v.kind, "subject": v.subject, "model": v.model,
        "source": v.source, "headline": v.headline, "paper_value": rounded(v.paper_value), "paper_text": v.paper_text,
        "band": band, "ours": _interval_json(v.ours), "ratio": rounded(v.ratio), "tolerance": v.tolerance,
        "tolerance_mode": v.tolerance_mode, "verdict": v.verdict, "our_source": v.our_source,
        "reasons": "; ".join(v.reasons), "notes": "; ".join(v.notes),
    }  # fmt: skip


def _keyed(items: Sequence[Verdict]) -> dict[str, Verdict]:
    """``{<id>/<subject>: verdict}``; a key that repeats gets ``/<our source's name>`` on each of its items."""
    keys = [f"{v.claim_id}/{v.model or v.subject or '-'}" for v in items]
    return {
        (k if keys.count(k) == 1 else f"{k}/{Path(v.our_source).stem or '-'}"): v
        for k, v in zip(keys, items, strict=True)
    }


def check_json(verdicts: Sequence[Verdict], default_tolerance: float, profile: str) -> dict[str, Any]:
    """``check.json``: counts (claims and figures together, then each apart, and the papers' own consistency),
    each claim's and headline figure's verdict keyed ``<id>/<subject>`` (what ``dvc metrics show`` displays),
    then every verdict as a list (which ``dvc metrics show`` leaves out)."""
    claims, own, figures = split(verdicts)

    def brief(v: Verdict) -> dict[str, Any]:
        ours = v.ours
        return {"verdict": v.verdict, "ours": rounded(ours.estimate) if ours else None,
                "low": rounded(ours.low) if ours else None, "high": rounded(ours.high) if ours else None,
                "paper": rounded(v.paper_value)}  # fmt: skip

    return {
        "profile": profile,
        "default_tolerance": default_tolerance,
        "summary": summarize([*claims, *figures]),
        "summary_claims": summarize(claims),
        "summary_figures": summarize(figures),
        "summary_paper_consistency": summarize(own),
        "claim_verdicts": {k: brief(v) for k, v in _keyed([*claims, *own]).items()},
        "headline": {k: brief(v) for k, v in _keyed([v for v in figures if v.headline]).items()},
        "verdicts": [verdict_json(v) for v in verdicts],
    }


def write_check(
    verdicts: Sequence[Verdict],
    papers: tuple[Paper, ...],
    out_dir: str | Path,
    default_tolerance: float,
    profile: str,
    replications: str | Path = "replications",
) -> tuple[Path, Path]:
    """Write ``check.md`` and ``check.json`` to ``out_dir`` (``check.md`` links to ``replications``' README for
    the rules); return their paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rules = os.path.relpath(Path(replications) / "README.md", out_dir) + "#verdict-rules"
    md_path, json_path = out_dir / "check.md", out_dir / "check.json"
    md_path.write_text(render_markdown(verdicts, papers, default_tolerance, profile, rules) + "\n")
    json_path.write_text(json.dumps(check_json(verdicts, default_tolerance, profile), indent=2) + "\n")
    return md_path, json_path
