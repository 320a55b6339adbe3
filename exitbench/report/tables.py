"""The report's text outputs: ``results/README.md``, ``results/tables/*.csv`` and ``results/metrics.json``.

Everything here is built from validated result files (:mod:`exitbench.report.results`) and the
replication rows; nothing is measured. Missing optional stages are reported as "not run".
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from exitbench.cost_model import predict_speedup
from exitbench.errors import ExitbenchError
from exitbench.replications import Paper
from exitbench.report.results import CalibrationRow, EvalResult, Provenance, Results

PRIMARY_METRIC = {"cnndm": "rouge2", "xsum": "rouge2", "humaneval": "pass@1", "mbpp": "pass@1", "topv2": "exact_match"}
METHOD_ORDER = ("autoregressive", "early_exit", "self_speculative", "hf_early_exit", "speculative", "calm")
NOT_RUN = "_not run in this profile (no result files)._"


# ------------------------------------------------------------------------------------------ formatting


def fmt(value: Any, digits: int = 3) -> str:
    """A table cell: numbers rounded, None as an en dash."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def fmt_x(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}x"


def fmt_pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}%"


def markdown_table(header: list[str], rows: Iterable[list[str]], align: str = "") -> list[str]:
    """Markdown table lines; ``align`` is one character per column: 'l' or 'r' (default 'l')."""
    aligns = [("---:" if a == "r" else "---") for a in align.ljust(len(header), "l")]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(aligns) + " |"]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return lines


def provenance_line(prov: Provenance, extra: str = "") -> str:
    threads = f"{prov.threads} threads" if prov.threads else "threads ?"
    parts = [prov.device, threads, f"commit `{prov.short_commit}`", prov.date, f"`{prov.command}`"]
    return " · ".join(p for p in [extra, *parts] if p)


def method_key(method: str) -> tuple[int, str]:
    return (METHOD_ORDER.index(method) if method in METHOD_ORDER else len(METHOD_ORDER), method)


def quality_metrics(results: list[EvalResult]) -> list[str]:
    """Scalar quality metrics present for a task, its primary metric first."""
    names = sorted({name for r in results for name in r.scalar_quality()})
    primary = PRIMARY_METRIC.get(results[0].task) if results else None
    return ([primary] if primary in names else []) + [n for n in names if n != primary]


def exactness(result: EvalResult) -> str:
    c = result.correctness
    if c.num_mismatched is None:
        return "claimed" if c.exact_claimed else "lossy"
    compared = c.num_compared if c.num_compared is not None else result.num_samples - result.num_failed
    if c.exact_claimed:
        if c.num_mismatched == 0:
            return f"exact ({compared}/{compared})"
        return f"**NOT exact: {c.num_mismatched}/{compared} differ**"
    where = f", 1st divergence ~{c.first_divergence_mean:.0f}" if c.first_divergence_mean is not None else ""
    return f"lossy: {c.num_mismatched}/{compared} differ{where}"


def options_text(options: dict[str, Any]) -> str:
    short = {"exit_layer": "E", "num_speculations": "d"}
    return " ".join(f"{short.get(k, k)}={v}" for k, v in sorted(options.items())) or "–"


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


def eval_section(results: Results, papers: tuple[Paper, ...], profile: str) -> list[str]:
    lines = ["## Quality, speed and exactness per task", ""]
    if not results.evals:
        return [*lines, NOT_RUN, ""]
    lines += [
        "Speed-up is greedy decoding's time per token over the method's, on the same checkpoint and prompts. "
        "Acceptance = accepted drafts / drafted tokens. Tokens/round = generated tokens (the first one, from the "
        "prefill, included) per draft-verify round, so very short outputs push it above 1 + accepted per round. "
        "Ideal fraction = measured speed-up / the cost model's ideal. "
        "Exactness compares each output token for token with greedy decoding.",
        "",
    ]
    for task in results.eval_tasks():
        lines += [f"### {task}", ""]
        for model in results.eval_models():
            rows = sorted((r for r in results.evals if r.task == task and r.model == model),
                          key=lambda r: method_key(r.method))
            if not rows:
                continue
            first = rows[0]
            commits = sorted({r.provenance.short_commit for r in rows})
            extra = f"model `{model}` · {first.dtype} · {first.num_samples} samples"
            lines.append(provenance_line(first.provenance, extra))
            if len(commits) > 1:
                lines.append(f"(methods measured at different commits: {', '.join(commits)})")
            lines.append("")
            metrics = quality_metrics(rows)
            header = ["method", "options", *metrics, "ms/token", "speed-up", "acceptance", "tokens/round",
                      "ideal fraction", "failed", "exactness"]
            body = [
                [r.method, options_text(r.options), *[fmt(r.scalar_quality().get(m)) for m in metrics],
                 fmt(r.speed.time_per_token_ms, 2), fmt_x(r.speed.speedup_vs_greedy), fmt_pct(r.speed.acceptance_rate),
                 fmt(r.speed.tokens_per_round, 2), fmt(r.speed.ideal_fraction, 2), str(r.num_failed), exactness(r)]
                for r in rows
            ]
            lines += markdown_table(header, body, "ll" + "r" * (len(metrics) + 6) + "l")
            lines += ["", *per_domain_table(rows)]
        references = paper_lines(papers, task, {r.method for r in results.evals if r.task == task})
        if references:
            lines += ["Paper figures for this task (different models and hardware; see `check.md`):", "",
                      *references, ""]
    lines += [f"Reproduce: `python pipelines/use_profile.py {profile} && dvc repro` (the profile and the code "
              "at the commits above).", ""]
    return lines


