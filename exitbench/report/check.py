"""The `check` stage: a verdict for every published figure against what this profile measured.

For each replication row, the matching measurements (same task and method; for CALM, the calibrated
threshold of the same task and confidence measure) give one verdict per measured model:

- ``reproduced``: ``|ours / reported - 1| <= tolerance`` (relative, on speed-up; exactly at the
  tolerance counts as reproduced);
- ``not reproduced``: outside the tolerance; the ratio is shown;
- ``not comparable``: the setting differs in a way that makes the numbers incomparable (hardware kind,
  model size beyond a factor of 1.5, architecture, or a size that is not recorded); our figure and the
  ratio are still shown, with the reason;
- ``not measured``: no result for that task/method in this profile (or an ablation exitbench does not run).

Those absolute figures are rarely comparable on other hardware. The replication files' ``claims`` (a
trend over relative depth, a ratio within one model, exactness, a guarantee) are judged by
:mod:`exitbench.report.claims` with an interval against a tolerance band, adding ``inconclusive`` (our
interval straddles an edge of the band); this module holds their record (:class:`ClaimVerdict`) and writes
both tables. A scientific miss is a result, not a failure: the check only raises for broken inputs.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from exitbench.replications import CLAIM_KINDS, Paper, Row, Setting, short_name
from exitbench.report.results import (
    MIN_SPEED_PROMPTS,
    Calibration,
    CalibrationRow,
    EvalResult,
    Provenance,
    Results,
    too_few_timed,
)
from exitbench.stats import Interval

REPRODUCED = "reproduced"
NOT_REPRODUCED = "not reproduced"
INCONCLUSIVE = "inconclusive"
NOT_COMPARABLE = "not comparable"
NOT_MEASURED = "not measured"
VERDICTS = (REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE, NOT_COMPARABLE, NOT_MEASURED)

SIZE_FACTOR = 1.5  # models within this factor of the paper's parameter count count as the same size
_EDGE = 1e-9  # floating-point slack so that exactly-at-tolerance is reproduced

_GPU_WORDS = ("nvidia", "cuda", "gpu", "tesla", "geforce", "rtx", "a100", "h100", "h200", "instinct", "radeon")


@dataclass(frozen=True)
class OurSetting:
    """What one of our measurements ran on, as far as its result file records it."""

    device: str
    hardware_kind: str  # cpu | gpu | tpu | unknown
    num_parameters: float | None
    architecture: str = "decoder-only"

    def describe(self) -> str:
        size = format_params(self.num_parameters) if self.num_parameters else "size not recorded"
        return f"{size}, {self.device}"


@dataclass(frozen=True)
class Verdict:
    """One comparison of a published figure with one of our measurements."""

    row_id: str
    paper: str
    source: str
    headline: bool
    task: str
    method: str
    paper_setting: str
    reported: float | None
    reported_derived: bool
    tolerance: float
    model: str | None
    ours: float | None
    ratio: float | None
    verdict: str
    our_setting: str
    our_source: str
    reasons: tuple[str, ...]
    notes: tuple[str, ...]


@dataclass(frozen=True)
class Band:
    """The paper's side of a claim: ``[low, high]`` (``low`` excluded when ``open_low``); infinite ends allowed."""

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


@dataclass(frozen=True)
class ClaimVerdict:
    """One claim judged on one subject of ours (a model, a configuration, or a paper row for the paper-side
    rules): our interval against the paper's band."""

    claim_id: str
    paper: str
    kind: str
    statement: str
    source: str
    subject: str
    paper_value: float | None
    paper_text: str
    band: Band | None
    ours: Interval | None
    tolerance: float
    tolerance_mode: str
    verdict: str
    our_source: str
    reasons: tuple[str, ...]
    notes: tuple[str, ...]


def base_method(result: EvalResult) -> str:
    """The decoding method of an evaluate result: ``base_method`` where recorded, else the label before '@'
    (``early_exit@8`` is an instance of ``early_exit``)."""
    recorded = getattr(result, "base_method", None)
    return recorded if isinstance(recorded, str) and recorded else result.method.split("@", 1)[0]


