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

A figure is a claim with a point value and a relative band: each verdict is a
:class:`~exitbench.report.verdicts.Verdict` (kind ``figure``), decided by the same rule as the claims of
:mod:`exitbench.report.claims` (our interval against the band, so ``inconclusive`` where it straddles an edge)
and written by the same writer. A scientific miss is a result, not a failure: the check only raises for
broken inputs.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from exitbench.replications import Paper, Row, Setting, short_name
from exitbench.report.results import (
    MIN_SPEED_PROMPTS,
    Calibration,
    CalibrationRow,
    EvalResult,
    Provenance,
    Results,
    too_few_timed,
)
from exitbench.report.verdicts import (
    FIGURE,
    NOT_COMPARABLE,
    NOT_MEASURED,
    Verdict,
    interval_verdict,
    point,
    relative_band,
)
from exitbench.stats import Interval

SIZE_FACTOR = 1.5  # models within this factor of the paper's parameter count count as the same size

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
    ours: Interval | None,
    ours_setting: OurSetting | None,
    our_setting_text: str,
    our_source: str,
    extra_reasons: list[str] | None = None,
    extra_notes: list[str] | None = None,
) -> Verdict:
    """One figure's verdict: ``ours`` (the speed-up's interval; its n is the prompts it was timed on: too few,
    and it is shown, not judged) against the paper's value ± ``tolerance`` x value."""
    reported = row.paper_speedup
    value, derived = reported if reported else (None, False)
    reasons = list(extra_reasons or [])
    notes = _row_notes(row, derived) + list(extra_notes or [])
    band = None if value is None else relative_band(value, tolerance)
    if value is None:
        verdict = NOT_MEASURED
        reasons.append("the paper reports no speed-up for this row")
    elif ours is None:
        verdict = NOT_MEASURED
    else:
        verdict = interval_verdict(ours, band)
        notes.append(f"ours/paper {ours.estimate / value:.2f}")
        if ours_setting is not None:
            reasons.extend(incomparability(row.setting, ours_setting))
        if reasons:
            verdict = NOT_COMPARABLE
        if too_few_timed(ours.n or None):  # n = 0: not stated
            verdict = NOT_MEASURED
            reasons.insert(0, f"timed on {ours.n} prompts, fewer than the {MIN_SPEED_PROMPTS} a quoted speed-up needs")
    subject = f"{model} ({our_setting_text})" if model else "–"
    paper_text = "–" if value is None else f"{value:.2f}x" + (" (derived)" if derived else "")
    return Verdict(
        claim_id=row.id, paper=paper.id, kind=FIGURE, statement=row.label,
        source=f"{row.source.table}: {row.source.row}", subject=f"{row.label} · ours: {subject}",
        paper_value=value, paper_text=paper_text, band=band, ours=ours, tolerance=tolerance, tolerance_mode="relative",
        verdict=verdict, our_source=our_source, reasons=tuple(reasons), notes=tuple(notes), headline=row.headline,
        model=model,
    )  # fmt: skip


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
            row, paper, tolerance, model=calibration.model, ours_setting=setting,
            ours=point(chosen.speedup_vs_greedy, chosen.num_test or 0, "point (calibration's test split)"),
            our_setting_text=setting.describe(), our_source=calibration.source_file, extra_notes=notes,
        ))
    return verdicts


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
            row, paper, tolerance, model=result.model, ours_setting=setting,
            ours=result.interval("speedup_vs_greedy") or point(result.speed.speedup_vs_greedy, 0),
            our_setting_text=_describe_ours(setting, options), our_source=result.source_file,
            extra_notes=_config_notes(row, result.options, (result.model_info or {}).get("num_layers")),
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