def per_domain_table(rows: list[EvalResult]) -> list[str]:
    """TOPv2's per-domain exact match, when the results carry it."""
    per = [r.quality["per_domain"] for r in rows if isinstance(r.quality.get("per_domain"), dict)]
    domains = sorted({d for p in per for d in p})
    if not domains:
        return []
    body = []
    for r in rows:
        per = r.quality.get("per_domain") if isinstance(r.quality.get("per_domain"), dict) else {}
        body.append([r.method, *[fmt(per.get(d)) for d in domains]])
    return ["Per-domain exact match:", "", *markdown_table(["method", *domains], body, "l" + "r" * len(domains)), ""]


def sweep_section(results: Results) -> list[str]:
    lines = ["## Decoding sweep over exit layer E and speculations d", ""]
    sweep = results.sweep
    if sweep is None:
        return [*lines, NOT_RUN, ""]
    first = sweep.rows[0] if sweep.rows else None
    setup = f"{first.num_prompts} prompts, {first.max_new_tokens} new tokens" if first else "no rows"
    lines += [provenance_line(sweep.provenance, f"`{sweep.source_file}` · {setup}"), ""]
    for model_dtype in sorted({(r.model, r.dtype) for r in sweep.rows}):
        candidates = [r for r in sweep.rows if (r.model, r.dtype) == model_dtype and r.speedup_vs_greedy
                      and r.method != "autoregressive"]
        if candidates:
            best = max(candidates, key=lambda r: r.speedup_vs_greedy or 0.0)
            lines.append(f"- best for `{model_dtype[0]}` ({model_dtype[1]}): {best.method} E={fmt(best.exit_layer)} "
                         f"d={fmt(best.num_speculations)} → **{fmt_x(best.speedup_vs_greedy)}**")
    lines.append("")
    header = ["model", "dtype", "method", "E", "d", "ms/token", "IQR ms", "speed-up", "acceptance", "tokens/round",
              "c_draft", "c_verify", "ideal", "ideal fraction", "exact"]
    rows = sorted(sweep.rows, key=lambda r: (r.model, r.dtype, method_key(r.method), r.exit_layer or 0,
                                             r.num_speculations or 0))
    body = [
        [r.model, r.dtype, r.method, fmt(r.exit_layer), fmt(r.num_speculations), fmt(r.time_per_token_ms, 2),
         fmt(r.iqr_ms, 2), fmt_x(r.speedup_vs_greedy), fmt_pct(r.acceptance_rate), fmt(r.tokens_per_round, 2),
         fmt(r.c_draft), fmt(r.c_verify), fmt_x(r.ideal_speedup), fmt(r.ideal_fraction, 2),
         fmt(r.exact) if r.num_mismatched in (None, 0) else f"no ({r.num_mismatched})"]
        for r in rows
    ]
    return [*lines, *markdown_table(header, body, "lllrrrrrrrrrrrl"), ""]


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
    lines += ["Agreement = fraction of positions where exiting after that layer (shared LM head) predicts the same "
              "token as the last layer. Base vs trained shows what the early-exit recipe changes.", ""]
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
            body.append([kind, probe.model, *[fmt(curve.agreement[i], 2) if i < len(curve.agreement) else "–"
                                              for i in picks]])
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
    too_few = row.num_calibration is not None and row.min_num_calibration is not None \
        and row.num_calibration < row.min_num_calibration
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
    header = ["model", "δ", "KV", "measure", "threshold", "certified", "cal. risk", "test risk", "test risk ≤ δ",
              "avg exit layer", "speed-up", quality]
    body = [[model, fmt(r.delta, 2), r.kv_strategy, r.measure, threshold_cell(r), certified_cell(r),
             fmt(r.calibration_risk), fmt(r.test_risk), risk_ok_cell(r), fmt(r.avg_exit_layer, 1),
             fmt_x(r.speedup_vs_greedy), quality_cell(r)]
            for model, r in sorted(rows, key=lambda mr: (mr[0], mr[1].delta, mr[1].kv_strategy, mr[1].measure))]
    return markdown_table(header, body, "lrllllrrlrrr")