def hardware_kind(device: str) -> str:
    """'gpu', 'tpu', 'cpu' or 'unknown' from a recorded device name (e.g. 'NVIDIA H200', 'AMD EPYC 7R13')."""
    text = device.strip().lower()
    if text in ("", "unknown", "?", "none"):
        return "unknown"
    if "tpu" in text:
        return "tpu"
    if any(word in text for word in _GPU_WORDS):
        return "gpu"
    return "cpu"


def format_params(count: float | None) -> str:
    if count is None:
        return "?"
    if count >= 1e9:
        return f"{count / 1e9:.3g}B"
    return f"{count / 1e6:.3g}M"


def _params_from_name(text: Any) -> float | None:
    """A parameter count read from a model id such as 'SmolLM2-135M' or 'layerskip-llama2-7B'."""
    if not isinstance(text, str):
        return None
    match = re.search(r"(?<![\d.])(\d+(?:\.\d+)?)\s*([mMbB])(?![a-zA-Z])", text)
    if not match:
        return None
    return float(match.group(1)) * (1e9 if match.group(2).lower() == "b" else 1e6)


def num_parameters(provenance: Provenance, *more: Any) -> float | None:
    """The model's parameter count from the result file: explicit counts first, then model ids."""
    for value in (*more, provenance.extra("num_parameters"), provenance.extra("num_params")):
        if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
            return float(value)
    for key in ("model_id", "hub_id", "model_source", "model_name"):
        found = _params_from_name(provenance.extra(key))
        if found:
            return found
    return None


def our_setting_of_eval(result: EvalResult) -> OurSetting:
    info = result.model_info or {}
    count = num_parameters(result.provenance, result.num_parameters, info.get("num_parameters"))
    if count is None:
        count = _params_from_name(info.get("source")) or _params_from_name(info.get("hub_id"))
    return OurSetting(result.provenance.device, hardware_kind(result.provenance.device), count)


def our_setting_of_calibration(calibration: Calibration) -> OurSetting:
    prov = calibration.provenance
    return OurSetting(prov.device, hardware_kind(prov.device), num_parameters(prov))


def speedup_verdict(ours: float, reported: float, tolerance: float) -> tuple[str, float]:
    """``reproduced`` if ``|ours / reported - 1| <= tolerance`` (the edge included), else ``not reproduced``."""
    ratio = ours / reported
    return (REPRODUCED if abs(ratio - 1.0) <= tolerance + _EDGE else NOT_REPRODUCED), ratio


def incomparability(setting: Setting, ours: OurSetting) -> list[str]:
    """Why our measurement cannot be held to the paper's figure; empty when it can."""
    reasons = []
    if setting.architecture != ours.architecture:
        reasons.append(f"architecture: the paper's model is {setting.architecture}, exitbench runs {ours.architecture}")
    if ours.hardware_kind == "unknown":
        reasons.append("hardware: our device is not recorded (provenance.device)")
    elif ours.hardware_kind != setting.hardware_kind:
        reasons.append(
            f"hardware: paper on {short_name(setting.hardware)} ({setting.hardware_kind.upper()}), "
            f"ours on {ours.device} ({ours.hardware_kind.upper()})"
        )
    if setting.params_b is None:
        reasons.append("model size: the paper does not state it")
    elif ours.num_parameters is None:
        reasons.append("model size: ours is not recorded (add num_parameters to the result's provenance)")
    else:
        ratio = ours.num_parameters / (setting.params_b * 1e9)
        if not 1.0 / SIZE_FACTOR <= ratio <= SIZE_FACTOR:
            factor = 1 / ratio if ratio < 1 else ratio
            shown = f"{factor:.1f}" if factor < 10 else f"{factor:.0f}"
            direction = f"{shown}x {'smaller' if ratio < 1 else 'larger'}"
            reasons.append(
                f"model size: ours {format_params(ours.num_parameters)} vs paper "
                f"{format_params(setting.params_b * 1e9)} ({direction})"
            )
    return reasons


