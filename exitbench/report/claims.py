"""Claims that do not depend on hardware kind or model size, each with a verdict (``claims`` in
``replications/*.yaml``; :class:`exitbench.replications.Claim`).

A claim's ``kind`` is the rule that computes our side, an :class:`~exitbench.stats.Interval`, from the result
files; the paper's side is a band read from the replication rows (:func:`claim_band`):

- ``reproduced``: our interval lies inside the band (an edge counts as inside);
- ``not reproduced``: it lies entirely outside;
- ``inconclusive``: it straddles an edge;
- ``not measured``: the results lack what the rule needs, with the reason. A missing model is never
  replaced by another: without ``plain`` (the control) a LayerSkip-vs-control claim is not measured, it is
  never compared with the untrained base instead.

Intervals, best first: the evaluate summary's own (``intervals``); a paired bootstrap
(:mod:`exitbench.stats`) over the per-sample records ``results/eval/<stage>/<model>/<task>/<method>.jsonl`` on the
sample ids both sides share; the two summaries' intervals combined conservatively (interval arithmetic);
the point estimate alone, said in the note. Mismatch counts get a Clopper-Pearson interval
(``scipy.stats.binomtest``), CALM test risks Hoeffding's bound for a mean of values in [0, 1].
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import binomtest

from exitbench.cost_model import SUBVOCAB_TAG, predict_speedup
from exitbench.records import read_records
from exitbench.replications import Claim, Paper, Row, claim_paper_values, paper_measure_order
from exitbench.report.check import base_method, incomparability, our_setting_of_eval
from exitbench.report.results import (
    MIN_SPEED_PROMPTS,
    CostSet,
    EvalResult,
    Results,
    SweepRow,
    eval_records_path,
    memory_text,
    too_few_timed,
)
from exitbench.report.verdicts import (
    EDGE,
    INCONCLUSIVE,
    NOT_COMPARABLE,
    NOT_MEASURED,
    NOT_REPRODUCED,
    REPRODUCED,
    Band,
    Verdict,
    interval_verdict,
    point,
)
from exitbench.stats import CONFIDENCE, Interval, mean_interval, paired_interval, ratio_interval, speedup_interval

CONTROL_NOTE = ("the same finetune without LayerSkip's layer dropout and early-exit loss: not trained or not "
                "evaluated in this profile; the untrained base is not a substitute")


# ------------------------------------------------------------------------------------------ verdict rule


def claim_band(claim: Claim, value: float) -> Band:
    """The paper's band: ``within`` value ± tolerance (absolute, or relative to |value|), ``at_most``
    ≤ value + tolerance, ``above`` > value + tolerance."""
    if claim.bound == "within":
        half = claim.tolerance * abs(value) if claim.tolerance_mode == "relative" else claim.tolerance
        return Band(value - half, value + half)
    if claim.bound == "at_most":
        return Band(-math.inf, value + claim.tolerance)
    return Band(value + claim.tolerance, math.inf, open_low=True)


def interpolate(points: Sequence[tuple[float, float]], x: float) -> float | None:
    """The paper's curve read at ``x`` by linear interpolation between its points (sorted by x); None
    outside the range the paper measured (no extrapolation)."""
    ordered = sorted(points)
    if not ordered or x < ordered[0][0] - EDGE or x > ordered[-1][0] + EDGE:
        return None
    for (x0, y0), (x1, y1) in itertools.pairwise(ordered):
        if x <= x1 + EDGE:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (min(max(x, x0), x1) - x0) / (x1 - x0)
    return ordered[-1][1]


def clopper_pearson(k: int, n: int) -> Interval:
    """``k`` of ``n`` with its exact (Clopper-Pearson) interval; for k = 0 the upper end is about 3.7 / n."""
    ci = binomtest(k, n).proportion_ci(confidence_level=CONFIDENCE, method="exact")
    return Interval(k / n, float(ci.low), float(ci.high), n, method="Clopper-Pearson (scipy.stats.binomtest)")


def hoeffding(mean: float, n: int) -> Interval:
    """A mean of ``n`` values in [0, 1] with Hoeffding's two-sided bound: ± sqrt(ln(2 / α) / 2n)."""
    half = math.sqrt(math.log(2 / (1 - CONFIDENCE)) / (2 * n))
    return Interval(mean, max(0.0, mean - half), min(1.0, mean + half), n, method="Hoeffding, values in [0, 1]")


# ------------------------------------------------------------------------------------------ per-sample records