def calibration_section(results: Results) -> list[str]:
    """CALM's calibrated thresholds: per task, one row per (model, δ, KV strategy, measure)."""
    lines = ["## CALM threshold calibration", ""]
    if not results.calibrations:
        return [*lines, NOT_RUN, ""]
    rows = [(cal.model, r) for cal in results.calibrations for r in cal.rows]
    measures = sorted({cal.speedup_measures for cal in results.calibrations if cal.speedup_measures})
    violations = sum(r.risk_ok is False for _, r in rows)
    lines += ["Threshold calibrated with Learn-then-Test so that the risk is at most δ with probability 1 − ε "
              "(CALM §4); when no candidate is certified the threshold falls back to λ = 1 (the full model). "
              "Test risk is measured on held-out prompts; a test risk above δ is shown as a violation "
              f"({violations} of {len(rows)} rows).", ""]
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
    return {k: v for k, v in data.items()
            if k != "variant" and (isinstance(v, str | int | float | bool) or v is None)}


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
                lines += [f"`{report.variant}` vs {paper.id} recipe `{recipe.id}` ({recipe.source}):", "",
                          *markdown_table(["hyper-parameter", "ours", "paper"], rows), ""]
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
                rows.append({
                    "row": row.id, "shape": name, "cost_model": cost.source_file, "device": cost.device,
                    "dtype": cost.dtype, "exit_layer": s.exit_layer, "num_speculations": s.num_speculations,
                    "acceptance": r.acceptance, "c_draft": c_draft, "c_verify": c_verify,
                    "predicted_speedup": round(predicted["predicted_speedup"], 4), "reported_speedup": r.speedup,
                    "reported_over_predicted": round((r.speedup or 0.0) / predicted["predicted_speedup"], 4),
                })
    return rows


def prediction_section(results: Results, papers: tuple[Paper, ...]) -> list[str]:
    lines = ["## Predicted vs reported speed-up (cost model)", ""]
    if not results.cost_models:
        return [*lines, NOT_RUN, ""]
    rows = prediction_rows(results, papers)
    lines += ["The paper's acceptance rate and (E, d), with draft/verify costs measured here for the same model "
              "shape, give an ideal speed-up (Leviathan et al. 2023, Thm 3.8, with LayerSkip's §4.3 verify cost). "
              "Costs come from our hardware, not the paper's.", ""]
    if not rows:
        return [*lines, "_No paper row matches a measured shape (set `shape:` in replications/*.yaml to a "
                        "cost_model shape name)._", ""]
    body = [[r["row"], r["shape"], f"{r['device']} {r['dtype']}", f"E{r['exit_layer']} d{r['num_speculations']}",
             fmt_pct(r["acceptance"]), fmt(r["c_draft"]), fmt(r["c_verify"]), fmt_x(r["predicted_speedup"]),
             fmt_x(r["reported_speedup"]), fmt(r["reported_over_predicted"], 2)] for r in rows]
    header = ["paper row", "shape", "measured on", "config", "acceptance", "c_draft", "c_verify", "predicted",
              "reported", "reported / predicted"]
    return [*lines, *markdown_table(header, body, "llllrrrrrr"), ""]


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
        *eval_section(results, papers, profile),
        *sweep_section(results),
        *probe_section(results),
        *calibration_section(results),
        *training_section(results, papers),
        *prediction_section(results, papers),
        *plots_section(plot_files, out_dir),
    ]
    return "\n".join(lines).rstrip() + "\n"


# ------------------------------------------------------------------------------------------ CSV + metrics