def _config_notes(row: Row, options: dict[str, Any], num_layers: int | None = None) -> list[str]:
    notes = []
    for key, label in (("exit_layer", "E"), ("num_speculations", "d")):
        paper_value = getattr(row.setting, key)
        ours = options.get(key)
        if paper_value is None or ours is None or ours == paper_value:
            continue
        paper_layers = row.setting.num_layers
        if key == "exit_layer" and num_layers and paper_layers and same_relative_depth(ours, num_layers, paper_value,
                                                                                         paper_layers):
            nearest = "" if math.isclose(ours / num_layers, paper_value / paper_layers) else " (the nearest layer)"
            notes.append(f"same relative depth{nearest}: ours E {ours} of {num_layers} layers, paper {paper_value} of "
                         f"{paper_layers}")
        else:
            notes.append(f"{label} differs: ours {ours}, paper {paper_value}")
    return notes


def _row_notes(row: Row, derived: bool) -> list[str]:
    notes = []
    if derived:
        notes.append(f"paper figure derived by us ({row.reported.derived_from})")
    if row.unverified:
        notes.append(f"row partly unverified ({', '.join(row.unverified_fields) or 'see notes'})")
    return notes


def _describe_ours(ours: OurSetting, options: dict[str, Any] | None = None) -> str:
    text = ours.describe()
    if options:
        config = " ".join(f"{'E' if k == 'exit_layer' else 'd' if k == 'num_speculations' else k}={v}"
                          for k, v in sorted(options.items()))
        text = f"{config}; {text}"
    return text


def _verdict(
    row: Row,
    paper: Paper,
    tolerance: float,
    *,
    model: str | None,
    ours: float | None,
    ours_setting: OurSetting | None,
    our_setting_text: str,
    our_source: str,
    extra_reasons: list[str] | None = None,
    extra_notes: list[str] | None = None,
    timed: int | None = None,
) -> Verdict:
    """One figure's verdict; ``timed``: the prompts our speed-up was timed on (too few: shown, not judged)."""
    reported = row.paper_speedup
    value, derived = reported if reported else (None, False)
    reasons = list(extra_reasons or [])
    notes = _row_notes(row, derived) + list(extra_notes or [])
    ratio = None
    if value is None:
        verdict = NOT_MEASURED
        reasons.append("the paper reports no speed-up for this row")
    elif ours is None:
        verdict = NOT_MEASURED
    else:
        verdict, ratio = speedup_verdict(ours, value, tolerance)
        if ours_setting is not None:
            reasons.extend(incomparability(row.setting, ours_setting))
        if reasons:
            verdict = NOT_COMPARABLE
        if too_few_timed(timed):
            verdict = NOT_MEASURED
            reasons.insert(0, f"timed on {timed} prompts, fewer than the {MIN_SPEED_PROMPTS} a quoted speed-up needs")
    return Verdict(
        row_id=row.id,
        paper=paper.id,
        source=f"{row.source.table}: {row.source.row}",
        headline=row.headline,
        task=row.maps_to.task,
        method=row.maps_to.method,
        paper_setting=row.label,
        reported=value,
        reported_derived=derived,
        tolerance=tolerance,
        model=model,
        ours=ours,
        ratio=ratio,
        verdict=verdict,
        our_setting=our_setting_text,
        our_source=our_source,
        reasons=tuple(reasons),
        notes=tuple(notes),
    )


def _not_measured(row: Row, paper: Paper, tolerance: float, why: str) -> Verdict:
    return _verdict(row, paper, tolerance, model=None, ours=None, ours_setting=None, our_setting_text="",
                    our_source="", extra_reasons=[why])


def _pick_calibration_row(rows: list[CalibrationRow], delta: float | None) -> CalibrationRow:
    """The row whose δ is closest to the paper's; CALM's own KV handling (state propagation) first."""
    def key(r: CalibrationRow) -> tuple[float, int, str]:
        distance = abs(r.delta - delta) if delta is not None else 0.0
        return (distance, 0 if r.kv_strategy == "propagate" else 1, r.kv_strategy)

    return min(rows, key=key)