class Records:
    """The per-sample records beside each evaluate summary (``<method>.jsonl``), read once per file.

    A record counts when it has a ``sample_id`` and no error. A file may hold records of other settings
    (a resumable store): the group of the summary's own ``settings_key`` is used; for a summary written before
    it recorded its key, the group covering every id of the summary's ``sample_ids``, and when several do, the
    one whose mean score equals the summary's quality; when that is ambiguous, none (the intervals then come
    from the summaries)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._cache: dict[str, dict[str, dict[str, Any]] | None] = {}

    def of(self, result: EvalResult) -> dict[str, dict[str, Any]] | None:
        path = eval_records_path(self.root, result)
        if str(path) not in self._cache:
            self._cache[str(path)] = self._select(result, _read_records(path))
        return self._cache[str(path)]

    @staticmethod
    def _select(result: EvalResult, records: list[dict[str, Any]]) -> dict[str, dict[str, Any]] | None:
        groups: dict[Any, dict[str, dict[str, Any]]] = {}
        for record in records:
            groups.setdefault(record.get("settings_key"), {})[str(record["sample_id"])] = record
        wanted = set(result.sample_ids)
        if result.settings_key is not None:
            groups = {key: group for key, group in groups.items() if key == result.settings_key}
        found = [{i: g[i] for i in result.sample_ids} if wanted else g for g in groups.values()
                 if wanted <= g.keys()]
        found = [{i: r for i, r in g.items() if r.get("error") is None} for g in found]  # failed samples out
        if len(found) > 1:
            quality = result.scalar_quality()
            metric = next(iter(quality), None)
            found = [g for g in found if metric is not None and _mean_score(g, metric) is not None
                     and math.isclose(_mean_score(g, metric) or 0.0, quality[metric], abs_tol=1e-6)]
        return found[0] if len(found) == 1 and found[0] else None


def _read_records(path: Path) -> list[dict[str, Any]]:
    """The store's records of samples (evaluate's own reader, :func:`exitbench.records.read_records`)."""
    return [record for record in read_records(path) if "sample_id" in record]


def _mean_score(records: dict[str, dict[str, Any]], metric: str) -> float | None:
    values = [_score(r, metric) for r in records.values()]
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def _score(record: dict[str, Any], metric: str) -> float | None:
    value = (record.get("scores") or {}).get(metric)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _decode(record: dict[str, Any], key: str) -> float | None:
    value = (record.get("decode") or {}).get(key)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _columns(recs: Sequence[dict[str, dict[str, Any]]], getters: Sequence[Callable[[dict[str, Any]], float | None]],
             ) -> list[np.ndarray] | None:
    """Aligned columns over the sample ids every record set shares and every getter reads (in the first
    set's order); None if none."""
    ids = [i for i in recs[0] if all(i in r for r in recs[1:])]
    rows = [[get(r[i]) for r, get in zip(recs, getters, strict=True)] for i in ids]
    rows = [row for row in rows if None not in row]
    return [np.asarray(col, dtype=float) for col in zip(*rows, strict=True)] if rows else None


# ------------------------------------------------------------------------------------------ our intervals


@dataclass(frozen=True)
class Measured:
    """Our side of one claim subject: the interval (or None) and how it was obtained / why it is missing."""

    interval: Interval | None
    how: str


def quality_interval(result: EvalResult, metric: str, records: Records) -> Measured:
    if (stored := result.interval(metric)) is not None:
        return Measured(stored, "")
    recs = records.of(result)
    values = [v for r in (recs or {}).values() if (v := _score(r, metric)) is not None]
    if values:
        return Measured(mean_interval(values), "bootstrap over the per-sample records")
    value = result.scalar_quality().get(metric)
    if value is None:
        return Measured(None, f"{result.source_file} has no '{metric}'")
    return Measured(point(value, result.num_samples), "point only (no interval, no per-sample records)")


def acceptance_interval(result: EvalResult, records: Records) -> Measured:
    if (stored := result.interval("acceptance_rate")) is not None:
        return Measured(stored, "")
    recs = records.of(result) or {}
    cols = _columns([recs, recs], [lambda r: _decode(r, "num_accepted"), lambda r: _decode(r, "num_drafted")])
    if cols and cols[1].sum() > 0:
        return Measured(ratio_interval(cols[0], cols[1]), "bootstrap over the per-sample records")
    if result.speed.acceptance_rate is None:
        return Measured(None, f"acceptance_rate is null in {result.source_file}")
    return Measured(point(result.speed.acceptance_rate, result.num_samples),
                    "point only (no interval, no per-sample records)")


def speedup_measured(result: EvalResult, greedy: EvalResult | None, records: Records) -> Measured:
    if (stored := result.interval("speedup_vs_greedy")) is not None:
        return Measured(stored, "")
    if greedy is not None and records.of(result) and records.of(greedy):
        cols = _columns([records.of(greedy) or {}] * 2 + [records.of(result) or {}] * 2,
                        [lambda r: _decode(r, "wall_time_s"), lambda r: _decode(r, "num_tokens")] * 2)
        if cols and min(c.sum() for c in cols) > 0:
            return Measured(speedup_interval(*cols), "paired bootstrap over the per-sample records")
    if result.speed.speedup_vs_greedy is None:
        return Measured(None, f"speedup_vs_greedy is null in {result.source_file}")
    return Measured(point(result.speed.speedup_vs_greedy, result.num_samples),
                    "point only (no interval, no per-sample records)")


def fraction_measured(num: EvalResult, den: EvalResult, metric: str, records: Records) -> Measured:
    """``num``'s mean ``metric`` over ``den``'s: paired over shared samples, else from the two intervals."""
    cols = _columns([records.of(num) or {}, records.of(den) or {}], [lambda r: _score(r, metric)] * 2)
    if cols and cols[1].sum() > 0:
        return Measured(ratio_interval(cols[0], cols[1]), f"paired bootstrap over {len(cols[0])} shared samples")
    a, b = quality_interval(num, metric, records), quality_interval(den, metric, records)
    if a.interval is None or b.interval is None:
        return Measured(None, a.how or b.how)
    if b.interval.low <= 0:
        return Measured(None, f"the reference {metric} of {den.source_file} is 0 or its interval reaches 0")
    ia, ib = a.interval, b.interval
    return Measured(Interval(ia.estimate / ib.estimate, ia.low / ib.high, ia.high / ib.low, min(ia.n, ib.n),
                             method="conservative: ratio of the two intervals' ends"), "from the two intervals")


def difference_measured(a: EvalResult, b: EvalResult, metric: str, records: Records) -> Measured:
    """``a``'s mean ``metric`` minus ``b``'s: per-sample differences over shared ids, else interval ends."""
    cols = _columns([records.of(a) or {}, records.of(b) or {}], [lambda r: _score(r, metric)] * 2)
    if cols:
        return Measured(mean_interval(cols[0] - cols[1]), f"paired bootstrap over {len(cols[0])} shared samples")
    qa, qb = quality_interval(a, metric, records), quality_interval(b, metric, records)
    if qa.interval is None or qb.interval is None:
        return Measured(None, qa.how or qb.how)
    ia, ib = qa.interval, qb.interval
    return Measured(Interval(ia.estimate - ib.estimate, ia.low - ib.high, ia.high - ib.low, min(ia.n, ib.n),
                             method="conservative: difference of the two intervals' ends"), "from the two intervals")


def _speed_ratio(*columns: np.ndarray, axis: int = -1) -> np.ndarray:
    """Speed-up of the first (greedy, method) pair over the second's: columns are, per sample, greedy's seconds
    and tokens then the method's, for each of the two methods (each paired with its own greedy run)."""
    g1, n1, m1, k1, g2, n2, m2, k2 = (np.sum(c, axis=axis) for c in columns)
    return ((g1 / n1) / (m1 / k1)) / ((g2 / n2) / (m2 / k2))


def _timing(record: dict[str, Any], greedy: dict[str, Any]) -> tuple[float, float, float, float] | None:
    """(greedy seconds, greedy tokens, method seconds, method tokens) of one sample: the method's record paired
    with the greedy run of its own round (``reference_decode``) or, without one, greedy's stored record."""
    reference = record.get("reference_decode") or greedy.get("decode") or {}
    values = (reference.get("wall_time_s"), reference.get("num_tokens"), _decode(record, "wall_time_s"),
              _decode(record, "num_tokens"))
    return None if None in values or not all(values) else tuple(float(v) for v in values)  # type: ignore[return-value]


def speed_ratio_measured(first: EvalResult, second: EvalResult, greedy: EvalResult, records: Records) -> Measured:
    """``first``'s speed-up over greedy divided by ``second``'s, each against the greedy run it was paired with,
    resampled over the samples both ran (paired bootstrap)."""
    a, b, g = records.of(first), records.of(second), records.of(greedy)
    if not a or not b or not g:
        return Measured(None, "no per-sample records of both methods and greedy")
    rows = [(ta, tb) for i in a if i in b and i in g
            and (ta := _timing(a[i], g[i])) is not None and (tb := _timing(b[i], g[i])) is not None]
    if not rows:
        return Measured(None, "no sample timed under both methods")
    columns = [[row[0][k] for row in rows] for k in range(4)] + [[row[1][k] for row in rows] for k in range(4)]
    return Measured(paired_interval(columns, _speed_ratio), f"paired bootstrap over {len(rows)} shared samples")


def _fraction_gain(a: np.ndarray, b: np.ndarray, c: np.ndarray, d: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.sum(a, axis=axis) / np.sum(b, axis=axis) - np.sum(c, axis=axis) / np.sum(d, axis=axis)


def gain_measured(ee: EvalResult, ar: EvalResult, ctrl_ee: EvalResult, ctrl_ar: EvalResult, metric: str,
                  records: Records) -> Measured:
    """(``ee`` / ``ar``) − (``ctrl_ee`` / ``ctrl_ar``) in ``metric``: resampled as quadruples of one sample id
    (:mod:`exitbench.stats`' paired bootstrap), else from the two fractions' intervals."""
    recs = [records.of(r) or {} for r in (ee, ar, ctrl_ee, ctrl_ar)]
    cols = _columns(recs, [lambda r: _score(r, metric)] * 4)
    if cols and cols[1].sum() > 0 and cols[3].sum() > 0:
        return Measured(paired_interval(cols, _fraction_gain),
                        f"paired bootstrap over {len(cols[0])} samples shared by the four results")
    ours, ctrl = fraction_measured(ee, ar, metric, records), fraction_measured(ctrl_ee, ctrl_ar, metric, records)
    if ours.interval is None or ctrl.interval is None:
        return Measured(None, ours.how or ctrl.how)
    a, b = ours.interval, ctrl.interval
    return Measured(Interval(a.estimate - b.estimate, a.low - b.high, a.high - b.low, min(a.n, b.n),
                             method="conservative: difference of the two fractions' intervals"),
                    "from the two fractions' intervals")


# ------------------------------------------------------------------------------------------ helpers

#: claims whose our side is a timed speed-up (or a ratio of two): judged only on enough timed prompts
TIMED_KINDS = frozenset({"speedup_at_depth", "shared_compute", "speculative_bound"})


@dataclass(frozen=True)
class _Ctx:
    claim: Claim
    paper: Paper
    results: Results
    records: Records

    @property
    def rows(self) -> dict[str, Row]:
        return self.paper.rows_by_id

    def verdict(self, subject: str, paper_value: float | None, paper_text: str, measured: Measured | None, *,
                band: Band | None = None, source: str = "", notes: Sequence[str] = (),
                reasons: Sequence[str] = (), verdict: str | None = None) -> Verdict:
        ours = measured.interval if measured else None
        if band is None and paper_value is not None:
            band = claim_band(self.claim, paper_value)
        if verdict is None:
            verdict = NOT_MEASURED if ours is None or band is None else interval_verdict(ours, band)
        why = list(reasons)
        if self.claim.kind in TIMED_KINDS and ours is not None and too_few_timed(ours.n):
            verdict = NOT_MEASURED  # shown, not judged
            why.insert(0, f"timed on {ours.n} prompts, fewer than the {MIN_SPEED_PROMPTS} a quoted speed-up needs")
        if ours is None and measured is not None and measured.how:
            why.append(measured.how)
        how = [measured.how] if measured is not None and ours is not None and measured.how else []
        flags = ["claim partly unverified (see its notes)"] if self.claim.unverified else []
        return Verdict(
            claim_id=self.claim.id, paper=self.paper.id, kind=self.claim.kind, statement=self.claim.statement,
            source=self.claim.source.describe(), subject=subject, paper_value=paper_value, paper_text=paper_text,
            band=band, ours=ours, tolerance=self.claim.tolerance, tolerance_mode=self.claim.tolerance_mode,
            verdict=verdict, our_source=source, reasons=tuple(why), notes=tuple([*how, *notes, *flags]),
        )

    def not_measured(self, why: str, subject: str = "–") -> Verdict:
        return self.verdict(subject, None, "–", None, reasons=[why], verdict=NOT_MEASURED)

    def models(self) -> list[str]:
        return list(self.claim.maps_to.models) or self.results.eval_models()

    def evals(self, model: str, method: str | None, task: str | None = None) -> list[EvalResult]:
        task = task or self.claim.maps_to.task
        found = [r for r in self.results.evals if r.model == model and base_method(r) == method
                 and (task is None or r.task == task)]
        return sorted(found, key=lambda r: (r.task, _exit_layer(r) or 0, r.method))

    def reference(self, model: str, method: str | None, task: str) -> EvalResult | None:
        """The plain instance of ``method`` (no '@' label) of ``model`` on ``task``, else its first instance."""
        found = self.evals(model, method, task)
        return next((r for r in found if r.method == method), found[0] if found else None)

    def missing(self, name: str) -> Verdict | None:
        """``not measured`` when the results hold no evaluate result of model ``name``, else None."""
        if name in self.results.eval_models():
            return None
        role = f"the control model '{name}' ({CONTROL_NOTE})" if name == self.claim.maps_to.control \
            else f"model '{name}'"
        return self.not_measured(f"no evaluate results for {role}", subject=name)


def _exit_layer(result: EvalResult) -> int | None:
    value = result.options.get("exit_layer")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _depth(result: EvalResult) -> tuple[float | None, str]:
    """(E / L, 'E=12/30') of an evaluate result, or (None, why)."""
    layers = (result.model_info or {}).get("num_layers")
    exit_layer = _exit_layer(result)
    if exit_layer is None:
        return None, f"options.exit_layer is not recorded in {result.source_file}"
    if not isinstance(layers, int) or layers < 1:
        return None, f"model_info.num_layers is not recorded in {result.source_file}"
    return exit_layer / layers, f"E={exit_layer}/{layers}"


def _curve_value(ctx: _Ctx, depth: float) -> tuple[float | None, str]:
    values = claim_paper_values(ctx.claim, ctx.rows)
    points = [(x, y) for x, y, _ in values if x is not None]
    value = interpolate(points, depth)
    xs = sorted(x for x, _ in points)
    if value is None:
        return None, f"our E/L = {depth:.2f} is outside the paper's {xs[0]:.2f}–{xs[-1]:.2f} (no extrapolation)"
    shown = ", ".join(f"{y:.3g} at {x:.2f}" for x, y in sorted(points))
    return value, f"{value:.3g} at E/L {depth:.2f} (interpolated: {shown})"


def _margin(interval: Interval, band: Band) -> float:
    """How far ``interval`` lies inside ``band`` (negative: outside) at its nearer edge."""
    return min(interval.low - band.low, band.high - interval.high)


def _worst(candidates: Sequence[tuple[Interval, Band, str]]) -> tuple[int, str]:
    """The candidate that decides an 'every one holds' claim (one entirely outside, else one straddling,
    else the one nearest an edge; the least margin first), and a note counting the verdicts."""
    verdicts = [interval_verdict(iv, band) for iv, band, _ in candidates]
    for wanted in (NOT_REPRODUCED, INCONCLUSIVE, REPRODUCED):
        picks = [i for i, v in enumerate(verdicts) if v == wanted]
        if picks:
            index = min(picks, key=lambda i: _margin(*candidates[i][:2]))
            break
    counts = ", ".join(f"{verdicts.count(v)} {v}" for v in (REPRODUCED, INCONCLUSIVE, NOT_REPRODUCED)
                       if verdicts.count(v))
    return index, f"{len(candidates)} checked ({counts}); shown: {candidates[index][2]}"


# ------------------------------------------------------------------------------------------ rules


def _at_depth(ctx: _Ctx, measure: Callable[[EvalResult], Measured]) -> list[Verdict]:
    """Our interval at each evaluated E/L against the paper's curve read there."""
    task, method = ctx.claim.maps_to.task, ctx.claim.maps_to.method
    out = []
    for model in ctx.models():
        if (missing := ctx.missing(model)) is not None:
            out.append(missing)
            continue
        found = ctx.evals(model, method)
        if not found:
            out.append(ctx.not_measured(f"no {method} result on {task} for model '{model}'", subject=model))
        for result in found:
            depth, config = _depth(result)
            subject = f"{model}, {result.task}, {result.method} {config if depth is not None else ''}".strip()
            value, text = _curve_value(ctx, depth) if depth is not None else (None, config)
            if value is None:
                out.append(ctx.not_measured(text, subject=subject))
                continue
            notes, hardware = _setting_notes(ctx, result)
            measured = measure(result)
            unusable = _unusable_outputs(ctx, result, depth) if ctx.claim.kind == "speedup_at_depth" else None
            verdict = None
            if measured.interval is not None and hardware:
                verdict = NOT_COMPARABLE  # a different hardware kind: shown, never judged
            elif measured.interval is not None and unusable:
                verdict = NOT_REPRODUCED  # same hardware kind, but the speed-up is of outputs that do not do the task
            out.append(ctx.verdict(subject, value, text, measured, source=result.source_file, notes=notes,
                                   reasons=[*hardware, *([unusable] if unusable else [])], verdict=verdict))
    return out


def _paper_quality_at(ctx: _Ctx, depth: float, metric: str) -> float | None:
    """The paper's ``quality.<metric>`` of the claim's rows, interpolated at E/L ``depth`` (None: not printed)."""
    points = []
    for row_id in ctx.claim.paper.rows:
        row = ctx.rows[row_id]
        value = row.reported_value(f"quality.{metric}")
        if value is None or row.relative_depth is None:
            return None
        points.append((row.relative_depth, value))
    return interpolate(points, depth)


#: a lossy method's speed-up is judged only where its outputs keep at least this share of the paper's quality at
#: the same E/L (LayerSkip Table 11 prints early exit's EM beside its time per token)
USABLE_QUALITY_SHARE = 0.5


def _unusable_outputs(ctx: _Ctx, result: EvalResult, depth: float) -> str | None:
    """Why a lossy method's speed-up does not reproduce the paper's: its outputs keep under half the paper's
    quality at this E/L (every quality metric 0 where the paper prints none).

    The papers' speed-ups are of outputs that still do the task (LayerSkip Table 11 prints early exit's EM
    beside its time per token: 29.8 / 77.2 / 82.0 at E = 6 / 12 / 18 of 24); a speed-up of outputs that do a
    small part of it is not that speed-up, whatever its size.
    """
    if result.correctness.exact_claimed:
        return None
    quality = result.scalar_quality()
    if not quality:
        return None
    paper = {metric: value for metric in sorted(quality)
             if (value := _paper_quality_at(ctx, depth, metric)) is not None}
    if paper:
        if all(quality[metric] >= USABLE_QUALITY_SHARE * value for metric, value in paper.items()):
            return None
    elif any(value > 0 for value in quality.values()):
        return None
    scores = ", ".join(f"{metric} {value:.3g}" for metric, value in sorted(quality.items()))
    printed = ", ".join(f"{metric} {value:.3g}" for metric, value in paper.items())
    keep = (f", where the paper's outputs keep {printed} at this E/L (interpolated): under "
            f"{USABLE_QUALITY_SHARE:.0%} of it") if paper else ""
    return (f"outputs unusable: {scores} at this exit (n={result.num_samples}){keep}; "
            "a speed-up of outputs that do not do the task does not reproduce the paper's")


def _setting_notes(ctx: _Ctx, result: EvalResult) -> tuple[list[str], list[str]]:
    """Notes (d of ours vs the paper's; for speed-ups the size difference, stated rather than hidden) and,
    for speed-ups, a different hardware kind: the one difference that makes a speed-up not comparable."""
    first = ctx.rows[ctx.claim.paper.rows[0]].setting
    notes = []
    ours_d = result.options.get("num_speculations")
    if first.num_speculations is not None and ours_d is not None and ours_d != first.num_speculations:
        notes.append(f"d differs: ours {ours_d}, paper {first.num_speculations}")
    if ctx.claim.kind != "speedup_at_depth":
        return notes, []
    reasons = incomparability(first, our_setting_of_eval(result))
    return [*notes, *(r for r in reasons if not r.startswith("hardware"))], \
        [r for r in reasons if r.startswith("hardware")]


def acceptance_at_depth(ctx: _Ctx) -> list[Verdict]:
    return _at_depth(ctx, lambda r: acceptance_interval(r, ctx.records))


def speedup_at_depth(ctx: _Ctx) -> list[Verdict]:
    """Like :func:`acceptance_at_depth`, against greedy decoding of the same model; a different hardware kind
    makes the subject ``not comparable`` (the size difference is a note)."""
    def measure(result: EvalResult) -> Measured:
        greedy = ctx.reference(result.model, "autoregressive", result.task)
        return speedup_measured(result, greedy, ctx.records)

    return _at_depth(ctx, measure)


def exit_quality_fraction(ctx: _Ctx) -> list[Verdict]:
    m = ctx.claim.maps_to

    def measure(result: EvalResult) -> Measured:
        reference = ctx.reference(result.model, m.reference_method, result.task)
        if reference is None:
            return Measured(None, f"no {m.reference_method} result on {result.task} for model '{result.model}'")
        return fraction_measured(result, reference, m.metric or "", ctx.records)

    return _at_depth(ctx, measure)


def exit_quality_fraction_gain(ctx: _Ctx) -> list[Verdict]:
    """(model's early-exit / last-layer quality) − (control's), at each E both evaluated."""
    m = ctx.claim.maps_to
    control = m.control or ""
    if (missing := ctx.missing(control)) is not None:
        return [missing]
    value = ctx.claim.paper.value or 0.0
    out = []
    for model in m.models:
        if (missing := ctx.missing(model)) is not None:
            out.append(missing)
            continue
        found = ctx.evals(model, m.method)
        if not found:
            out.append(ctx.not_measured(f"no {m.method} result on {m.task} for model '{model}'", subject=model))
        for result in found:
            _, config = _depth(result)
            subject = f"{model} vs {control}, {result.task}, {result.method} {config}"
            twin = next((r for r in ctx.evals(control, m.method, result.task)
                         if _exit_layer(r) == _exit_layer(result)), None)
            ar, ctrl_ar = (ctx.reference(name, m.reference_method, result.task) for name in (model, control))
            if twin is None or ar is None or ctrl_ar is None:
                what = f"{m.method} at E={_exit_layer(result)}" if twin is None else str(m.reference_method)
                who = control if twin is None or ctrl_ar is None else model
                out.append(ctx.not_measured(f"no {what} result on {result.task} for model '{who}'", subject=subject))
                continue
            measured = gain_measured(result, ar, twin, ctrl_ar, m.metric or "", ctx.records)
            out.append(ctx.verdict(subject, value, f"> {value:g} (the paper's direction; no value printed)",
                                   measured, source=result.source_file))
    return out


def last_layer_cost(ctx: _Ctx) -> list[Verdict]:
    """The model's last-layer quality minus the control's (both autoregressive), paired by sample id."""
    m = ctx.claim.maps_to
    control = m.control or ""
    if (missing := ctx.missing(control)) is not None:
        return [missing]
    (_, value, row_id), = claim_paper_values(ctx.claim, ctx.rows)[:1]
    text = f"{value:+.3g} (row {row_id}: {ctx.claim.paper.field} − {ctx.claim.paper.reference_field})"
    out = []
    for model in m.models:
        if (missing := ctx.missing(model)) is not None:
            out.append(missing)
            continue
        ours, ctrl = ctx.reference(model, m.method, m.task or ""), ctx.reference(control, m.method, m.task or "")
        subject = f"{model} − {control}, {m.task}, {m.method}"
        if ours is None or ctrl is None:
            who = model if ours is None else control
            out.append(ctx.not_measured(f"no {m.method} result on {m.task} for model '{who}'", subject=subject))
            continue
        out.append(ctx.verdict(subject, value, text, difference_measured(ours, ctrl, m.metric or "", ctx.records),
                               source=ours.source_file))
    return out


def exactness(ctx: _Ctx) -> list[Verdict]:
    """Sequences that differ from the same model's greedy output, pooled over tasks, per model the method ran on
    (a profile may run a method on some models only: ``evaluate.method_models``); ``not measured`` for a model the
    claim names, or when the method ran on none."""
    m = ctx.claim.maps_to
    value = ctx.claim.paper.value or 0.0
    out = []
    models = ctx.models()
    evals = {model: ctx.evals(model, m.method) for model in models}
    ran_anywhere = any(evals.values())
    for model in models:
        if (missing := ctx.missing(model)) is not None:
            out.append(missing)
            continue
        if ran_anywhere and not evals[model] and not m.models:
            continue  # the profile does not run the method on this model
        found = [r for r in evals[model] if r.correctness.num_compared]
        if not found:
            out.append(ctx.not_measured(f"no {m.method} result with a greedy comparison for model '{model}'",
                                        subject=model))
            continue
        k = sum(r.correctness.num_mismatched or 0 for r in found)
        n = sum(r.correctness.num_compared or 0 for r in found)
        per_task = ", ".join(f"{r.task}/{r.method} {r.correctness.num_mismatched or 0}/{r.correctness.num_compared}"
                             for r in found)
        out.append(ctx.verdict(f"{model}, {m.method}, every task", value, f"{value:g} (exact)",
                               Measured(clopper_pearson(k, n), ""), source=found[0].source_file,
                               notes=[f"mismatched/compared: {per_task}"]))
    return out


def _predicted(acceptance: float, d: int, c_draft: float, c_verify: float, c_tail: float = 0.0) -> float:
    return predict_speedup(min(max(acceptance, 0.0), 1.0), d, c_draft, c_verify, c_tail)["predicted_speedup"]


def _bound_interval(
    speed: Interval,
    acc: Interval,
    d: int,
    c_draft: float,
    c_verify: float,
    method: str,
    c_tail: float = 0.0,
    cost_bounds: tuple[CostSet, CostSet] | None = None,
) -> Interval:
    """measured / predicted speed-up: the speed-up's interval over the prediction at the ends of the acceptance's
    and, when recorded, the step costs' intervals (the prediction rises with acceptance and falls with each cost,
    so the low end divides by the prediction at the highest acceptance and the lowest costs)."""
    mid = _predicted(acc.estimate, d, c_draft, c_verify, c_tail)
    cheap, dear = cost_bounds or (CostSet(c_draft, c_verify, c_tail),) * 2
    high = _predicted(acc.high, d, *cheap)
    low = _predicted(acc.low, d, *dear)
    if cost_bounds is not None:
        method += "; and the step costs' intervals over their timing rounds"
    return Interval(speed.estimate / mid, speed.low / high, speed.high / low, speed.n, method=method)


def _sweep_candidates(ctx: _Ctx, model: str, rows: Sequence[SweepRow]) -> list[tuple[Interval, Band, str]]:
    band = claim_band(ctx.claim, ctx.claim.paper.value or 1.0)
    out = []
    for r in rows:
        if r.model != model or None in (r.acceptance_rate, r.num_speculations, r.c_draft, r.c_verify,
                                        r.speedup_vs_greedy):
            continue
        d, c_draft, c_verify, c_tail = r.num_speculations or 1, r.c_draft or 1.0, r.c_verify or 1.0, r.c_tail or 0.0
        predicted = _predicted(r.acceptance_rate or 0.0, d, c_draft, c_verify, c_tail)
        ratio = (r.speedup_vs_greedy or 0.0) / predicted
        tag = r.method.removeprefix(ctx.claim.maps_to.method)  # "+subvocab": the draft over a sub-vocabulary
        label = (f"E={r.exit_layer} d={r.num_speculations}{tag}: measured {r.speedup_vs_greedy:.3g}x, "
                 f"predicted {predicted:.3g}x")
        speed, acc = r.interval("speedup_vs_greedy"), r.interval("acceptance_rate")
        if speed is None or acc is None:  # a sweep written before it recorded intervals
            out.append((point(ratio, r.num_prompts, "point (the sweep records no interval)"), band, label))
            continue
        out.append((_bound_interval(speed, acc, d, c_draft, c_verify, "the sweep's speed-up interval over the "
                                    "prediction at its acceptance interval's ends", c_tail, r.cost_bounds()),
                    band, label))
    return out


def _eval_candidates(ctx: _Ctx, model: str, rows: Sequence[SweepRow]) -> list[tuple[Interval, Band, str]]:
    """Evaluate results whose (model, E, d) the sweep measured: ratio interval from the speed-up's and the
    acceptance's intervals (the prediction rises with acceptance). A result that drafted over a sub-vocabulary
    takes the costs of the sweep's sub-vocabulary row (its draft head is that one), else of the plain row. Only
    results on the task whose prompts the sweep timed: step costs relative to a greedy step depend on the context
    length (a 1k-token CNN/DM prompt makes attention, which d + 1 queries share, a larger part of each step)."""
    band = claim_band(ctx.claim, ctx.claim.paper.value or 1.0)
    out = []
    sweep_task = ctx.results.sweep.task if ctx.results.sweep is not None else None
    for result in ctx.evals(model, ctx.claim.maps_to.method):
        if sweep_task is not None and result.task != sweep_task:
            continue
        e, d = _exit_layer(result), result.options.get("num_speculations")
        method = ctx.claim.maps_to.method + (SUBVOCAB_TAG if result.options.get("draft_vocab_file") else "")
        cost = next((r for r in rows if r.model == model and r.method == method and r.exit_layer == e
                     and r.num_speculations == d and r.c_draft and r.c_verify), None)
        greedy = ctx.reference(model, "autoregressive", result.task)
        speed, acc = speedup_measured(result, greedy, ctx.records), acceptance_interval(result, ctx.records)
        if cost is None or speed.interval is None or acc.interval is None or not isinstance(d, int):
            continue
        c_draft, c_verify, c_tail = cost.c_draft or 1.0, cost.c_verify or 1.0, cost.c_tail or 0.0
        interval = _bound_interval(speed.interval, acc.interval, d, c_draft, c_verify,
                                   "speed-up interval over the prediction at the acceptance interval's ends", c_tail,
                                   cost.cost_bounds())
        predicted = _predicted(acc.interval.estimate, d, c_draft, c_verify, c_tail)
        out.append((interval, band, f"{result.task} E={e} d={d}: measured {speed.interval.estimate:.3g}x, "
                                    f"predicted {predicted:.3g}x (costs of the sweep)"))
    return out


def speculative_bound(ctx: _Ctx) -> list[Verdict]:
    """Measured / predicted speed-up per model, over the sweep rows and the evaluate results; the worst decides."""
    m = ctx.claim.maps_to
    sweep = ctx.results.sweep
    if sweep is None:
        return [ctx.not_measured("no sweep (results/bench/sweep.json): the draft/verify step costs are not measured")]
    rows = [r for r in sweep.rows if r.method == m.method]
    cost_rows = [r for r in sweep.rows if r.method in (m.method, m.method + SUBVOCAB_TAG)]
    value = ctx.claim.paper.value or 1.0
    out = []
    for model in list(m.models) or sorted({r.model for r in rows} | set(ctx.results.eval_models())):
        if not any(r.model == model for r in rows):
            out.append(ctx.not_measured(f"the sweep has no {m.method} row of model '{model}' (no measured step "
                                        "costs)", subject=f"{model}, {m.method}"))
            continue
        for where, candidates in (("sweep", _sweep_candidates(ctx, model, cost_rows)),
                                  ("evaluate", _eval_candidates(ctx, model, cost_rows))):
            subject = f"{model}, {m.method} ({where})"
            if not candidates:
                out.append(ctx.not_measured(f"no {m.method} {where} row of '{model}' with acceptance, speed-up and "
                                            "measured step costs", subject=subject))
                continue
            index, note = _worst(candidates)
            interval, band, _ = candidates[index]
            out.append(ctx.verdict(subject, value, f"≤ {value:g} (measured / predicted)", Measured(interval, ""),
                                   band=band, source=sweep.source_file if where == "sweep" else "results/eval",
                                   notes=[note]))
    return out


def speculative_bound_paper(ctx: _Ctx) -> list[Verdict]:
    """The paper's printed speed-up over the cost model's prediction from its printed acceptance, with
    layer-proportional step costs (c_draft = E/L, c_verify = (L − E)/L); one verdict per table, the worst
    row deciding."""
    band = claim_band(ctx.claim, ctx.claim.paper.value or 1.0)
    tables: dict[str, list[tuple[Interval, Band, str]]] = {}
    for _, speedup, row_id in claim_paper_values(ctx.claim, ctx.rows):
        row = ctx.rows[row_id]
        s = row.setting
        e, d, layers = s.exit_layer or 1, s.num_speculations or 1, s.num_layers or 1
        predicted = _predicted(row.reported.acceptance or 0.0, d, e / layers, (layers - e) / layers)
        derived = " (derived)" if row.paper_speedup is not None and row.paper_speedup[1] else ""
        label = (f"{row_id}: printed {speedup:.3g}x{derived} / predicted {predicted:.3g}x (acceptance "
                 f"{row.reported.acceptance:.3g}, E={e}/{layers}, d={d}) = {speedup / predicted:.2f}")
        interval = point(speedup / predicted, s.num_samples or 0, "point (printed figures)")
        tables.setdefault(row.source.table, []).append((interval, band, label))
    out = []
    for table, candidates in tables.items():
        index, note = _worst(candidates)
        others = "; ".join(label for i, (_, _, label) in enumerate(candidates) if i != index)
        out.append(ctx.verdict(
            f"paper, {table} ({len(candidates)} rows)", ctx.claim.paper.value or 1.0,
            f"≤ {ctx.claim.paper.value or 1.0:g} (printed / predicted)", Measured(candidates[index][0], ""),
            band=band, source=f"replications/{ctx.paper.id}.yaml", notes=[note, *([f"others: {others}"] if others
                                                                                  else [])],
        ))
    return out


def calm_risk_guarantee(ctx: _Ctx) -> list[Verdict]:
    """Every certified threshold's test risk against its δ, per calibrated model; the worst decides."""
    m = ctx.claim.maps_to
    if not ctx.results.calibrations:
        return [ctx.not_measured("no calibration results (results/calibrate)")]
    out = []
    for calibration in ctx.results.calibrations:
        if m.models and calibration.model not in m.models:
            continue
        rows = [r for r in calibration.rows if r.certified and r.test_risk is not None
                and (m.task is None or r.task == m.task) and (m.kv_strategy is None or r.kv_strategy == m.kv_strategy)]
        if not rows:
            out.append(ctx.not_measured("no certified threshold with a test risk (every δ fell back to λ = 1: "
                                        "nothing is claimed)", subject=calibration.model))
            continue
        candidates = [(hoeffding(r.test_risk or 0.0, r.num_test) if r.num_test else point(r.test_risk or 0.0, 0),
                       Band(-math.inf, r.delta + ctx.claim.tolerance),
                       f"{r.task} {r.measure} {r.kv_strategy} δ={r.delta:g} λ={r.threshold}: test risk "
                       f"{r.test_risk:.3g}") for r in rows]
        index, note = _worst(candidates)
        interval, band, _ = candidates[index]
        within = sum((r.test_risk or 0.0) <= r.delta for r in rows)
        out.append(ctx.verdict(f"{calibration.model}, every certified threshold", rows[index].delta,
                               "≤ δ (each threshold's own δ)", Measured(interval, ""), band=band,
                               source=calibration.source_file,
                               notes=[note, f"point estimates: {within} of {len(rows)} at most δ"]))
    return out


def calm_measure_order(ctx: _Ctx) -> list[Verdict]:
    """Our average exit layers at the same (task, δ, KV strategy) in the paper's order of measures: each
    next measure must exit later by more than the tolerance (a tie within it is inconclusive). Only certified
    thresholds count: an uncertified δ falls back to λ = 1 (no early exit) for every measure, a tie that says
    nothing about the measures."""
    order = paper_measure_order(ctx.claim, ctx.rows)
    if not ctx.results.calibrations:
        return [ctx.not_measured("no calibration results (results/calibrate)")]
    tol = ctx.claim.tolerance
    band = Band(0.0, math.inf, open_low=True)
    out = []
    for calibration in ctx.results.calibrations:
        groups: dict[tuple[str, float, str], dict[str, float]] = {}
        uncertified = 0
        for r in calibration.rows:
            if r.certified is False:
                uncertified += 1
            elif r.avg_exit_layer is not None and r.measure in order:
                groups.setdefault((r.task, r.delta, r.kv_strategy), {})[r.measure] = r.avg_exit_layer
        candidates = []
        for (task, delta, kv), layers in sorted(groups.items()):
            present = [name for name in order if name in layers]
            for first, second in itertools.pairwise(present):
                diff = layers[second] - layers[first]
                candidates.append((Interval(diff, diff - tol, diff + tol, 1, method="point ± tolerance (tie margin)"),
                                   band, f"{task} δ={delta:g} {kv}: {first} {layers[first]:.3g} < {second} "
                                         f"{layers[second]:.3g} layers"))
        measured = sorted({r.measure for r in calibration.rows})
        if not candidates:
            skipped = f" ({uncertified} uncertified: λ = 1 falls back to no early exit)" if uncertified else ""
            out.append(ctx.not_measured(f"calibrated measures: {', '.join(measured)}; the order needs two or more "
                                        f"of {', '.join(order)} certified at the same task, δ and KV strategy"
                                        f"{skipped}", subject=calibration.model))
            continue
        index, note = _worst(candidates)
        out.append(ctx.verdict(f"{calibration.model}: {' < '.join(order)}", 0.0,
                               f"{' < '.join(order)} (average exit layer; difference > 0)",
                               Measured(candidates[index][0], ""), band=band, source=calibration.source_file,
                               notes=[note]))
    return out


def shared_compute(ctx: _Ctx) -> list[Verdict]:
    """Self-speculation's speed-up over two-model speculative decoding whose draft is a copy of the same first E
    layers and head (``draft_layers`` = E, same d): the same drafts, so the difference is the shared cache and
    the verification resuming from the draft's exit states, and the separate draft's memory (in the note)."""
    m = ctx.claim.maps_to
    value = ctx.claim.paper.value or 1.0
    out = []
    for model in ctx.models():
        for result in ctx.evals(model, m.method):
            exit_layer, d = _exit_layer(result), result.options.get("num_speculations")
            twin = next((r for r in ctx.evals(model, m.reference_method, result.task)
                         if r.options.get("draft_layers") == exit_layer and r.options.get("num_speculations") == d),
                        None)
            greedy = ctx.reference(model, "autoregressive", result.task)
            if twin is None or greedy is None:
                continue  # a model or task without the separate-draft twin is not a subject of this claim
            subject = f"{model}, {result.task}, {result.method} vs {twin.method} E={exit_layer} d={d}"
            notes = [f"the separate draft holds {memory_text(twin.extra_memory)}"] if twin.extra_memory else []
            out.append(ctx.verdict(subject, value, f"> {value:g} (self-speculation faster)",
                                   speed_ratio_measured(result, twin, greedy, ctx.records),
                                   source=result.source_file, notes=notes))
    if not out:
        out.append(ctx.not_measured(f"no {m.reference_method} result with draft_layers and d equal to a "
                                    f"{m.method} result's exit_layer and d on the same model and task"))
    return out


def _skip_note(result: EvalResult) -> list[str]:
    rate = result.speed.skip_rate
    return [] if rate is None else [f"{result.method} skipped {rate:.0%} of its routed layers"]


def _against(ctx: _Ctx, other: Callable[[str, EvalResult], EvalResult | None], what: str, subject: str,
             measure: Callable[[EvalResult, EvalResult, str], Measured], value: float, text: str,
             unlike: Callable[[EvalResult, EvalResult], str | None] = lambda a, b: None) -> list[Verdict]:
    """For each model and task, the claim's method (its unlabelled instance: a ``method@name`` control is no
    subject) measured against ``other(model, result)``, on the claim's metric or the task's primary one;
    ``unlike(result, other)``: why the two runs are not in the claim's setting (the verdict: not comparable)."""
    m = ctx.claim.maps_to
    out = []
    for model in ctx.models():
        if (missing := ctx.missing(model)) is not None:
            out.append(missing)
            continue
        for result in (r for r in ctx.evals(model, m.method) if r.method == m.method):
            name = f"{model}, {result.task}, {result.method}{subject}"
            if (reference := other(model, result)) is None:
                out.append(ctx.not_measured(f"no {what} result on {result.task}", subject=name))
                continue
            metric = m.metric or result.primary or ""
            greedy = ctx.reference(model, "autoregressive", result.task)
            full = quality_interval(greedy, metric, ctx.records).interval if greedy is not None else None
            if full is not None and full.high == 0:
                why = f"'{model}' scores 0 {metric} on {result.task} with every layer (greedy): no quality to keep"
                out.append(ctx.not_measured(why, subject=name))
                continue
            notes = [f"metric: {metric}", *_skip_note(result), *_skip_note(reference)]
            why = unlike(result, reference)
            out.append(ctx.verdict(name, value, text, measure(result, reference, metric), source=result.source_file,
                                   notes=list(dict.fromkeys(notes)), reasons=[why] if why else [],
                                   verdict=NOT_COMPARABLE if why else None))
    return out


def quality_fraction(ctx: _Ctx) -> list[Verdict]:
    """A lossy method's quality over the reference method's (paired by sample), per model and task, against the
    paper's fraction (``field`` over ``reference_field`` of its row)."""
    m = ctx.claim.maps_to
    (_, value, row_id), = claim_paper_values(ctx.claim, ctx.rows)[:1]
    text = f"{value:.3g} (row {row_id}: {ctx.claim.paper.field} / {ctx.claim.paper.reference_field})"
    return _against(ctx, lambda model, r: ctx.reference(model, m.reference_method, r.task), str(m.reference_method),
                    "", lambda a, b, metric: fraction_measured(a, b, metric, ctx.records), value, text)


SAME_SKIP_RATE = 0.05  # two skip rates this close (absolute) count as the same rate


def _skip_rates_differ(a: EvalResult, b: EvalResult) -> str | None:
    """Why ``a`` and ``b`` are not at the same skip rate (both measured and more than 5 points apart), or None."""
    ra, rb = a.speed.skip_rate, b.speed.skip_rate
    if ra is None or rb is None or abs(ra - rb) <= SAME_SKIP_RATE:
        return None
    return (f"the claim compares at the same skip rate; {a.method} skipped {ra:.0%} and {b.method} {rb:.0%} "
            f"(more than {SAME_SKIP_RATE:.0%} apart), so a quality difference is partly the skip rates'")


def quality_above_control(ctx: _Ctx) -> list[Verdict]:
    """The method's quality minus its control's (``control_label``: the same model and task, paired by sample),
    in the paper's direction, at the same skip rate (:data:`SAME_SKIP_RATE`; else not comparable)."""
    m = ctx.claim.maps_to
    value = ctx.claim.paper.value or 0.0

    def control(model: str, result: EvalResult) -> EvalResult | None:
        return next((r for r in ctx.evals(model, m.method, result.task) if r.method == m.control_label), None)

    return _against(ctx, control, str(m.control_label), f" vs {m.control_label}",
                    lambda a, b, metric: difference_measured(a, b, metric, ctx.records), value,
                    f"> {value:g} (the paper's direction)", _skip_rates_differ)


RULES: dict[str, Callable[[_Ctx], list[Verdict]]] = {
    "acceptance_at_depth": acceptance_at_depth,
    "speedup_at_depth": speedup_at_depth,
    "exit_quality_fraction": exit_quality_fraction,
    "exit_quality_fraction_gain": exit_quality_fraction_gain,
    "last_layer_cost": last_layer_cost,
    "exactness": exactness,
    "speculative_bound": speculative_bound,
    "speculative_bound_paper": speculative_bound_paper,
    "calm_risk_guarantee": calm_risk_guarantee,
    "calm_measure_order": calm_measure_order,
    "shared_compute": shared_compute,
    "quality_fraction": quality_fraction,
    "quality_above_control": quality_above_control,
}


def check_claim(claim: Claim, paper: Paper, results: Results, records: Records | None = None) -> list[Verdict]:
    """Every verdict of one claim (at least one)."""
    ctx = _Ctx(claim, paper, results, records or Records(results.root))
    return RULES[claim.kind](ctx) or [ctx.not_measured("no result matches the claim's maps_to")]


def run_claims(papers: tuple[Paper, ...], results: Results) -> list[Verdict]:
    records = Records(results.root)
    return [v for paper in papers for claim in paper.claims for v in check_claim(claim, paper, results, records)]