def eval_rows(results: Results) -> list[dict[str, Any]]:
    metric_names = sorted({k for r in results.evals for k in r.scalar_quality()})
    rows = []
    for r in results.evals:
        rows.append({
            "model": r.model, "task": r.task, "method": r.method, "options": options_text(r.options), "dtype": r.dtype,
            "num_samples": r.num_samples, "num_failed": r.num_failed,
            **{f"quality_{k}": r.scalar_quality().get(k) for k in metric_names},
            "time_per_token_ms": r.speed.time_per_token_ms, "speedup_vs_greedy": r.speed.speedup_vs_greedy,
            "acceptance_rate": r.speed.acceptance_rate, "tokens_per_round": r.speed.tokens_per_round,
            "ideal_fraction": r.speed.ideal_fraction, "exact_claimed": r.correctness.exact_claimed,
            "num_mismatched": r.correctness.num_mismatched, "device": r.provenance.device,
            "threads": r.provenance.threads, "git_commit": r.provenance.git_commit, "date": r.provenance.date,
        })
    return rows


def probe_rows(results: Results) -> list[dict[str, Any]]:
    rows = []
    for probe in results.probes:
        for kind, curve in sorted(probe.texts.items()):
            for i, agreement in enumerate(curve.agreement):
                rows.append({
                    "model": probe.model, "text": kind, "layer": i + 1 if len(curve.agreement) == probe.num_layers
                    else i, "agreement": agreement,
                    "median_rank": curve.median_rank[i] if curve.median_rank else None,
                    "confidence": curve.confidence[i] if curve.confidence else None,
                })
    return rows


def calibration_rows(results: Results) -> list[dict[str, Any]]:
    return [{"model": cal.model, **r.model_dump()} for cal in results.calibrations for r in cal.rows]


def paper_rows(papers: tuple[Paper, ...]) -> list[dict[str, Any]]:
    rows = []
    for paper in papers:
        for row in paper.rows:
            value = row.paper_speedup
            rows.append({
                "paper": paper.id, "row": row.id, "table": row.source.table, "model": row.setting.model,
                "hardware": row.setting.hardware, "task": row.maps_to.task, "method": row.maps_to.method,
                "exit_layer": row.setting.exit_layer, "num_speculations": row.setting.num_speculations,
                "speedup": value[0] if value else None, "speedup_derived": value[1] if value else None,
                "acceptance": row.reported.acceptance, "quality_metric": row.setting.metric,
                "quality": row.reported.quality.get(row.setting.metric), "headline": row.headline,
                "unverified": row.unverified,
            })
    return rows


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


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def metrics(results: Results) -> dict[str, Any]:
    """Headline numbers for ``dvc metrics show``: keys like ``eval/<model>/<task>/<method>``."""
    out: dict[str, Any] = {"eval": {}, "sweep": {}, "calibrate": {}}
    for r in results.evals:
        primary = PRIMARY_METRIC.get(r.task)
        entry = {"speedup": _round(r.speed.speedup_vs_greedy), "ms_per_token": _round(r.speed.time_per_token_ms),
                 "acceptance": _round(r.speed.acceptance_rate)}
        if primary in r.scalar_quality():
            entry[primary] = r.scalar_quality()[primary]
        out["eval"][f"{r.model}/{r.task}/{r.method}"] = entry
    if results.sweep is not None:
        for model, dtype in sorted({(r.model, r.dtype) for r in results.sweep.rows}):
            rows = [r for r in results.sweep.rows if (r.model, r.dtype) == (model, dtype) and r.speedup_vs_greedy
                    and r.method != "autoregressive"]
            if rows:
                best = max(rows, key=lambda r: r.speedup_vs_greedy or 0.0)
                out["sweep"][f"{model}/{dtype}"] = {
                    "best_speedup": best.speedup_vs_greedy, "best_exit_layer": best.exit_layer,
                    "best_num_speculations": best.num_speculations, "best_acceptance": best.acceptance_rate,
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
        "sweep.csv": [r.model_dump() for r in results.sweep.rows] if results.sweep else [],
        "probe.csv": probe_rows(results),
        "calibrate.csv": calibration_rows(results),
        "predicted_vs_reported.csv": prediction_rows(results, papers),
        "paper_rows.csv": paper_rows(papers),
    }
    written += [write_csv(tables / name, rows) for name, rows in candidates.items() if rows]
    metrics_path = out_dir / "metrics.json"
    metrics_path.write_text(json.dumps(metrics(results), indent=2) + "\n")
    written.append(metrics_path)
    return written