def _check_calm(row: Row, paper: Paper, results: Results, tolerance: float) -> list[Verdict]:
    verdicts = []
    for calibration in results.calibrations:
        matching = [
            r for r in calibration.rows
            if r.task == row.maps_to.task and (row.maps_to.measure is None or r.measure == row.maps_to.measure)
        ]
        if not matching:
            continue
        chosen = _pick_calibration_row(matching, row.maps_to.delta)
        setting = our_setting_of_calibration(calibration)
        notes = [f"ours: {chosen.measure}, KV {chosen.kv_strategy}, δ={chosen.delta:g}, threshold {chosen.threshold}"]
        if row.maps_to.delta is not None and not math.isclose(chosen.delta, row.maps_to.delta):
            notes.append(f"δ differs: ours {chosen.delta:g}, paper {row.maps_to.delta:g} (closest calibrated δ)")
        consistency = chosen.consistency or calibration.consistency
        if consistency is None:
            notes.append("our consistency objective (textual/risk) is not recorded in the calibration result")
        elif row.setting.consistency and consistency != row.setting.consistency:
            notes.append(f"consistency differs: ours {consistency}, paper {row.setting.consistency}")
        if chosen.speedup_vs_greedy is None:
            why = f"speedup_vs_greedy is null in {calibration.source_file}"
            verdicts.append(_not_measured(row, paper, tolerance, why))
            continue
        verdicts.append(_verdict(
            row, paper, tolerance, model=calibration.model, ours=chosen.speedup_vs_greedy, ours_setting=setting,
            our_setting_text=setting.describe(), our_source=calibration.source_file, extra_notes=notes,
            timed=chosen.num_test,
        ))
    return verdicts


def timed_prompts(result: EvalResult) -> int | None:
    """The prompts ``result``'s speed-up was timed on (its interval's n), or None where it stores none."""
    interval = result.interval("speedup_vs_greedy")
    return interval.n if interval is not None and interval.n else None


def same_relative_depth(ours_e: int, ours_l: int, paper_e: int, paper_l: int) -> bool:
    """Whether exit layer ``ours_e`` of ``ours_l`` layers is at the paper's relative depth ``paper_e / paper_l``:
    the same E / L, or, where no whole layer is (E / L = 0.25 of 30 layers is layer 7.5), one of the nearest
    layers (within half a layer of ``paper_e / paper_l * ours_l``)."""
    return abs(ours_e - paper_e / paper_l * ours_l) <= 0.5 + 1e-9


def matches_setting(row: Row, result: EvalResult) -> bool:
    """Whether ``result`` ran at the row's setting: the same d, and the same exit layer E or, on a model with
    another layer count, the same relative depth E / L (a paper experiment on the closest open model, or a
    CPU-scale twin), to the nearest layer (:func:`same_relative_depth`)."""
    options, setting = result.options, row.setting
    if setting.num_speculations is not None and options.get("num_speculations") not in (None, setting.num_speculations):
        return False
    ours_e, paper_e = options.get("exit_layer"), setting.exit_layer
    if ours_e is None or paper_e is None:
        return True
    ours_l, paper_l = (result.model_info or {}).get("num_layers"), setting.num_layers
    if ours_e == paper_e and (ours_l is None or paper_l is None or ours_l == paper_l):
        return True
    return ours_l is not None and paper_l is not None and same_relative_depth(ours_e, ours_l, paper_e, paper_l)


def _check_eval(row: Row, paper: Paper, results: Results, tolerance: float) -> list[Verdict]:
    verdicts = []
    candidates = [r for r in results.evals if r.task == row.maps_to.task and base_method(r) == row.maps_to.method]
    # where some results ran at the row's (E, d), those answer it; otherwise every setting is shown with its notes
    candidates = [r for r in candidates if matches_setting(row, r)] or candidates
    for result in candidates:
        setting = our_setting_of_eval(result)
        options = {k: v for k, v in result.options.items() if k in ("exit_layer", "num_speculations")}
        if result.speed.speedup_vs_greedy is None:
            verdicts.append(_not_measured(row, paper, tolerance, f"speedup_vs_greedy is null in {result.source_file}"))
            continue
        verdicts.append(_verdict(
            row, paper, tolerance, model=result.model, ours=result.speed.speedup_vs_greedy, ours_setting=setting,
            our_setting_text=_describe_ours(setting, options), our_source=result.source_file,
            extra_notes=_config_notes(row, result.options, (result.model_info or {}).get("num_layers")),
            timed=timed_prompts(result),
        ))
    return verdicts


