"""The report's text outputs: ``results/README.md``, ``results/tables/*.csv`` and ``results/metrics.json``.

Everything here is built from validated result files (:mod:`exitbench.report.results`) and the
replication rows; nothing is measured. Missing optional stages are reported as "not run".
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exitbench.cost_model import predict_speedup
from exitbench.errors import ExitbenchError
from exitbench.replications import Paper
from exitbench.report.format import (
    Column,
    Estimate,
    csv_rows,
    estimate_columns,
    fmt,
    fmt_bounds,
    fmt_estimate,
    fmt_pct,
    fmt_x,
    markdown,
    markdown_table,
    rounded,
    write_csv,
)
from exitbench.report.results import (
    MIN_SPEED_PROMPTS,
    CalibrationRow,
    EvalResult,
    Probe,
    Provenance,
    Results,
    SweepRow,
    TrainReport,
    memory_text,
    too_few_timed,
)
from exitbench.report.throughput import GREEDY, table_rows, throughput_section
from exitbench.stats import Interval

METHOD_ORDER = (
    "autoregressive",
    "early_exit",
    "self_speculative",
    "self_speculative_lookup",
    "hf_early_exit",
    "prompt_lookup",
    "hf_prompt_lookup",
    "speculative",
    "adaptive_self_speculative",
    "layer_skip_draft",
    "swift",
    "kangaroo",
    "mindskip",
    "depth_pruning",
    "calm",
)
NOT_RUN = "_not run in this profile (no result files)._"


def provenance_line(prov: Provenance, extra: str = "") -> str:
    threads = f"{prov.threads} threads" if prov.threads else "threads ?"
    features = prov.extra("cpu_features") or {}
    device = prov.device + (f" ({', '.join(features['flags'])})" if features.get("flags") else "")
    parts = [device, threads, f"commit `{prov.short_commit}`", prov.date, f"`{prov.command}`"]
    return " · ".join(p for p in [extra, *parts] if p)


def method_key(method: str) -> tuple[int, str]:
    return (METHOD_ORDER.index(method) if method in METHOD_ORDER else len(METHOD_ORDER), method)


def result_key(result: EvalResult) -> tuple[int, str, int, str]:
    """Table order: the registry method (an instance label such as ``early_exit@8`` under ``early_exit``), E."""
    order, family = method_key(result.family)
    return (order, family, result.exit_layer or 0, result.method)


def scored(result: EvalResult) -> int:
    """Samples that produced a score (failed generations are left out of every metric)."""
    return result.num_samples - result.num_failed


def quality_source(result: EvalResult, peers: Iterable[EvalResult]) -> EvalResult:
    """The result whose quality ``result`` reports: itself, or the run named by its ``quality_from`` (an exact
    method timed on fewer samples reports greedy's quality, identical tokens by construction)."""
    name = result.quality_source
    if name is None or name == result.method:
        return result
    same = [p for p in peers if (p.model, p.task) == (result.model, result.task)]
    return next((p for p in same if p.method == name), next((p for p in same if p.family == name), result))


def quality_estimate(result: EvalResult, metric: str, peers: Iterable[EvalResult] = ()) -> Estimate:
    """A quality metric (``exact_match``, ``per_domain/alarm``, ...) with its interval and n."""
    source = quality_source(result, peers)
    value: Any
    if metric.startswith("per_domain/"):
        domain = metric.split("/", 1)[1]
        value = next(
            (
                r.quality["per_domain"].get(domain)
                for r in (result, source)
                if isinstance(r.quality.get("per_domain"), dict) and domain in r.quality["per_domain"]
            ),
            None,
        )
    else:
        value = result.scalar_quality().get(metric, source.scalar_quality().get(metric))
    if value is None:
        return Estimate(None)
    interval = result.interval(metric) or source.interval(metric)
    if interval is not None:
        return Estimate(value, interval, interval.n)
    if metric.startswith("per_domain/"):
        strata = (source.sample or {}).get("strata") or {}
        count = strata.get(metric.split("/", 1)[1]) if isinstance(strata, dict) else None
        return Estimate(value, None, count if isinstance(count, int) else None)
    return Estimate(value, None, scored(source))


def speed_estimate(result: EvalResult, metric: str) -> Estimate:
    """``speedup_vs_greedy``, ``acceptance_rate`` or ``mismatch_rate`` with its interval and n."""
    if metric == "mismatch_rate":
        value = result.correctness.mismatch_rate
        n = result.correctness.num_compared if result.correctness.num_compared is not None else scored(result)
    else:
        value, n = getattr(result.speed, metric), scored(result)
    interval = result.interval(metric)
    return Estimate(value, interval, interval.n if interval else n)


def sweep_estimate(row: SweepRow, metric: str) -> Estimate:
    interval = row.interval(metric)
    return Estimate(getattr(row, metric), interval, interval.n if interval else row.num_prompts)


def quality_metrics(results: list[EvalResult]) -> list[str]:
    """Scalar quality metrics present for a task, its primary metric first."""
    names = sorted({name for r in results for name in r.scalar_quality()})
    primary = results[0].primary if results else None
    return ([primary] if primary in names else []) + [n for n in names if n != primary]


def exactness(result: EvalResult) -> str:
    """exact (n/n), or how many outputs differ from greedy's, with the mismatch rate's interval when stored."""
    c = result.correctness
    if c.num_mismatched is None:
        return "claimed" if c.exact_claimed else "lossy"
    compared = c.num_compared if c.num_compared is not None else scored(result)
    rate = speed_estimate(result, "mismatch_rate")
    rate_text = f" ({fmt_pct(rate.value)} {fmt_bounds(rate, 'pct')})" if rate.interval is not None else ""
    if c.exact_claimed:
        if c.num_mismatched == 0:
            return f"exact ({compared}/{compared})"
        return f"**NOT exact: {c.num_mismatched}/{compared} differ**{rate_text}"
    where = f", 1st divergence ~{c.first_divergence_mean:.0f}" if c.first_divergence_mean is not None else ""
    return f"lossy: {c.num_mismatched}/{compared} differ{rate_text}{where}"


def options_text(options: dict[str, Any]) -> str:
    """A method's options as a table cell; a file option (the draft vocabulary, the calibration text: evaluate writes
    them per model and task, their paths are in the summary) shows as ``+draft_vocab`` / ``+calibration`` /
    ``+adapter``."""
    short = {"exit_layer": "E", "num_speculations": "d"}
    cells = [f"+{k.removesuffix('_file')}" if k.endswith("_file") else f"{short.get(k, k)}={v}"
             for k, v in sorted(options.items()) if v != ""]
    return " ".join(cells) or "–"


# ------------------------------------------------------------------------------------------ sections


def paper_lines(papers: tuple[Paper, ...], task: str, methods: set[str]) -> list[str]:
    """Bullets with the papers' stated speed-ups for one task and the methods we ran (all rows: check.md)."""
    lines = []
    for paper in papers:
        for row in paper.rows:
            if row.maps_to.task != task or row.reported.speedup is None or row.maps_to.ablation:
                continue
            if row.maps_to.method not in methods:
                continue
            quality = ", ".join(f"{k} {v:g}" for k, v in row.reported.quality.items())
            acceptance = f", acceptance {fmt_pct(row.reported.acceptance)}" if row.reported.acceptance else ""
            lines.append(
                f"- {paper.id} {row.source.table}: {row.label} · {row.maps_to.method} "
                f"**{fmt_x(row.reported.speedup)}**{' · ' + quality if quality else ''}{acceptance}"
            )
    return lines


def tokens_per_sample(r: EvalResult) -> float | None:
    """Mean generated tokens per scored prompt (None when the result file does not store the count)."""
    scored_prompts = r.num_samples - r.num_failed
    return r.speed.num_tokens / scored_prompts if r.speed.num_tokens is not None and scored_prompts else None


def skip_text(r: EvalResult) -> str:
    """`` · skips 35%``: a routed method's share of its routed layers skipped (empty for any other)."""
    return "" if r.speed.skip_rate is None else f" · skips {fmt_pct(r.speed.skip_rate)}"


# greedy decoding under a label of its own, timed against greedy exactly like a method (an A/A control)
A_A_METHOD = "autoregressive@aa"


def eval_columns(metrics: list[str], peers: list[EvalResult], framework: bool = True) -> list[Column[EvalResult]]:
    """The per-method table, for the README (the columns with a header) and ``tables/eval.csv`` (those with a
    field): every quality metric, speed-up and acceptance with interval and n; ``peers``: the results an exact
    method may take its quality from; ``framework``: the speed-up against transformers' own greedy too."""

    def borrowed(r: EvalResult) -> str | None:
        source = quality_source(r, peers)
        return None if source is r else source.method

    def extra(key: str) -> Callable[[EvalResult], Any]:
        return lambda r: (r.extra_memory or {}).get(key)

    def prov(key: str) -> Callable[[EvalResult], Any]:
        return lambda r: getattr(r.provenance, key)

    return [
        Column(None, "model", lambda r: r.model),
        Column(None, "task", lambda r: r.task),
        Column("method", "method", lambda r: r.method, align="l",
               text=lambda r: r.method + (" †" if borrowed(r) else "")),
        Column(None, "base_method", lambda r: r.family),
        Column("options", "options", lambda r: options_text(r.options), align="l",
               text=lambda r: options_text(r.options) + skip_text(r)),
        Column(None, "dtype", lambda r: r.dtype),
        Column(None, "num_samples", lambda r: r.num_samples),
        *[Column(m, f"quality_{m}", lambda r, m=m: quality_estimate(r, m, peers)) for m in metrics],
        Column(None, "quality_from", borrowed),
        Column("ms/token", "time_per_token_ms", lambda r: r.speed.time_per_token_ms, digits=2),
        Column("speed-up", "speedup_vs_greedy", lambda r: speed_estimate(r, "speedup_vs_greedy"), "x"),
        *([Column("vs own greedy ‡", "speedup_vs_framework_greedy",
                  lambda r: speed_estimate(r, "speedup_vs_framework_greedy"), "x")] if framework else []),
        Column("acceptance", "acceptance_rate", lambda r: speed_estimate(r, "acceptance_rate"), "pct"),
        Column("tokens/round", "tokens_per_round", lambda r: r.speed.tokens_per_round, digits=2),
        Column("tokens/sample", "tokens_per_sample", tokens_per_sample, digits=1),
        Column("ideal fraction", "ideal_fraction", lambda r: r.speed.ideal_fraction, digits=2),
        Column("failed", "num_failed", lambda r: r.num_failed),
        Column(None, "extra_parameters", extra("num_parameters")),
        Column(None, "extra_memory_bytes", extra("bytes")),
        Column(None, "exact_claimed", lambda r: r.correctness.exact_claimed),
        Column(None, "num_mismatched", lambda r: r.correctness.num_mismatched),
        Column(None, "mismatch_rate", lambda r: speed_estimate(r, "mismatch_rate")),
        Column("exactness", None, exactness, align="l"),
        Column(None, "sample_seed", lambda r: (r.sample or {}).get("seed")),
        *[Column(None, key, prov(key)) for key in ("device", "threads", "git_commit", "date")],
    ]  # fmt: skip


def eval_table(rows: list[EvalResult]) -> list[str]:
    """One (task, model): a row per method (:func:`eval_columns`), then the notes its marks point to."""
    framework = any(r.speed.speedup_vs_framework_greedy is not None for r in rows)
    lines = markdown(eval_columns(quality_metrics(rows), rows, framework), rows)
    if framework:
        lines += [
            "",
            "‡ a method inside transformers' generate() against transformers' own greedy decoding (`hf_greedy`) on "
            "the same prompts: the method's merit in its framework; `speed-up` is against exitbench's greedy "
            "decoding (what a user gets). `hf_greedy`'s own speed-up is the engine's share, `autoregressive@linear`'s "
            "(F.linear projections, as transformers uses) the kernel's.",
        ]
    for r in rows:
        if r.method == A_A_METHOD:
            lines += [
                "",
                f"A/A control (`{A_A_METHOD}`: greedy timed against greedy like a method): "
                f"{a_a_text(speed_estimate(r, 'speedup_vs_greedy'))}.",
            ]
    for r in rows:
        if r.extra_memory:
            lines += ["", f"`{r.method}` holds beside the model: {memory_text(r.extra_memory)}."]
    sources = sorted({(src.method, scored(src)) for r in rows if (src := quality_source(r, rows)) is not r})
    if sources:
        named = ", ".join(f"`{method}`'s (n={n})" for method, n in sources)
        lines += [
            "",
            f"† exact method timed on its own sample: its quality is {named} by construction "
            "(identical tokens); its speed-up and acceptance carry their own n.",
        ]
    return lines


def eval_section(results: Results, papers: tuple[Paper, ...], profile: str) -> list[str]:
    lines = ["## Quality, speed and exactness per task", ""]
    if not results.evals:
        return [*lines, NOT_RUN, ""]
    lines += [
        "Each number is followed by its 95% confidence interval in brackets (seeded bootstrap over samples, "
        "paired with greedy decoding for speed-ups; see `exitbench/stats.py`) and its sample size n; a number "
        "without brackets comes from a result file that stores no interval. "
        "Speed-up is greedy decoding's time per token over the method's, on the same checkpoint and prompts. "
        "Acceptance = accepted drafts / drafted tokens. Tokens/round = generated tokens (the first one, from the "
        "prefill, included) per draft-verify round, so very short outputs push it above 1 + accepted per round. "
        "Tokens/sample = mean generated tokens per prompt: a lossy method far below greedy's count stops early, "
        "and its time per token is then mostly the prefill's, so its speed-up says little. "
        "Ideal fraction = measured speed-up / the cost model's ideal. "
        "Exactness compares each output token for token with greedy decoding.",
        "",
    ]
    for task in results.eval_tasks():
        lines += [f"### {task}", ""]
        for model in results.eval_models():
            rows = sorted((r for r in results.evals if r.task == task and r.model == model), key=result_key)
            if not rows:
                continue
            first = rows[0]
            commits = sorted({r.provenance.short_commit for r in rows})
            extra = f"model `{model}` · {first.dtype} · {first.num_samples} samples"
            if first.chat_template is not None:
                extra += " · prompts through the chat template" if first.chat_template else " · plain-text prompts"
            lines.append(provenance_line(first.provenance, extra))
            if len(commits) > 1:
                lines.append(f"(methods measured at different commits: {', '.join(commits)})")
            lines += ["", *eval_table(rows), "", *per_domain_table(rows)]
        references = paper_lines(papers, task, {r.family for r in results.evals if r.task == task})
        if references:
            lines += [
                "Paper figures for this task (different models and hardware; see `check.md`):",
                "",
                *references,
                "",
            ]
    lines += [
        f"Reproduce: `python pipelines/use_profile.py {profile} && dvc repro` (the profile and the code "
        "at the commits above).",
        "",
    ]
    return lines


KEPT_QUALITY = 0.9  # a lossy point counts as usable when it keeps this share of greedy's primary metric
REFERENCES = (GREEDY, "hf_greedy")  # greedy decoding itself (any kernel or engine): the baseline, not a contender


def quoted_speedup(r: EvalResult) -> Estimate | None:
    """The speed-up against greedy where it rests on enough prompts to quote, else None."""
    estimate = speed_estimate(r, "speedup_vs_greedy")
    return None if estimate.value is None or estimate.n is None or too_few_timed(estimate.n) else estimate


def lossy_points(rows: list[EvalResult], greedy_quality: float) -> list[tuple[EvalResult, Estimate, float]]:
    """(result, speed-up, primary metric / greedy's) of every lossy method with a quotable speed-up, fastest
    first."""
    points = []
    for r in rows:
        quality = quality_estimate(r, r.primary, rows).value
        if not r.correctness.exact_claimed and quality is not None and (speedup := quoted_speedup(r)) is not None:
            points.append((r, speedup, quality / greedy_quality))
    return sorted(points, key=lambda p: -(p[1].value or 0.0))


def pareto(points: list[tuple[EvalResult, Estimate, float]]) -> list[tuple[EvalResult, Estimate, float]]:
    """The points no other point beats on both speed-up and quality kept (fastest first)."""
    front: list[tuple[EvalResult, Estimate, float]] = []
    for point in points:
        if not front or point[2] > front[-1][2]:
            front.append(point)
    return front


def best_section(results: Results) -> list[str]:
    """Per task and model: the fastest exact method, and the fastest lossy one keeping :data:`KEPT_QUALITY` of
    greedy's primary metric, each with its interval and n; then the lossy speed/quality front."""
    def named(r: EvalResult) -> str:
        return f"`{r.method}`" + (f" ({options_text(r.options)})" if r.options else "")

    body = []
    for task in results.eval_tasks():
        for model in results.eval_models():
            rows = [r for r in results.evals if (r.task, r.model) == (task, model)]
            greedy = next((r for r in rows if r.method == GREEDY), None)
            if greedy is None:
                continue
            exact = [r for r in rows if r.family not in REFERENCES and r.correctness.exact_claimed
                     and r.correctness.num_mismatched == 0]  # fmt: skip
            timed = [(r, e) for r in exact if (e := quoted_speedup(r)) is not None]
            fastest = max(timed, key=lambda p: p[1].value or 0.0, default=None)
            exact_text = f"{named(fastest[0])} {fmt_estimate(fastest[1], 'x')}" if fastest else (
                "– (none timed on 16 prompts or more)" if exact else "–")
            base = quality_estimate(greedy, greedy.primary, rows).value
            lossy = [r for r in rows if not r.correctness.exact_claimed]
            if not base:
                lossy_text, front_text = f"– (greedy scores {fmt(base)}: no quality to keep)", ""
            else:
                points = lossy_points(rows, base)
                usable = next((p for p in points if p[2] >= KEPT_QUALITY), None)
                lossy_text = (f"{named(usable[0])} {fmt_estimate(usable[1], 'x')}, keeps {usable[2]:.2f}" if usable
                              else f"none keeps {KEPT_QUALITY:.0%}" if points
                              else "– (none timed on 16 prompts or more)" if lossy else "–")  # fmt: skip
                front_text = "; ".join(f"{p[0].method} {fmt_x(p[1].value)} / {p[2]:.2f}" for p in pareto(points))
            body.append([task, model, f"{greedy.primary} {fmt(base)}", exact_text, lossy_text, front_text or "–"])
    if not body:
        return []
    return [
        "## The best per task",
        "",
        "Per task and model: the fastest exact method (0 outputs differ from greedy's) and the fastest lossy one "
        f"keeping at least {KEPT_QUALITY:.0%} of greedy's primary metric, each speed-up against greedy with its 95% "
        "interval and n (speed-ups on fewer than 16 prompts are left out); then every lossy point no other beats on "
        "both speed-up and quality kept (speed-up / quality over greedy's).",
        "",
        *markdown_table(["task", "model", "greedy", "fastest exact", "best lossy", "lossy front"], body),
        "",
    ]


def domains_of(rows: Iterable[EvalResult]) -> list[str]:
    """Every TOPv2 domain any result reports: in ``per_domain``, in its intervals or in its sample strata."""
    found: set[str] = set()
    for r in rows:
        per = r.quality.get("per_domain")
        found |= set(per) if isinstance(per, dict) else set()
        found |= {key.split("/", 1)[1] for key in r.intervals if key.startswith("per_domain/")}
    return sorted(found)


def per_domain_table(rows: list[EvalResult]) -> list[str]:
    """TOPv2's per-domain exact match, every domain in the results, each cell with its interval and n."""
    domains = domains_of(rows)
    if not domains:
        return []
    body = [[r.method, *[fmt_estimate(quality_estimate(r, f"per_domain/{d}", rows)) for d in domains]] for r in rows]
    return ["Per-domain exact match:", "", *markdown_table(["method", *domains], body, "l" + "r" * len(domains)), ""]


def bandwidth_text(prov: Provenance) -> str:
    """The bench's STREAM triad bandwidths, per dtype, or "not measured" for an older sweep."""
    measured = prov.extra("memory_bandwidth") or {}
    if not measured:
        return "not measured"
    return ", ".join(f"{dtype} triad {entry['gb_per_s']:.1f} GB/s" for dtype, entry in measured.items())


def verify_scaling_lines(prov: Provenance) -> list[str]:
    """One line per model and dtype: a verification forward's cost over r token rows relative to one row."""
    lines = []
    for key, scaling in (prov.extra("verify_scaling") or {}).items():
        pairs = zip(scaling["rows"], scaling["relative_cost"], strict=True)
        costs = ", ".join(f"{rows}: {cost:.2f}" for rows, cost in pairs)
        lines.append(
            f"- verification over r rows (layers {scaling['exit_layer']}..L-1 and the head) costs, relative to one "
            f"row ({scaling['one_row_ms']:.1f} ms), `{key}`: {costs}"
        )
    return [*lines, ""] if lines else []


def pass_range(row: SweepRow) -> str:
    """The lowest and highest single-pass speed-up ("0.97-1.04x"), or "-" with fewer than two passes."""
    passes = row.speedup_passes or ()
    if len(passes) < 2:
        return "-"
    return f"{min(passes):.2f}-{max(passes):.2f}x"


def is_greedy_row(row: SweepRow) -> bool:
    """Greedy or its A/A control (greedy timed against itself), not a method under test."""
    return row.method.startswith("autoregressive")


def a_a_text(estimate: Estimate) -> str:
    """Greedy timed against itself: its speed-up, whether its interval contains 1.00x, and its half-width (the
    noise floor: a speed-up whose interval is not wider apart from 1.00x than this is within timing noise)."""
    interval = estimate.interval
    if interval is None:
        return fmt_estimate(estimate, "x")
    holds = " (contains 1.00x)" if interval.low <= 1.0 <= interval.high else " (**misses 1.00x: timing drifted**)"
    return f"{fmt_estimate(estimate, 'x')}{holds}; noise floor ±{(interval.high - interval.low) / 2:.3f}x"


def noise_floor_lines(rows: Iterable[SweepRow]) -> list[str]:
    """One line per (model, dtype) with an A/A control: greedy against greedy, whose interval is the run's noise."""
    lines = []
    for row in rows:
        if is_greedy_row(row) and row.method != "autoregressive":
            passes = pass_range(row)
            single = f"; one pass alone {passes}" if passes != "-" else ""
            lines.append(
                f"- A/A control `{row.model}` ({row.dtype}): greedy against greedy "
                f"{a_a_text(sweep_estimate(row, 'speedup_vs_greedy'))}{single}"
            )
    return lines


def best_sweep_row(rows: Iterable[SweepRow]) -> SweepRow | None:
    candidates = [r for r in rows if r.speedup_vs_greedy and not is_greedy_row(r)]
    return max(candidates, key=lambda r: r.speedup_vs_greedy or 0.0) if candidates else None


def sweep_section(results: Results) -> list[str]:
    lines = ["## Decoding sweep over exit layer E and speculations d", ""]
    sweep = results.sweep
    if sweep is None:
        return [*lines, NOT_RUN, ""]
    first = sweep.rows[0] if sweep.rows else None
    setup = f"{first.num_prompts} prompts, {first.max_new_tokens} new tokens" if first else "no rows"
    lines += [
        provenance_line(sweep.provenance, f"`{sweep.source_file}` · {setup}"),
        "",
        "Speed-up and acceptance: 95% bootstrap interval over prompts (speed-up paired with greedy on the "
        "same prompts, repeats summed) and n = prompts; passes: the lowest and highest speed-up of one timing "
        "pass alone (each pass times every prompt once, methods interleaved).",
        "Costs, relative to one greedy step and timed interleaved: c_draft one draft step (E layers and the draft "
        "head, over the sub-vocabulary in +subvocab rows), c_tail the last draft's E layers without the head (once "
        "a round, for a verification that starts at the exit), c_verify one verification forward over d + 1 "
        "positions; ideal = tokens per round / (d c_draft + c_tail + c_verify). Each cost is the median of its "
        "per-round ratios; the cost-model check divides by the prediction at the ends of the acceptance's and "
        "the costs' intervals (order statistics of each median), so the costs' own timing noise is in its verdict.",
        "Roofline: MB/token is what a method reads per generated token (weights of the layers it runs, the head, "
        "the KV cache it attends over; prefill included); % roofline is the time those bytes need at the "
        f"machine's measured bandwidth ({bandwidth_text(sweep.provenance)}) over the measured time.",
        "",
    ]
    lines += verify_scaling_lines(sweep.provenance)
    for model_dtype in sorted({(r.model, r.dtype) for r in sweep.rows}):
        best = best_sweep_row(r for r in sweep.rows if (r.model, r.dtype) == model_dtype)
        if best is not None:
            speedup = fmt_estimate(sweep_estimate(best, "speedup_vs_greedy"), "x")
            lines.append(
                f"- best for `{model_dtype[0]}` ({model_dtype[1]}): {best.method} E={fmt(best.exit_layer)} "
                f"d={fmt(best.num_speculations)} → **{speedup}**"
            )
    lines.append("")
    rows = sorted(
        sweep.rows, key=lambda r: (r.model, r.dtype, method_key(r.method), r.exit_layer or 0, r.num_speculations or 0)
    )
    return [*lines, *markdown(SWEEP_COLUMNS, rows), "", *noise_floor_lines(rows), ""]


def _per_million(value: float | None) -> float | None:
    return None if value is None else value / 1e6


# the README's sweep table (tables/sweep.csv is the stage's rows as they are: every field)
SWEEP_COLUMNS: list[Column[SweepRow]] = [
    Column("model", None, lambda r: r.model, align="l"),
    Column("dtype", None, lambda r: r.dtype, align="l"),
    Column("method", None, lambda r: r.method, align="l"),
    Column("E", None, lambda r: r.exit_layer),
    Column("d", None, lambda r: r.num_speculations),
    Column("ms/token", None, lambda r: r.time_per_token_ms, digits=2),
    Column("IQR ms", None, lambda r: r.iqr_ms, digits=2),
    Column("speed-up", None, lambda r: sweep_estimate(r, "speedup_vs_greedy"), "x"),
    Column("passes", None, pass_range),
    Column("acceptance", None, lambda r: sweep_estimate(r, "acceptance_rate"), "pct"),
    Column("tokens/round", None, lambda r: r.tokens_per_round, digits=2),
    Column("c_draft", None, lambda r: r.c_draft),
    Column("c_tail", None, lambda r: r.c_tail),
    Column("c_verify", None, lambda r: r.c_verify),
    Column("ideal", None, lambda r: r.ideal_speedup, "x"),
    Column("ideal fraction", None, lambda r: r.ideal_fraction, digits=2),
    Column("MB/token", None, lambda r: _per_million(r.bytes_per_token), digits=0),
    Column("% roofline", None, lambda r: None if r.roofline_fraction is None else 100 * r.roofline_fraction, digits=0),
    Column("exact", None, lambda r: fmt(r.exact) if r.num_mismatched in (None, 0) else f"no ({r.num_mismatched})",
           align="l"),
]  # fmt: skip


# ------------------------------------------------------------------------------------------ control comparison

CONTROL = "plain"
COMPARE_MODELS = (CONTROL, "layerskip", "calm")
PROBE_TEXTS = {
    "cnndm": ("english",),
    "xsum": ("english",),
    "humaneval": ("code",),
    "mbpp": ("code",),
    "topv2": ("topv2_target", "topv2"),
}
CONTROL_SENTENCE = (
    f"`{CONTROL}` is the control: the same finetune as `layerskip` (same data, steps, optimizer and seed) without "
    "layer dropout and with the loss on the last layer only, so a difference between `plain` and `layerskip` is "
    "the early-exit recipe's effect, not the finetune's."
)
FRACTION_CONFIDENCE = 0.90
FRACTION_METHOD = "Bonferroni: early-exit interval over last-layer interval (at least 90%, conservative)"


@dataclass(frozen=True)
class CompareCell:
    """One cell of the control comparison: a quantity of one model, with its estimate, interval and n."""

    order: tuple[int, ...]
    quantity: str
    label: str
    model: str
    estimate: Estimate
    kind: str = "num"
    metric: str = ""
    exit_layer: int | None = None
    num_speculations: int | None = None
    why: str = ""  # shown when there is no value


def fraction_estimate(early: Estimate, last: Estimate) -> tuple[Estimate, str]:
    """Early-exit quality / last-layer quality. Its interval divides the ends of the two 95% intervals, which
    both hold with probability at least 90% (Bonferroni), so it is a conservative 90% interval."""
    if early.value is None or last.value is None:
        return Estimate(None), "not measured"
    if last.value <= 0:
        return Estimate(None, n=early.n), "last layer scores 0"
    value = early.value / last.value
    if early.interval is None or last.interval is None:
        return Estimate(value, None, early.n), ""
    low = early.interval.low / last.interval.high if last.interval.high > 0 else math.nan
    high = early.interval.high / last.interval.low if last.interval.low > 0 else math.inf
    low = 0.0 if math.isnan(low) else min(low, value)
    interval = Interval(value, low, max(high, value), early.n or 0, FRACTION_CONFIDENCE, FRACTION_METHOD)
    return Estimate(value, interval, early.n), ""


def probe_agreement(probe: Probe | None, task: str, exit_layer: int) -> tuple[Estimate, str]:
    """Top-1 agreement with the last layer after ``exit_layer`` layers, on the probe text closest to ``task``."""
    if probe is None:
        return Estimate(None), "no probe"
    kind = next((k for k in PROBE_TEXTS.get(task, ("english",)) if k in probe.texts), None)
    if kind is None:
        return Estimate(None), "no probe text for this task"
    curve = probe.texts[kind]
    index = exit_layer - 1 if len(curve.agreement) == probe.num_layers else exit_layer
    if not 0 <= index < len(curve.agreement):
        return Estimate(None), "layer not probed"
    texts = "text" if curve.num_texts == 1 else "texts"
    detail = f" {texts}, {curve.num_tokens} positions of `{kind}`" if curve.num_tokens is not None else f" `{kind}`"
    return Estimate(curve.agreement[index], None, curve.num_texts, detail), ""


def _quality_cells(rows: list[EvalResult], task: str, model: str) -> list[CompareCell]:
    """Last-layer quality, then each evaluated exit layer's quality and its fraction of the last layer's."""
    metric = next((r.primary for r in rows if r.primary), None) or (quality_metrics(rows) or [""])[0]
    greedy = next((r for r in rows if r.family == "autoregressive"), None)
    last = quality_estimate(greedy, metric, rows) if greedy else Estimate(None)
    cells = [CompareCell((0,), "last_layer_quality", f"last layer: {metric}", model, last, metric=metric)]
    for r in sorted((r for r in rows if r.family == "early_exit" and r.exit_layer), key=result_key):
        e, early = r.exit_layer or 0, quality_estimate(r, metric, rows)
        paired = r.interval(f"fraction_of_greedy/{metric}")
        if paired is not None:  # stored by evaluate: paired per sample with greedy, a 95% interval
            fraction, why = Estimate(paired.estimate, paired, paired.n), ""
            label = f"early exit E={e} / last layer"
        else:
            fraction, why = fraction_estimate(early, last)
            label = f"early exit E={e} / last layer (≥90% interval)"
        cells += [
            CompareCell(
                (1, e, 0),
                "early_exit_quality",
                f"early exit E={e}: {metric}",
                model,
                early,
                metric=metric,
                exit_layer=e,
            ),
            CompareCell(
                (1, e, 1),
                "early_exit_fraction_of_last_layer",
                label,
                model,
                fraction,
                metric=metric,
                exit_layer=e,
                why=why,
            ),
        ]
    return cells


def _speculation_cells(rows: list[EvalResult], model: str) -> list[CompareCell]:
    """Self-speculation's acceptance and speed-up at each evaluated (E, d)."""
    cells = []
    for r in sorted((r for r in rows if r.family == "self_speculative"), key=result_key):
        e, d = r.exit_layer or 0, r.options.get("num_speculations")
        d = d if isinstance(d, int) else None
        setting = f"E={e}, d={d}" + (", draft sub-vocabulary" if "draft_vocab_file" in r.options else "")
        for j, (quantity, name, kind) in enumerate(
            (("acceptance_rate", "acceptance", "pct"), ("speedup_vs_greedy", "speed-up", "x"))
        ):
            cells.append(
                CompareCell(
                    (3, e, d or 0, j),
                    quantity,
                    f"self-speculative {name} ({setting})",
                    model,
                    speed_estimate(r, quantity),
                    kind,
                    exit_layer=e,
                    num_speculations=d,
                )
            )
    return cells


def _model_cells(results: Results, task: str, model: str, exit_layers: list[int]) -> list[CompareCell]:
    rows = [r for r in results.evals if (r.task, r.model) == (task, model)]
    probe = next((p for p in results.probes if p.model == model), None)
    agreement = []
    for e in exit_layers:
        estimate, why = probe_agreement(probe, task, e)
        label = f"agreement with the last layer at layer {e}"
        agreement.append(
            CompareCell((2, e), "agreement_with_last_layer", label, model, estimate, exit_layer=e, why=why)
        )
    return [*_quality_cells(rows, task, model), *agreement, *_speculation_cells(rows, model)]


def compare_cells(results: Results, task: str) -> list[CompareCell]:
    """plain vs layerskip (vs calm) on one task; models without results are left out."""
    models = [m for m in COMPARE_MODELS if any((r.task, r.model) == (task, m) for r in results.evals)]
    exit_layers = sorted(
        {
            r.exit_layer
            for r in results.evals
            if r.task == task and r.model in models and r.family in ("early_exit", "self_speculative") and r.exit_layer
        }
    )
    cells = [cell for model in models for cell in _model_cells(results, task, model, exit_layers)]
    return sorted(cells, key=lambda c: (c.order, COMPARE_MODELS.index(c.model)))


def compare_table(cells: list[CompareCell]) -> list[str]:
    models = [m for m in COMPARE_MODELS if any(c.model == m for c in cells)]
    labels = list(dict.fromkeys(c.label for c in cells))
    by_key = {(c.label, c.model): c for c in cells}
    body = []
    for label in labels:
        row = [label]
        for model in models:
            cell = by_key.get((label, model))
            text = "–" if cell is None else fmt_estimate(cell.estimate, cell.kind)
            row.append(f"– ({cell.why})" if cell is not None and cell.estimate.value is None and cell.why else text)
        body.append(row)
    return markdown_table(["", *[f"`{m}`" for m in models]], body, "l" + "r" * len(models))


def compare_section(results: Results) -> list[str]:
    lines = ["## plain vs layerskip (vs calm): what the early-exit recipe changes", ""]
    tasks = [t for t in results.eval_tasks() if any(r.task == t and r.model in COMPARE_MODELS for r in results.evals)]
    if not tasks:
        return [*lines, NOT_RUN, ""]
    lines += [CONTROL_SENTENCE, ""]
    if not any(r.model == CONTROL for r in results.evals):
        lines += [
            f"_`{CONTROL}` has no results in this run, so these tables cannot separate the recipe's effect "
            "from the finetune's._",
            "",
        ]
    lines += [
        "Brackets: 95% bootstrap intervals over samples, n = samples; the fraction of the last layer's "
        "quality is paired per sample with greedy (results without stored pairs: the ends of the two "
        "intervals divided, a conservative interval of at least 90%, marked so). "
        "Agreement: the probe's top-1 agreement with the last layer "
        "through the shared head (`results/probe/`), pooled over positions, so without an interval. "
        "Acceptance and speed-up: self-speculation at the evaluated (E, d).",
        "",
    ]
    for task in tasks:
        lines += [f"### {task}", "", *compare_table(compare_cells(results, task)), ""]
    return lines


def compare_rows(results: Results) -> list[dict[str, Any]]:
    """``tables/compare.csv``: one row per comparison cell (long form)."""
    rows = []
    for task in results.eval_tasks():
        for c in compare_cells(results, task):
            interval = c.estimate.interval
            rows.append(
                {
                    "task": task,
                    "quantity": c.quantity,
                    "label": c.label,
                    "model": c.model,
                    "metric": c.metric or None,
                    "exit_layer": c.exit_layer,
                    "num_speculations": c.num_speculations,
                    "estimate": c.estimate.value,
                    "low": c.estimate.low,
                    "high": c.estimate.high,
                    "n": c.estimate.n,
                    "confidence": interval.confidence if interval else None,
                    "interval_method": interval.method if interval else None,
                    "detail": c.estimate.detail.strip() or None,
                    "why_missing": c.why or None,
                }
            )
    return rows


def probe_layers(num_layers: int, length: int) -> list[int]:
    """Indices into a per-layer curve at about a quarter, half, three quarters and the end of the stack."""
    picks = {max(0, round(length * f) - 1) for f in (0.25, 0.5, 0.75)} | {length - 1}
    return sorted(picks)


def layer_label(index: int, length: int, num_layers: int) -> str:
    """Curves with one value per layer are labelled 1..L; with an extra embedding entry, 0..L."""
    return f"layer {index + 1 if length == num_layers else index}"


def probe_section(results: Results) -> list[str]:
    lines = ["## Readability of intermediate layers (logit-lens probe)", ""]
    if not results.probes:
        return [*lines, NOT_RUN, ""]
    lines += [
        "Agreement = fraction of positions where exiting after that layer (shared LM head) predicts the same "
        "token as the last layer. Base vs trained shows what the early-exit recipe changes.",
        "",
    ]
    for probe in results.probes:
        lines.append(provenance_line(probe.provenance, f"`{probe.source_file}` · {probe.num_layers} layers"))
    lines.append("")
    length = len(next(iter(results.probes[0].texts.values())).agreement)
    picks = probe_layers(results.probes[0].num_layers, length)
    header = ["text", "model", *[layer_label(i, length, results.probes[0].num_layers) for i in picks]]
    body = []
    for kind in sorted({k for p in results.probes for k in p.texts}):
        for probe in results.probes:
            curve = probe.texts.get(kind)
            if curve is None:
                continue
            body.append(
                [kind, probe.model, *[fmt(curve.agreement[i], 2) if i < len(curve.agreement) else "–" for i in picks]]
            )
    return [*lines, *markdown_table(header, body, "ll" + "r" * len(picks)), ""]


def threshold_cell(row: CalibrationRow) -> str:
    """The calibrated λ, or the uncertified fallback λ = 1 (never exit early, CALM §4)."""
    return "fallback λ=1" if row.certified is False else fmt(row.threshold, 2)


def certified_cell(row: CalibrationRow) -> str:
    """yes / no, and why no candidate could pass when the calibration set is too small for δ."""
    if row.certified is None:
        return "–"
    if row.certified:
        return "yes"
    too_few = (
        row.num_calibration is not None
        and row.min_num_calibration is not None
        and row.num_calibration < row.min_num_calibration
    )
    return f"no (n={row.num_calibration} < {row.min_num_calibration})" if too_few else "no"


def risk_ok_cell(row: CalibrationRow) -> str:
    return "–" if row.risk_ok is None else "yes" if row.risk_ok else "**no: violation**"


def quality_cell(row: CalibrationRow) -> str:
    if row.quality_calm is None and row.quality_greedy is None:
        return fmt(row.quality_vs_greedy)
    return f"{fmt(row.quality_calm)} / {fmt(row.quality_greedy)}"


def calibration_table(rows: list[tuple[str, CalibrationRow]]) -> list[str]:
    """One task's rows (model, row) sorted by model, δ, KV strategy, measure."""
    metrics = sorted({r.quality_metric for _, r in rows if r.quality_metric})
    quality = f"quality calm / greedy ({', '.join(metrics)})" if metrics else "quality calm / greedy"
    def speedup(r: CalibrationRow) -> str:
        if r.speedup_vs_greedy is None or not too_few_timed(r.num_test):
            return fmt_x(r.speedup_vs_greedy)
        return f"({fmt_x(r.speedup_vs_greedy)}, n={r.num_test} < {MIN_SPEED_PROMPTS}: not quoted)"

    columns: list[Column[tuple[str, CalibrationRow]]] = [
        Column("model", None, lambda mr: mr[0], align="l"),
        Column("δ", None, lambda mr: mr[1].delta, digits=2),
        Column("KV", None, lambda mr: mr[1].kv_strategy, align="l"),
        Column("measure", None, lambda mr: mr[1].measure, align="l"),
        Column("threshold", None, lambda mr: threshold_cell(mr[1]), align="l"),
        Column("certified", None, lambda mr: certified_cell(mr[1]), align="l"),
        Column("cal. risk", None, lambda mr: mr[1].calibration_risk),
        Column("test risk", None, lambda mr: mr[1].test_risk),
        Column("test risk ≤ δ", None, lambda mr: risk_ok_cell(mr[1]), align="l"),
        Column("avg exit layer", None, lambda mr: mr[1].avg_exit_layer, digits=1),
        Column("speed-up", None, lambda mr: speedup(mr[1])),
        Column(quality, None, lambda mr: quality_cell(mr[1])),
    ]
    return markdown(columns, sorted(rows, key=lambda mr: (mr[0], mr[1].delta, mr[1].kv_strategy, mr[1].measure)))


def calibration_section(results: Results) -> list[str]:
    """CALM's calibrated thresholds: per task, one row per (model, δ, KV strategy, measure)."""
    lines = ["## CALM threshold calibration", ""]
    if not results.calibrations:
        return [*lines, NOT_RUN, ""]
    rows = [(cal.model, r) for cal in results.calibrations for r in cal.rows]
    measures = sorted({cal.speedup_measures for cal in results.calibrations if cal.speedup_measures})
    violations = sum(r.risk_ok is False for _, r in rows)
    lines += [
        "Threshold calibrated with Learn-then-Test so that the risk is at most δ with probability 1 − ε "
        "(CALM §4); when no candidate is certified the threshold falls back to λ = 1 (the full model). "
        "Test risk is measured on held-out prompts; a test risk above δ is shown as a violation "
        f"({violations} of {len(rows)} rows).",
        "",
    ]
    lines += [f"Speed-up: {m}." for m in measures] + ([""] if measures else [])
    lines += [provenance_line(cal.provenance, f"`{cal.source_file}`") for cal in results.calibrations]
    for task in sorted({r.task for _, r in rows}):
        lines += ["", f"### {task}", "", *calibration_table([(m, r) for m, r in rows if r.task == task])]
    return [*lines, ""]


TRAIN_KEYS = ("p_max", "e_scale", "curriculum", "rotation", "lr", "batch_size", "steps")


def fmt_g(value: Any) -> str:
    """Like :func:`fmt`, with floats in 4 significant digits (learning rates, losses)."""
    return f"{value:.4g}" if isinstance(value, float) else fmt(value)


def _scalars(data: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if k != "variant" and (isinstance(v, str | int | float | bool) or v is None)}


def _train_value(data: dict[str, Any], key: str) -> Any:
    """A hyper-parameter from a training report: top level first (e.g. steps done), then its ``config``."""
    if key in data:
        return data[key]
    config = data.get("config")
    return config.get(key) if isinstance(config, dict) else None


def training_section(results: Results, papers: tuple[Paper, ...]) -> list[str]:
    lines = ["## Training", ""]
    if not results.trains:
        return [*lines, NOT_RUN, ""]
    keys: list[str] = []
    for report in results.trains:
        keys += [k for k in _scalars(report.data) if k not in keys]
    body = [[report.variant, *[fmt_g(_scalars(report.data).get(k)) for k in keys]] for report in results.trains]
    lines += [*markdown_table(["variant", *keys], body), ""]
    for report in results.trains:
        recipes = [(p, t) for p in papers for t in p.training if t.exitbench_variant == report.variant]
        for paper, recipe in recipes:
            rows = []
            for key in TRAIN_KEYS:
                paper_key = "early_exit_curriculum" if key == "curriculum" else key
                paper_value = getattr(recipe, paper_key, None)
                ours = _train_value(report.data, key)
                if paper_value is None and ours is None:
                    continue
                rows.append([key, fmt_g(ours), fmt_g(paper_value)])
            if rows:
                lines += [
                    f"`{report.variant}` vs {paper.id} recipe `{recipe.id}` ({recipe.source}):",
                    "",
                    *markdown_table(["hyper-parameter", "ours", "paper"], rows),
                    "",
                ]
    return lines


def _data(header: str, path: str, digits: int = 3) -> Column[TrainReport]:
    """A column of the number at ``a`` or ``a/b`` in a training report's data."""
    first, _, second = path.partition("/")

    def get(report: TrainReport) -> Any:
        value = report.data.get(first)
        return value.get(second) if second and isinstance(value, dict) else value

    return Column(header, None, get, digits=digits)


def _span(report: TrainReport) -> str:
    layers = report.data.get("routed_layers") or []
    return f"{layers[0]}..{layers[-1]}" if layers else "–"


_VARIANT: Column[TrainReport] = Column("model", None, lambda r: r.variant, align="l")
#: each add-on stage's report folder: (title, columns)
ADDON_TABLES: dict[str, tuple[str, list[Column[TrainReport]]]] = {
    "adapters": (
        "Kangaroo adapters (`train_adapters`): held-out top-1 agreement with the full model, and KL, of the adapter "
        "before and after training beside plain early exit at the same layer (its control)",
        [_VARIANT, _data("E", "exit_layer"), _data("steps", "steps"), _data("seconds", "seconds", 0),
         _data("positions", "held_out_positions"), _data("agree: early exit", "agreement/early_exit"),
         _data("adapter untrained", "agreement/adapter_untrained"),
         _data("adapter trained", "agreement/adapter_trained"), _data("KL: early exit", "kl/early_exit", 2),
         _data("adapter trained", "kl/adapter_trained", 2)],
    ),
    "routers": (
        "MindSkip routers (`train_routers`): on held-out text, the share of routed attention run (capacity), top-1 "
        "agreement with the full model and KL, beside the static control (the most-skipped layers, every input); "
        "routed on: the positions each router decides from (prompt: as at decoding)",
        [_VARIANT, Column("granularity", None, lambda r: r.data.get("granularity"), align="l"),
         Column("routed", None, _span, align="l"),
         Column("routed on", None, lambda r: r.data.get("routing_context") or "–", align="l"),
         _data("target", "target_capacity", 2), _data("steps", "steps"), _data("seconds", "seconds", 0),
         _data("positions", "held_out_positions"), _data("capacity", "routed/capacity", 2),
         _data("agreement", "routed/agreement"), _data("KL", "routed/kl", 2),
         _data("static skip", "static_control/skip"), _data("static agreement", "static_control/agreement"),
         _data("static KL", "static_control/kl", 2)],
    ),
}  # fmt: skip


def addons_section(results: Results) -> list[str]:
    """The add-ons trained on frozen models (adapters, routers): one table per stage, from their reports."""
    if not results.addons:
        return []
    lines = ["## Trained add-ons", ""]
    for folder, reports in results.addons.items():
        title, columns = ADDON_TABLES[folder]
        lines += [f"{title}:", "", *markdown(columns, reports), ""]
    return lines


def _shape_key(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def prediction_rows(results: Results, papers: tuple[Paper, ...]) -> list[dict[str, Any]]:
    """The cost model's prediction for each paper row whose model shape it measured (§4.3 cost model)."""
    rows = []
    for cost in results.cost_models:
        shapes = {_shape_key(name): (name, shape) for name, shape in cost.shapes.items()}
        for paper in papers:
            for row in paper.rows:
                s, r = row.setting, row.reported
                if None in (s.shape, s.exit_layer, s.num_speculations, r.acceptance, r.speedup):
                    continue
                found = shapes.get(_shape_key(s.shape or ""))
                if found is None:
                    continue
                name, shape = found
                c_draft = shape.c_draft.get(s.exit_layer or 0)
                c_verify = shape.verify(s.exit_layer or 0, s.num_speculations or 0)
                if c_draft is None or c_verify is None:
                    continue
                try:
                    predicted = predict_speedup(r.acceptance or 0.0, s.num_speculations or 1, c_draft, c_verify)
                except ExitbenchError as err:
                    raise ExitbenchError(f"{cost.source_file}: shape '{name}': {err}") from None
                rows.append(
                    {
                        "row": row.id,
                        "shape": name,
                        "cost_model": cost.source_file,
                        "device": cost.device,
                        "dtype": cost.dtype,
                        "exit_layer": s.exit_layer,
                        "num_speculations": s.num_speculations,
                        "acceptance": r.acceptance,
                        "c_draft": c_draft,
                        "c_verify": c_verify,
                        "predicted_speedup": round(predicted["predicted_speedup"], 4),
                        "reported_speedup": r.speedup,
                        "reported_over_predicted": round((r.speedup or 0.0) / predicted["predicted_speedup"], 4),
                    }
                )
    return rows


def prediction_section(results: Results, papers: tuple[Paper, ...]) -> list[str]:
    lines = ["## Predicted vs reported speed-up (cost model)", ""]
    if not results.cost_models:
        return [*lines, NOT_RUN, ""]
    rows = prediction_rows(results, papers)
    lines += [
        "The paper's acceptance rate and (E, d), with draft/verify costs measured here for the same model "
        "shape, give an ideal speed-up (Leviathan et al. 2023, Thm 3.8, with LayerSkip's §4.3 verify cost). "
        "Costs come from our hardware, not the paper's.",
        "",
    ]
    if not rows:
        return [
            *lines,
            "_No paper row matches a measured shape (set `shape:` in replications/*.yaml to a cost_model shape name)._",
            "",
        ]
    return [*lines, *markdown(PREDICTION_COLUMNS, rows), ""]


def _key(name: str) -> Callable[[dict[str, Any]], Any]:
    return lambda row: row[name]


# tables/predicted_vs_reported.csv (the fields) and the README table (the headers)
PREDICTION_COLUMNS: list[Column[dict[str, Any]]] = [
    Column("paper row", "row", _key("row"), align="l"),
    Column("shape", "shape", _key("shape"), align="l"),
    Column(None, "cost_model", _key("cost_model")),
    Column(None, "device", _key("device")),
    Column(None, "dtype", _key("dtype")),
    Column("measured on", None, lambda r: f"{r['device']} {r['dtype']}", align="l"),
    Column(None, "exit_layer", _key("exit_layer")),
    Column(None, "num_speculations", _key("num_speculations")),
    Column("config", None, lambda r: f"E{r['exit_layer']} d{r['num_speculations']}", align="l"),
    Column("acceptance", "acceptance", _key("acceptance"), "pct"),
    Column("c_draft", "c_draft", _key("c_draft")),
    Column("c_verify", "c_verify", _key("c_verify")),
    Column("predicted", "predicted_speedup", _key("predicted_speedup"), "x"),
    Column("reported", "reported_speedup", _key("reported_speedup"), "x"),
    Column("reported / predicted", "reported_over_predicted", _key("reported_over_predicted"), digits=2),
]


def plots_section(plot_files: list[Path], out_dir: Path) -> list[str]:
    lines = ["## Plots", ""]
    pngs = [p for p in plot_files if p.suffix == ".png"]
    if not pngs:
        return [*lines, "_No plots (no plottable results)._", ""]
    for path in pngs:
        rel = path.relative_to(out_dir).as_posix() if path.is_relative_to(out_dir) else path.as_posix()
        title = path.stem.replace("_", " ")
        lines += [f"![{title}]({rel})", ""]
    return lines


def render_readme(
    results: Results, papers: tuple[Paper, ...], profile: str, plot_files: list[Path], out_dir: Path
) -> str:
    commits = sorted({r.provenance.short_commit for r in results.evals})
    lines = [
        "# exitbench results",
        "",
        f"Generated by `pipelines/report.py` from the result files under `{results.root.name}/` (profile "
        f"`{profile}`; result commits: {', '.join(f'`{c}`' for c in commits) or '–'}). Do not edit: re-run "
        "`dvc repro report`.",
        "",
        "Comparison with the papers, figure by figure: [`check.md`](check.md). Machine-readable: `metrics.json`, "
        "`tables/*.csv`.",
        "",
        *best_section(results),
        *compare_section(results),
        *eval_section(results, papers, profile),
        *sweep_section(results),
        *probe_section(results),
        *calibration_section(results),
        *training_section(results, papers),
        *addons_section(results),
        *throughput_section(results.throughput),
        *prediction_section(results, papers),
        *plots_section(plot_files, out_dir),
    ]
    return "\n".join(lines).rstrip() + "\n"


# ------------------------------------------------------------------------------------------ CSV + metrics


def eval_rows(results: Results) -> list[dict[str, Any]]:
    """``tables/eval.csv``: every number with ``_low``, ``_high`` (95% interval, empty if not stored) and ``_n``."""
    metrics = sorted({k for r in results.evals for k in r.scalar_quality()})
    return csv_rows(eval_columns(metrics, results.evals), results.evals)


def per_domain_rows(results: Results) -> list[dict[str, Any]]:
    """``tables/per_domain.csv``: TOPv2 exact match per (model, method, domain) with interval and n."""
    rows = []
    for r in sorted(results.evals, key=lambda r: (r.task, r.model, result_key(r))):
        for domain in domains_of([r, quality_source(r, results.evals)]):
            estimate = quality_estimate(r, f"per_domain/{domain}", results.evals)
            rows.append(
                {
                    "model": r.model,
                    "task": r.task,
                    "method": r.method,
                    "domain": domain,
                    **estimate_columns("exact_match", estimate),
                }
            )
    return rows


def probe_rows(results: Results) -> list[dict[str, Any]]:
    rows = []
    for probe in results.probes:
        for kind, curve in sorted(probe.texts.items()):
            for i, agreement in enumerate(curve.agreement):
                rows.append(
                    {
                        "model": probe.model,
                        "text": kind,
                        "layer": i + 1 if len(curve.agreement) == probe.num_layers else i,
                        "agreement": agreement,
                        "median_rank": curve.median_rank[i] if curve.median_rank else None,
                        "confidence": curve.confidence[i] if curve.confidence else None,
                    }
                )
    return rows


def calibration_rows(results: Results) -> list[dict[str, Any]]:
    return [{"model": cal.model, **r.model_dump()} for cal in results.calibrations for r in cal.rows]


def paper_rows(papers: tuple[Paper, ...]) -> list[dict[str, Any]]:
    rows = []
    for paper in papers:
        for row in paper.rows:
            value = row.paper_speedup
            rows.append(
                {
                    "paper": paper.id,
                    "row": row.id,
                    "table": row.source.table,
                    "model": row.setting.model,
                    "hardware": row.setting.hardware,
                    "task": row.maps_to.task,
                    "method": row.maps_to.method,
                    "exit_layer": row.setting.exit_layer,
                    "num_speculations": row.setting.num_speculations,
                    "speedup": value[0] if value else None,
                    "speedup_derived": value[1] if value else None,
                    "acceptance": row.reported.acceptance,
                    "quality_metric": row.setting.metric,
                    "quality": row.reported.quality.get(row.setting.metric),
                    "headline": row.headline,
                    "unverified": row.unverified,
                }
            )
    return rows


def _metric_entry(name: str, estimate: Estimate) -> dict[str, Any]:
    """``name``, plus ``name_low``/``name_high`` when an interval is stored, and ``name_n``."""
    entry: dict[str, Any] = {name: rounded(estimate.value)}
    if estimate.interval is not None:
        entry.update({f"{name}_low": rounded(estimate.low), f"{name}_high": rounded(estimate.high)})
    return {**entry, f"{name}_n": estimate.n}


def metrics(results: Results) -> dict[str, Any]:
    """Headline numbers for ``dvc metrics show``: keys like ``eval/<model>/<task>/<method>``, each number with
    its 95% interval (``_low``, ``_high``) where the result stores one and its sample size (``_n``)."""
    out: dict[str, Any] = {"eval": {}, "sweep": {}, "calibrate": {}}
    for r in results.evals:
        primary = r.primary
        entry = {
            **_metric_entry("speedup", speed_estimate(r, "speedup_vs_greedy")),
            "ms_per_token": rounded(r.speed.time_per_token_ms),
            **_metric_entry("acceptance", speed_estimate(r, "acceptance_rate")),
        }
        quality = quality_estimate(r, primary, results.evals) if primary else Estimate(None)
        if quality.value is not None:
            entry.update(_metric_entry(primary or "", quality))
        if r.correctness.mismatch_rate is not None:
            entry.update(_metric_entry("mismatch_rate", speed_estimate(r, "mismatch_rate")))
        out["eval"][f"{r.model}/{r.task}/{r.method}"] = entry
    if results.sweep is not None:
        for model, dtype in sorted({(r.model, r.dtype) for r in results.sweep.rows}):
            best = best_sweep_row(r for r in results.sweep.rows if (r.model, r.dtype) == (model, dtype))
            if best is not None:
                out["sweep"][f"{model}/{dtype}"] = {
                    **_metric_entry("best_speedup", sweep_estimate(best, "speedup_vs_greedy")),
                    "best_exit_layer": best.exit_layer,
                    "best_num_speculations": best.num_speculations,
                    **_metric_entry("best_acceptance", sweep_estimate(best, "acceptance_rate")),
                }
    for cal in results.calibrations:
        for r in cal.rows:
            key = f"{cal.model}/{r.task}/{r.measure}/{r.kv_strategy}/delta={r.delta:g}"
            out["calibrate"][key] = {"speedup": r.speedup_vs_greedy, "test_risk": r.test_risk}
    return {k: v for k, v in out.items() if v}


def write_text_outputs(
    results: Results, papers: tuple[Paper, ...], out_dir: str | Path, profile: str, plot_files: list[Path]
) -> list[Path]:
    """README.md, tables/*.csv and metrics.json under ``out_dir``; returns the paths written."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    readme = out_dir / "README.md"
    readme.write_text(render_readme(results, papers, profile, plot_files, out_dir))
    written.append(readme)
    tables = out_dir / "tables"
    candidates = {
        "eval.csv": eval_rows(results),
        "per_domain.csv": per_domain_rows(results),
        "compare.csv": compare_rows(results),
        "sweep.csv": [r.model_dump() for r in results.sweep.rows] if results.sweep else [],
        "probe.csv": probe_rows(results),
        "calibrate.csv": calibration_rows(results),
        "predicted_vs_reported.csv": csv_rows(PREDICTION_COLUMNS, prediction_rows(results, papers)),
        "paper_rows.csv": paper_rows(papers),
        "throughput.csv": table_rows(results.throughput) if results.throughput else [],
    }
    written += [write_csv(tables / name, rows) for name, rows in candidates.items() if rows]
    metrics_path = out_dir / "metrics.json"
    metrics_path.write_text(json.dumps(metrics(results), indent=2) + "\n")
    written.append(metrics_path)
    return written