def check_row(row: Row, paper: Paper, results: Results, default_tolerance: float) -> list[Verdict]:
    """Every verdict for one replication row (at least one)."""
    tolerance = row.tolerance_or(default_tolerance)
    if row.maps_to.ablation:
        why = f"exitbench does not run the paper's '{row.maps_to.ablation}' ablation (kept for reference)"
        return [_not_measured(row, paper, tolerance, why)]
    verdicts = []
    if row.maps_to.method == "calm":
        verdicts = _check_calm(row, paper, results, tolerance)
    if not verdicts:
        verdicts = _check_eval(row, paper, results, tolerance)
    if not verdicts:
        where = "results/calibrate or " if row.maps_to.method == "calm" else ""
        why = f"no result for task '{row.maps_to.task}' with method '{row.maps_to.method}' ({where}results/eval)"
        verdicts = [_not_measured(row, paper, tolerance, why)]
    return verdicts


def run_check(papers: tuple[Paper, ...], results: Results, default_tolerance: float) -> list[Verdict]:
    return [v for paper in papers for row in paper.rows for v in check_row(row, paper, results, default_tolerance)]


def summarize(verdicts: Sequence[Verdict | ClaimVerdict]) -> dict[str, int]:
    """Counts per verdict name (figures and claims alike)."""
    return {name: sum(v.verdict == name for v in verdicts) for name in VERDICTS}


# ------------------------------------------------------------------------------------------ writing


def _x(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}x"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _paper_figure(v: Verdict) -> str:
    if v.reported is None:
        return "–"
    return _x(v.reported) + (" (derived)" if v.reported_derived else "")


def _why(v: Verdict) -> str:
    return _cell("; ".join([*v.reasons, *v.notes])) or "–"


def _verdict_table(verdicts: list[Verdict]) -> list[str]:
    if not verdicts:
        return ["_No published figure of this file is checked (its claims are in the table above)._"]
    lines = [
        "| row | source | paper setting | paper | our model | ours | ours/paper | tol. | verdict | why / notes |",
        "|---|---|---|---:|---|---:|---:|---:|---|---|",
    ]
    for v in verdicts:
        model = f"{v.model} ({_cell(v.our_setting)})" if v.model else "–"
        ratio = "–" if v.ratio is None else f"{v.ratio:.2f}"
        lines.append(
            f"| `{v.row_id}`{' ★' if v.headline else ''} | {_cell(v.source)} | {_cell(v.paper_setting)} "
            f"| {_paper_figure(v)} | {model} | {_x(v.ours)} | {ratio} | ±{v.tolerance:.0%} "
            f"| **{v.verdict}** | {_why(v)} |"
        )
    return lines


def _g(value: float | None, digits: int = 3) -> str:
    return "–" if value is None or not math.isfinite(value) else f"{value:.{digits}g}"


def describe_interval(interval: Interval | None) -> str:
    """'0.718 [0.664, 0.771] n=25' (the bounds left out when the interval is a point)."""
    if interval is None:
        return "–"
    text = _g(interval.estimate)
    if interval.low != interval.high:
        text += f" [{_g(interval.low)}, {_g(interval.high)}]"
    return f"{text} n={interval.n if interval.n else 'not stated'}"


def _tolerance_text(c: ClaimVerdict) -> str:
    bound = CLAIM_KINDS[c.kind][2] if c.kind in CLAIM_KINDS else "within"
    if c.tolerance_mode == "relative":
        return f"±{c.tolerance:.0%}"
    return {"at_most": f"+{c.tolerance:g} (at most)", "above": f"{c.tolerance:g} (margin)"}.get(
        bound, f"±{c.tolerance:g}")


def _claims_table(claims: Sequence[ClaimVerdict]) -> list[str]:
    lines = [
        "| claim | source | paper value | ours (interval, n) | tol. | verdict | note |",
        "|---|---|---|---|---:|---|---|",
    ]
    for c in claims:
        paper = _cell(c.paper_text) + (f"; band {c.band.describe()}" if c.band is not None else "")
        note = _cell("; ".join([*c.reasons, *c.notes])) or "–"
        lines.append(
            f"| `{c.claim_id}`: {_cell(c.subject)} | {_cell(c.source)} | {paper} | {describe_interval(c.ours)} "
            f"| {_tolerance_text(c)} | **{c.verdict}** | {note} |"
        )
    return lines


def _claims_section(claims: Sequence[ClaimVerdict], papers: tuple[Paper, ...]) -> list[str]:
    counts = summarize(claims)
    lines = [
        "## Claims (independent of hardware kind and model size)",
        "",
        "**Verdict rules.** Each claim's rule computes our side as an interval (95%: the evaluate summaries' "
        "intervals, else a paired bootstrap over the shared sample ids of the per-sample records, else two "
        "intervals combined conservatively; Clopper-Pearson for mismatch counts, Hoeffding for CALM test risks). "
        "The paper's side is a band read from the replication rows: its value ± tolerance (`within`), "
        "≤ value + tolerance (`at most`) or > value + tolerance (`above`). `reproduced`: our interval lies inside "
        "the band (an edge counts as inside). `not reproduced`: it lies entirely outside. `inconclusive`: it "
        "straddles an edge; a lossy method's speed-up whose outputs keep under half the paper's quality at that "
        "E/L (or score 0 where it prints none) is `not reproduced` whatever its size (the papers time outputs "
        "that still do the task). `not measured`: the "
        "results lack what the claim needs (the reason is given; a missing control model is never replaced by "
        "another model). `not comparable`: a speed-up on a different hardware kind; our figure is shown.",
        "",
        "Claims: " + " · ".join(f"{name}: {counts[name]}" for name in VERDICTS),
        "",
    ]
    if not claims:
        return [*lines, "_No claims in replications/*.yaml._", ""]
    lines += [*_claims_table(claims), "", "Claim statements:", ""]
    for paper in papers:
        for claim in paper.claims:
            extra = f" _{_cell(' '.join(claim.notes))}_" if claim.notes else ""
            lines.append(f"- `{claim.id}` ({claim.kind}{', unverified' if claim.unverified else ''}): "
                         f"{_cell(claim.statement)}{extra}")
    return [*lines, ""]


def render_markdown(
    verdicts: list[Verdict],
    papers: tuple[Paper, ...],
    default_tolerance: float,
    profile: str,
    claims: Sequence[ClaimVerdict] = (),
) -> str:
    counts = summarize([*verdicts, *claims])
    lines = [
        "# Replication check",
        "",
        f"Profile `{profile}` · default tolerance ±{default_tolerance:.0%} on speed-up (relative) · "
        "generated by `pipelines/check.py` from `results/` and `replications/*.yaml`.",
        "",
        "Summary (claims and figures): " + " · ".join(f"{name}: {counts[name]}" for name in VERDICTS),
        "",
        *_claims_section(claims, papers),
        "## Published figures (absolute)",
        "",
        "**Verdict rules.** `reproduced`: |ours / paper − 1| ≤ tolerance (exactly at the tolerance counts). "
        "`not reproduced`: outside it. `not comparable`: different hardware kind (CPU vs GPU vs TPU), a model "
        f"size more than {SIZE_FACTOR}x away from the paper's (or not recorded), or a different architecture — "
        "our figure and the ratio are shown anyway. `not measured`: this profile has no result for the row's "
        "task and method. A miss is a result: this check never fails on one. ★ = a figure from the abstract.",
        "",
        "Figures: " + " · ".join(f"{name}: {n}" for name, n in summarize(verdicts).items()),
        "",
        "### Headline figures",
        "",
        *_verdict_table([v for v in verdicts if v.headline]),
        "",
    ]
    for paper in papers:
        lines += [
            f"### {paper.title} ({paper.venue})",
            "",
            f"arXiv:{paper.arxiv}, figures read from {paper.version}.",
            "",
            *_verdict_table([v for v in verdicts if v.paper == paper.id]),
            "",
            "Caveats from the paper:",
            "",
            *[f"- {_cell(c)}" for c in paper.caveats],
            "",
        ]
    return "\n".join(lines)


def _round(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else round(value, 4)


def _flat(v: Verdict) -> dict[str, Any]:
    """One verdict as scalars (reasons and notes joined)."""
    data = asdict(v)
    data["reasons"] = "; ".join(v.reasons)
    data["notes"] = "; ".join(v.notes)
    return data


def _interval_json(interval: Interval | None) -> dict[str, Any] | None:
    if interval is None:
        return None
    return {"estimate": _round(interval.estimate), "low": _round(interval.low), "high": _round(interval.high),
            "n": interval.n, "confidence": interval.confidence, "method": interval.method}


def _claim_json(c: ClaimVerdict) -> dict[str, Any]:
    band = None if c.band is None else {"low": _round(c.band.low), "high": _round(c.band.high),
                                        "open_low": c.band.open_low, "text": c.band.describe()}
    return {
        "claim": c.claim_id, "paper": c.paper, "kind": c.kind, "subject": c.subject, "source": c.source,
        "paper_value": _round(c.paper_value), "paper_text": c.paper_text, "band": band,
        "ours": _interval_json(c.ours), "tolerance": c.tolerance, "tolerance_mode": c.tolerance_mode,
        "verdict": c.verdict, "our_source": c.our_source, "reasons": "; ".join(c.reasons),
        "notes": "; ".join(c.notes),
    }


def _keyed(items: Sequence[Any], key: Any, extra: Any) -> dict[str, Any]:
    """``{key(item): item}``; a key that repeats gets ``/<extra(item)>`` on every one of its items."""
    keys = [key(item) for item in items]
    return {(k if keys.count(k) == 1 else f"{k}/{extra(item)}"): item for k, item in zip(keys, items, strict=True)}


def check_json(
    verdicts: list[Verdict], default_tolerance: float, profile: str, claims: Sequence[ClaimVerdict] = ()
) -> dict[str, Any]:
    """``check.json``: counts (figures and claims together, then each apart), each claim's verdict keyed
    ``<claim id>/<subject>`` and the headline comparisons keyed ``<row id>/<our model>`` (what ``dvc metrics
    show`` displays), then every verdict and claim as lists (which ``dvc metrics show`` leaves out)."""
    headline = _keyed([v for v in verdicts if v.headline], lambda v: f"{v.row_id}/{v.model or '-'}",
                      lambda v: Path(v.our_source).stem or "-")
    claim_items = _keyed(list(claims), lambda c: f"{c.claim_id}/{c.subject}", lambda c: c.our_source or "-")
    return {
        "profile": profile,
        "default_tolerance": default_tolerance,
        "summary": summarize([*verdicts, *claims]),
        "summary_claims": summarize(claims),
        "summary_figures": summarize(verdicts),
        "claim_verdicts": {k: {"verdict": c.verdict, "ours": _round(c.ours.estimate) if c.ours else None,
                               "low": _round(c.ours.low) if c.ours else None,
                               "high": _round(c.ours.high) if c.ours else None,
                               "paper": _round(c.paper_value)} for k, c in claim_items.items()},
        "headline": {k: {"paper": v.reported, "ours": _round(v.ours), "ratio": _round(v.ratio),
                         "verdict": v.verdict} for k, v in headline.items()},
        "claims": [_claim_json(c) for c in claims],
        "verdicts": [_flat(v) for v in verdicts],
    }


def write_check(
    verdicts: list[Verdict],
    papers: tuple[Paper, ...],
    out_dir: str | Path,
    default_tolerance: float,
    profile: str,
    claims: Sequence[ClaimVerdict] = (),
) -> tuple[Path, Path]:
    """Write ``check.md`` and ``check.json`` to ``out_dir``; return their paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    md_path, json_path = out_dir / "check.md", out_dir / "check.json"
    md_path.write_text(render_markdown(verdicts, papers, default_tolerance, profile, claims) + "\n")
    json_path.write_text(json.dumps(check_json(verdicts, default_tolerance, profile, claims), indent=2) + "\n")
    return md_path, json_path
