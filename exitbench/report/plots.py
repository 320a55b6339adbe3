"""The report's figures (PNG + SVG under ``results/plots/``) and their data (``results/plots/data/*.csv``).

Figures are drawn on :class:`matplotlib.figure.Figure` objects with the Agg/SVG canvases, never through
pyplot, so nothing global is touched. Every figure has axis labels with units, a legend, and a source
line at the bottom naming the result file(s) and commit. The CSV files carry the same numbers in long
form for ``dvc plots show``.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import matplotlib as mpl
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import TwoSlopeNorm
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.transforms import Bbox

from exitbench.replications import Paper, Row
from exitbench.report.format import Estimate, estimate_columns, write_csv
from exitbench.report.results import EvalResult, Provenance, Results, SweepRow
from exitbench.report.tables import method_key, quality_estimate, result_key, speed_estimate, sweep_estimate
from exitbench.report.throughput import plot_throughput

MARKERS = {
    "autoregressive": "o",
    "early_exit": "v",
    "self_speculative": "^",
    "hf_early_exit": "s",
    "self_speculative_lookup": ">",
    "prompt_lookup": "X",
    "hf_prompt_lookup": "x",
    "speculative": "P",
    "adaptive_self_speculative": "*",
    "layer_skip_draft": "<",
    "swift": "h",
    "kangaroo": "p",
    "mindskip": "8",
    "depth_pruning": "d",
    "calm": "D",
}
LINESTYLES = ("-", "--", ":", "-.")
PAPER_COLOR = "0.15"
DPI = 150



def _edge(marker: str, fill: str | None = None) -> str | None:
    """Black edges for a filled marker; an unfilled one ('x', '+') is all edge: its own colour (``fill``)."""
    return "black" if marker in Line2D.filled_markers else fill

def _colors(names: list[str]) -> dict[str, Any]:
    cmap = mpl.colormaps["tab10"]
    return {name: cmap(i % 10) for i, name in enumerate(names)}


def _figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)  # a renderer to measure text with (labels placed clear of each other)
    fig.get_layout_engine().set(rect=(0, 0.045, 1, 0.955))  # leave room for the source line
    return fig


def _source_line(fig: Figure, sources: list[str], provenances: list[Provenance]) -> None:
    commits = sorted({p.short_commit for p in provenances})
    text = f"source: {', '.join(sorted(set(sources)))} · commit {', '.join(commits) or '?'} · exitbench"
    fig.text(0.005, 0.006, text, fontsize=7, color="0.35", ha="left", va="bottom")


def _save(fig: Figure, out_dir: Path, name: str) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    png, svg = out_dir / f"{name}.png", out_dir / f"{name}.svg"
    with mpl.rc_context({"svg.hashsalt": "exitbench"}):  # stable SVG ids, so unchanged plots diff cleanly
        fig.savefig(png, dpi=DPI, metadata={"Software": None})
        fig.savefig(svg, metadata={"Date": None})
    svg.write_text(renumber_clip_ids(svg.read_text()))
    return [png, svg]


_CLIP_ID = re.compile(r'(?:(?<=url\(#)|(?<=id="))p[0-9a-f]{10}\b')


def renumber_clip_ids(svg_text: str) -> str:
    """Clip-path ids numbered in order of first use: matplotlib derives them from float bounds and object
    counters that can differ between runs, which would rewrite a tracked plot whose content did not change."""
    ids: dict[str, str] = {}
    return _CLIP_ID.sub(lambda m: ids.setdefault(m.group(0), f"clip{len(ids)}"), svg_text)


SHORT_METHOD = {
    "self_speculative": "self-spec",
    "early_exit": "early exit",
    "autoregressive": "greedy",
    "adaptive_self_speculative": "adaptive",
    "self_speculative_lookup": "self-spec+lookup",
    "hf_early_exit": "hf early exit",
    "hf_prompt_lookup": "hf lookup",
    "prompt_lookup": "lookup",
    "speculative": "2-model",
    "depth_pruning": "pruned",
    "layer_skip_draft": "skip-draft",
    "swift": "SWIFT",
    "kangaroo": "Kangaroo",
    "mindskip": "MindSkip",
    "hf_greedy": "hf greedy",
}
#: options shown in a point's label, by their short names (file options are provenance, not a setting to read)
SHORT_OPTION = {"exit_layer": "E", "num_speculations": "d", "num_pruned": "-", "ngram_size": "n",
                "lookup_speculations": "k", "draft_layers": "draft", "min_confidence": "conf", "threshold": "t",
                "routing": ""}
PlotOutput = tuple[list[Path], list[dict[str, Any]]]


def _short_method(method: str) -> str:
    return SHORT_METHOD.get(method, method)


def point_label(result: EvalResult) -> str:
    """A point's short label, ``self-spec E12 d1``: the method's short name and the settings a reader compares
    (a draft sub-vocabulary as ``sub-vocab``; other file options and unknown ones left to the CSV beside it)."""
    options = result.options
    parts = [_short_method(result.family)]
    parts += [f"{short}{options[key]}" for key, short in SHORT_OPTION.items() if key in options]
    if "draft_vocab_file" in options:
        parts.append("sub-vocab")
    return " ".join(parts)


#: label offsets (points) tried in order around a point: right, left, above, below, the diagonals, then the
#: same farther out
_AROUND = [(7, -3), (-7, -3), (0, 8), (0, -12), (7, 7), (-7, 7), (7, -12), (-7, -12)]
_OFFSETS = [(round(k * dx), round(k * dy)) for k in (1, 2, 3, 4.5) for dx, dy in _AROUND]


def _overlap(a: Bbox, b: Bbox) -> float:
    width = min(a.x1, b.x1) - max(a.x0, b.x0)
    height = min(a.y1, b.y1) - max(a.y0, b.y0)
    return width * height if width > 0 and height > 0 else 0.0


def _outside(box: Bbox, frame: Bbox) -> float:
    """The area of ``box`` outside ``frame``."""
    return box.width * box.height - _overlap(box, frame)


def place_labels(fig: Figure, ax: Any, items: list[tuple[float, float, str, Any, dict[str, Any]]],
                 points: list[tuple[float, float]] = (), marker_px: float = 7.0) -> list[Any]:
    """Annotate each ``(x, y, text, color, style)`` at the first offset whose text box covers no label placed
    before it, no marker (a square of ``marker_px`` around each item's point and each of ``points``, the
    unlabelled ones) and stays inside the axes; where
    no offset is free, the least covering one. Drawn after the layout is final and kept out of it, so the
    boxes measured are the boxes saved."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    markers = []
    for x, y in [(item[0], item[1]) for item in items] + list(points):
        px, py = ax.transData.transform((x, y))
        markers.append(Bbox.from_extents(px - marker_px, py - marker_px, px + marker_px, py + marker_px))
    placed: list[Bbox] = []
    annotations = []
    for x, y, text, color, style in items:
        best, best_cost = None, math.inf
        for offset in _OFFSETS:
            horizontal = "left" if offset[0] > 0 else "right" if offset[0] < 0 else "center"
            note = ax.annotate(text, (x, y), xytext=offset, textcoords="offset points", color=color,
                               ha=horizontal, va="center", **style)
            note.set_in_layout(False)
            box = note.get_window_extent(renderer).expanded(1.05, 1.1)
            cost = (10 * sum(_overlap(box, other) for other in placed) + sum(_overlap(box, m) for m in markers)
                    + 10 * _outside(box, frame))
            if cost < best_cost:
                if best is not None:
                    best[0].remove()
                best, best_cost = (note, box), cost
            else:
                note.remove()
            if cost == 0:
                break
        assert best is not None
        placed.append(best[1])
        annotations.append(best[0])
    return annotations


# ------------------------------------------------------------------------------------------ 1. Pareto view


def x_metric(task: str, results: list[EvalResult], papers: tuple[Paper, ...]) -> str | None:
    """The quality metric on the x axis: the one most paper points for this task report, if we measure it;
    else our primary metric."""
    ours = {name for r in results for name in r.scalar_quality()}
    counts = {m: 0 for m in ours}
    for paper in papers:
        for row in paper.rows:
            if row.maps_to.task == task:
                for metric in row.reported.quality:
                    if metric in counts:
                        counts[metric] += 1
    primary = next((r.primary for r in results if r.primary), None)
    if counts and max(counts.values()) > 0:
        return max(sorted(counts), key=lambda m: (counts[m], m == primary))
    return primary if primary in ours else (sorted(ours)[0] if ours else None)


def _pareto(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Points not dominated in (quality, speed-up), sorted by quality."""
    front = [p for p in points if not any(q[0] >= p[0] and q[1] >= p[1] and q != p for q in points)]
    return sorted(set(front))


def _paper_points(task: str, metric: str, papers: tuple[Paper, ...]) -> list[tuple[Paper, Row, float, float, bool]]:
    points = []
    for paper in papers:
        for row in paper.rows:
            value = row.paper_speedup
            if row.maps_to.task != task or row.maps_to.ablation or value is None or metric not in row.reported.quality:
                continue
            points.append((paper, row, row.reported.quality[metric], value[0], value[1]))
    return points


def _error(estimate: Estimate) -> list[list[float]] | None:
    """matplotlib's ``[[below], [above]]`` from an estimate's interval (None without one)."""
    if estimate.interval is None or estimate.value is None:
        return None
    return [[max(estimate.value - estimate.interval.low, 0.0)], [max(estimate.interval.high - estimate.value, 0.0)]]


def _error_bars(ax: Any, x: Estimate, y: Estimate, color: Any) -> None:
    """95% interval bars on both axes (where the result stores them)."""
    xerr, yerr = _error(x), _error(y)
    if xerr is None and yerr is None:
        return
    ax.errorbar(
        x.value,
        y.value,
        xerr=xerr,
        yerr=yerr,
        fmt="none",
        ecolor=color,
        elinewidth=0.8,
        capsize=2.5,
        alpha=0.8,
        zorder=2,
    )


def plot_speedup_vs_quality(results: Results, papers: tuple[Paper, ...], out_dir: Path) -> PlotOutput:
    files: list[Path] = []
    data: list[dict[str, Any]] = []
    colors = _colors(results.eval_models())
    for task in results.eval_tasks():
        rows = [r for r in results.evals if r.task == task and r.speed.speedup_vs_greedy is not None]
        metric = x_metric(task, rows, papers)
        if metric is None:
            continue
        rows = [r for r in rows if quality_estimate(r, metric, results.evals).value is not None]
        if not rows:
            continue
        fig = _figure(12.5, 5.6)
        ax = fig.add_subplot()
        ax.axhline(1.0, color="0.6", linewidth=0.8, linestyle="--", zorder=0)
        ours: list[tuple[float, float]] = []
        labels: list[tuple[float, float, str, Any, dict[str, Any]]] = []
        for r in sorted(rows, key=lambda r: (r.model, result_key(r))):
            quality, speedup = quality_estimate(r, metric, results.evals), speed_estimate(r, "speedup_vs_greedy")
            x, y = quality.value or 0.0, speedup.value or 0.0
            ours.append((x, y))
            _error_bars(ax, quality, speedup, colors[r.model])
            ax.scatter(
                x,
                y,
                s=70,
                marker=MARKERS.get(r.family, "o"),
                color=colors[r.model],
                edgecolor=_edge(MARKERS.get(r.family, "o")),
                linewidth=0.5,
                zorder=3,
            )
            if r.family != "autoregressive":
                labels.append((x, y, point_label(r), colors[r.model], {"fontsize": 7}))
            data.append(
                {
                    "source": "ours",
                    "task": task,
                    "model": r.model,
                    "method": r.method,
                    "config": " ".join(f"{k}={v}" for k, v in sorted(r.options.items())),
                    "quality_metric": metric,
                    **estimate_columns("quality", quality),
                    **estimate_columns("speedup", speedup),
                }
            )
        front = _pareto(ours)
        if len(front) > 1:
            ax.plot(*zip(*front, strict=True), color="0.5", linewidth=0.8, linestyle=":", zorder=1)
        paper_points = _paper_points(task, metric, papers)
        paper_handles = []
        for number, (paper, row, x, y, derived) in enumerate(paper_points, start=1):
            style = {"marker": "*", "color": PAPER_COLOR, "markerfacecolor": "white" if derived else PAPER_COLOR}
            ax.plot([x], [y], linestyle="", markersize=13, markeredgewidth=1.0, zorder=4, **style)
            labels.insert(number - 1, (x, y, str(number), PAPER_COLOR, {"fontsize": 8, "fontweight": "bold"}))
            table = row.source.table.split(" (")[0].replace("Table ", "T")
            how = "derived" if derived else "stated"
            label = (
                f"[{number}] paper {paper.id} {table}: {row.label}, {_short_method(row.maps_to.method)} "
                f"({y:.2f}x {how})"
            )
            paper_handles.append(Line2D([], [], linestyle="", markersize=10, label=label, **style))
            data.append(
                {
                    "source": f"paper ({paper.id})",
                    "task": task,
                    "model": row.setting.model,
                    "method": row.maps_to.method,
                    "config": row.label,
                    "quality_metric": metric,
                    "quality": x,
                    "speedup": y,
                }
            )
        handles = [
            Line2D([], [], marker="s", linestyle="", markersize=8, color=colors[m], label=f"ours: {m}")
            for m in sorted({r.model for r in rows})
        ]
        handles += [
            Line2D(
                [],
                [],
                marker=MARKERS.get(m, "o"),
                linestyle="",
                markersize=7,
                color="0.5",
                markeredgecolor=_edge(MARKERS.get(m, "o"), "0.5"),
                label=_short_method(m),
            )
            for m in sorted({r.family for r in rows}, key=method_key)
        ]
        if any(
            _error(quality_estimate(r, metric, results.evals)) or _error(speed_estimate(r, "speedup_vs_greedy"))
            for r in rows
        ):
            handles.append(
                Line2D(
                    [],
                    [],
                    color="0.4",
                    marker="|",
                    markersize=8,
                    linewidth=0.8,
                    label="95% interval (bootstrap over samples)",
                )
            )
        if len(front) > 1:
            handles.append(Line2D([], [], color="0.5", linestyle=":", label="our Pareto front"))
        handles += paper_handles
        handles.append(Line2D([], [], color="0.6", linestyle="--", label="greedy decoding (1.0x)"))
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
        ax.set_xlabel(f"{metric} (quality, higher is better)")
        ax.set_ylabel("speed-up over greedy decoding (x, time per token)")
        ax.set_title(f"{task}: speed-up vs quality — ours (same checkpoint as greedy) and the papers' figures")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.25)
        sources = [r.source_file for r in rows] if len(rows) <= 2 else [f"{results.root.name}/eval/*/{task}/*.json"]
        _source_line(fig, sources, [r.provenance for r in rows])
        place_labels(fig, ax, labels, ours)  # last: the layout is final
        files += _save(fig, out_dir, f"speedup_vs_quality_{task}")
    return files, data


# ------------------------------------------------------------------------------------------ 2. sweep heat map


def _sweep_groups(rows: tuple[SweepRow, ...]) -> dict[tuple[str, str, str], list[SweepRow]]:
    groups: dict[tuple[str, str, str], list[SweepRow]] = {}
    for r in rows:
        if r.exit_layer is not None and r.num_speculations is not None and r.speedup_vs_greedy is not None:
            groups.setdefault((r.model, r.dtype, r.method), []).append(r)
    return dict(sorted(groups.items()))


def heatmap_label(row: SweepRow) -> str:
    """A heat-map cell: speed-up and acceptance, each with its 95% interval over prompts when stored."""
    speedup, acceptance = sweep_estimate(row, "speedup_vs_greedy"), sweep_estimate(row, "acceptance_rate")
    lines = [f"{speedup.value:.2f}x"]
    if speedup.interval is not None:
        lines[0] += f" [{speedup.interval.low:.2f}, {speedup.interval.high:.2f}]"
    if acceptance.value is not None:
        lines.append(f"acc {100 * acceptance.value:.0f}%")
        if acceptance.interval is not None:
            lines[-1] += f" [{100 * acceptance.interval.low:.0f}, {100 * acceptance.interval.high:.0f}]"
    return "\n".join(lines)


def plot_sweep_heatmap(results: Results, out_dir: Path) -> list[Path]:
    sweep = results.sweep
    if sweep is None:
        return []
    groups = _sweep_groups(sweep.rows)
    if not groups:
        return []
    values = [r.speedup_vs_greedy or 1.0 for rows in groups.values() for r in rows]
    norm = TwoSlopeNorm(vcenter=1.0, vmin=min(min(values), 0.99), vmax=max(max(values), 1.01))
    ncols = min(2, len(groups))
    nrows = math.ceil(len(groups) / ncols)
    fig = _figure(5.2 * ncols + 0.8, 4.2 * nrows + 0.4)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    image = None
    for ax, ((model, dtype, method), rows) in zip(axes.flat, groups.items(), strict=False):
        exits = sorted({r.exit_layer for r in rows if r.exit_layer is not None})
        specs = sorted({r.num_speculations for r in rows if r.num_speculations is not None})
        grid = [[math.nan] * len(specs) for _ in exits]
        cells: dict[tuple[int, int], SweepRow] = {}
        for r in rows:
            i, j = exits.index(r.exit_layer), specs.index(r.num_speculations)
            grid[i][j] = r.speedup_vs_greedy or math.nan
            cells[(i, j)] = r
        image = ax.imshow(grid, cmap="RdYlGn", norm=norm, aspect="auto", origin="lower")
        for i in range(len(exits)):
            for j in range(len(specs)):
                if math.isnan(grid[i][j]):
                    continue
                text = heatmap_label(cells[(i, j)])
                red, green, blue, _ = image.cmap(norm(grid[i][j]))
                dark = 0.299 * red + 0.587 * green + 0.114 * blue < 0.5
                ax.text(j, i, text, ha="center", va="center", fontsize=7, color="white" if dark else "black")
        ax.set_xticks(range(len(specs)), [str(d) for d in specs])
        ax.set_yticks(range(len(exits)), [str(e) for e in exits])
        ax.set_xlabel("speculations per round d")
        ax.set_ylabel("exit layer E")
        ax.set_title(f"{model} · {dtype} · {_short_method(method)}", fontsize=10)
    for ax in list(axes.flat)[len(groups) :]:
        ax.set_visible(False)
    if image is not None:
        fig.colorbar(image, ax=axes, label="speed-up over greedy (x); 1.0 = no gain", shrink=0.8)
    n = sorted({r.num_prompts for rows in groups.values() for r in rows})
    fig.suptitle(
        f"Self-speculative decoding sweep over (E, d){' on ' + sweep.task if sweep.task else ''} "
        f"(n = {', '.join(map(str, n))} prompts; brackets: 95% interval over prompts)"
    )
    _source_line(fig, [sweep.source_file], [sweep.provenance])
    return _save(fig, out_dir, "sweep_heatmap")


# ------------------------------------------------------------------------------------------ 3. acceptance vs E


def plot_acceptance_vs_exit(results: Results, papers: tuple[Paper, ...], out_dir: Path) -> PlotOutput:
    sweep = results.sweep
    if sweep is None:
        return [], []
    rows = [r for r in sweep.rows if r.acceptance_rate is not None and r.exit_layer is not None]
    if not rows:
        return [], []
    dtypes = sorted({r.dtype for r in rows})
    series = sorted({(r.model, r.method) for r in rows})
    colors = _colors([f"{m}/{k}" for m, k in series])
    specs = sorted({r.num_speculations or 0 for r in rows})
    paper_rows = [
        (p, row)
        for p in papers
        for row in p.rows
        if sweep.task
        and row.maps_to.task == sweep.task
        and row.reported.acceptance is not None
        and row.setting.exit_layer is not None
        and not row.maps_to.ablation
    ]
    fig = _figure(5.6 * len(dtypes) + 2.6, 4.6)
    axes = fig.subplots(1, len(dtypes), squeeze=False, sharey=True)[0]
    data = []
    for ax, dtype in zip(axes, dtypes, strict=True):
        for model, method in series:
            for k, d in enumerate(specs):
                pts = sorted(
                    (
                        (r.exit_layer or 0, sweep_estimate(r, "acceptance_rate"))
                        for r in rows
                        if (r.model, r.method, r.dtype, r.num_speculations or 0) == (model, method, dtype, d)
                    ),
                    key=lambda p: p[0],
                )
                if not pts:
                    continue
                color = colors[f"{model}/{method}"]
                ax.plot(
                    [e for e, _ in pts],
                    [a.value for _, a in pts],
                    marker="o",
                    markersize=4,
                    color=color,
                    linestyle=LINESTYLES[k % len(LINESTYLES)],
                )
                for e, a in pts:
                    _error_bars(ax, Estimate(e), a, color)
                data += [
                    {
                        "model": model,
                        "method": method,
                        "dtype": dtype,
                        "num_speculations": d,
                        "exit_layer": e,
                        **estimate_columns("acceptance_rate", a),
                    }
                    for e, a in pts
                ]
        by_label: dict[str, list[tuple[int, float]]] = {}
        for paper, row in paper_rows:
            label = (
                f"paper: {paper.id} {row.source.table.split(' (')[0]}, {row.setting.model.split(' (')[0]} "
                f"({row.setting.num_layers} layers), {row.setting.hardware.split(' (')[0]}"
            )
            by_label.setdefault(label, []).append((row.setting.exit_layer or 0, row.reported.acceptance or 0.0))
        for j, (_label, pts) in enumerate(sorted(by_label.items())):
            ax.plot(
                *zip(*sorted(pts), strict=True),
                marker="*",
                markersize=11,
                color=PAPER_COLOR,
                linestyle=LINESTYLES[j % len(LINESTYLES)],
                linewidth=0.8,
            )
        ax.set_title(dtype, fontsize=10)
        ax.set_xlabel("exit layer E (layers run by the draft)")
        ax.set_ylim(0, 1.02)
        ax.yaxis.set_major_formatter(lambda v, _: f"{100 * v:.0f}%")
        ax.grid(alpha=0.25)
    axes[0].set_ylabel("acceptance rate (accepted / drafted)")
    handles = [
        Line2D([], [], color=colors[f"{m}/{k}"], marker="o", label=f"ours: {m} ({_short_method(k)})") for m, k in series
    ]
    handles += [
        Line2D([], [], color="0.4", linestyle=LINESTYLES[k % len(LINESTYLES)], label=f"d = {d}")
        for k, d in enumerate(specs)
    ]
    handles += (
        [
            Line2D([], [], color=PAPER_COLOR, marker="*", markersize=10, linestyle=LINESTYLES[j % 4], label=lab)
            for j, lab in enumerate(sorted({lab for lab in by_label}))
        ]
        if paper_rows
        else []
    )
    axes[-1].legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=8, frameon=False)
    fig.suptitle(f"Draft acceptance vs exit layer{' on ' + sweep.task if sweep.task else ''}")
    _source_line(fig, [sweep.source_file], [sweep.provenance])
    return _save(fig, out_dir, "acceptance_vs_exit"), data


# ------------------------------------------------------------------------------------------ 4. readability


def plot_readability(results: Results, out_dir: Path) -> PlotOutput:
    if not results.probes:
        return [], []
    kinds = sorted({k for p in results.probes for k in p.texts})
    colors = _colors([p.model for p in results.probes])
    ncols = min(2, len(kinds))
    nrows = math.ceil(len(kinds) / ncols)
    fig = _figure(5.0 * ncols + 1.8, 3.5 * nrows + 0.5)
    axes = fig.subplots(nrows, ncols, squeeze=False, sharex=True, sharey=True)
    data = []
    for ax, kind in zip(axes.flat, kinds, strict=False):
        for probe in results.probes:
            curve = probe.texts.get(kind)
            if curve is None:
                continue
            n = len(curve.agreement)
            layers = [i + 1 if n == probe.num_layers else i for i in range(n)]
            ax.plot(layers, curve.agreement, color=colors[probe.model], marker=".", label=probe.model)
            data += [
                {"model": probe.model, "text": kind, "layer": x, "agreement": y}
                for x, y in zip(layers, curve.agreement, strict=True)
            ]
        ax.set_title(kind, fontsize=10)
        ax.set_ylim(0, 1.02)
        ax.yaxis.set_major_formatter(lambda v, _: f"{100 * v:.0f}%")
        ax.grid(alpha=0.25)
    for ax in list(axes.flat)[len(kinds) :]:
        ax.set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel("exit after layer")
    for ax in axes[:, 0]:
        ax.set_ylabel("agreement with last layer")
    handles = [Line2D([], [], color=colors[p.model], marker=".", label=p.model) for p in results.probes]
    axes[0][-1].legend(
        handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=9, frameon=False, title="model"
    )
    fig.suptitle("Readability of intermediate layers through the shared LM head (top-1 agreement)")
    _source_line(fig, [p.source_file for p in results.probes], [p.provenance for p in results.probes])
    return _save(fig, out_dir, "readability"), data


# ------------------------------------------------------------------------------------------ 5. CALM curves


def plot_calm(results: Results, out_dir: Path) -> PlotOutput:
    files: list[Path] = []
    data: list[dict[str, Any]] = []
    cals = [c for c in results.calibrations if c.curves]
    if not cals:
        return files, data
    colors = _colors([c.model for c in cals])
    strategies = sorted({cv.kv_strategy for c in cals for cv in c.curves})
    kv_styles = {kv: LINESTYLES[i % len(LINESTYLES)] for i, kv in enumerate(strategies)}
    for task in sorted({cv.task for c in cals for cv in c.curves}):
        measures = sorted({cv.measure for c in cals for cv in c.curves if cv.task == task})
        fig = _figure(4.6 * len(measures) + 2.4, 6.4)
        axes = fig.subplots(2, len(measures), squeeze=False, sharex=True)
        deltas = sorted({r.delta for c in cals for r in c.rows if r.task == task})
        for j, measure in enumerate(measures):
            risk_ax, speed_ax = axes[0][j], axes[1][j]
            for cal in cals:
                for cv in cal.curves:
                    if (cv.task, cv.measure) != (task, measure):
                        continue
                    style = {"color": colors[cal.model], "linestyle": kv_styles[cv.kv_strategy], "marker": "."}
                    risk = [(t, v) for t, v in zip(cv.thresholds, cv.risk, strict=True) if v is not None]
                    speed = [(t, v) for t, v in zip(cv.thresholds, cv.speedup, strict=True) if v is not None]
                    if risk:
                        risk_ax.plot(*zip(*risk, strict=True), **style)
                    if speed:
                        speed_ax.plot(*zip(*speed, strict=True), **style)
                    data += [
                        {
                            "model": cal.model,
                            "task": task,
                            "measure": measure,
                            "kv_strategy": cv.kv_strategy,
                            "threshold": t,
                            "risk": rv,
                            "speedup": sv,
                        }
                        for t, rv, sv in zip(cv.thresholds, cv.risk, cv.speedup, strict=True)
                    ]
                for r in cal.rows:
                    if (r.task, r.measure) == (task, measure) and r.threshold is not None and r.speedup_vs_greedy:
                        speed_ax.scatter(
                            r.threshold,
                            r.speedup_vs_greedy,
                            marker="D",
                            s=28,
                            zorder=4,
                            color=colors[cal.model],
                            edgecolor="black",
                            linewidth=0.5,
                        )
            for delta in deltas:
                risk_ax.axhline(delta, color="0.45", linewidth=0.8, linestyle=(0, (1, 2)))
                risk_ax.annotate(
                    f"δ = {delta:g}",
                    (0.01, delta),
                    xycoords=("axes fraction", "data"),
                    fontsize=7,
                    ha="left",
                    va="bottom",
                    color="0.35",
                )
            speed_ax.axhline(1.0, color="0.6", linewidth=0.8, linestyle="--")
            risk_ax.set_title(f"confidence measure: {measure}", fontsize=10)
            speed_ax.set_xlabel("confidence threshold λ (lower exits earlier)")
            if j == 0:  # x is shared by every panel: invert once, so left = all layers, right = earliest exits
                risk_ax.invert_xaxis()
            for ax in (risk_ax, speed_ax):
                ax.grid(alpha=0.25)
        axes[0][0].set_ylabel("mean risk, calibration split")
        axes[1][0].set_ylabel("decode speed-up over greedy (x)")
        handles = [Line2D([], [], color=colors[c.model], label=f"model: {c.model}") for c in cals]
        handles += [Line2D([], [], color="0.3", linestyle=ls, label=f"KV: {kv}") for kv, ls in kv_styles.items()]
        handles += [
            Line2D(
                [], [], marker="D", linestyle="", color="0.5", markeredgecolor="black", label="calibrated threshold"
            ),
            Line2D([], [], color="0.45", linestyle=(0, (1, 2)), label="target risk δ"),
        ]
        axes[0][-1].legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=8, frameon=False)
        fig.suptitle(f"CALM on {task}: risk and speed-up vs exit threshold")
        _source_line(fig, [c.source_file for c in cals], [c.provenance for c in cals])
        files += _save(fig, out_dir, f"calm_{task}")
    return files, data


# ------------------------------------------------------------------------------------------ all


def write_plots(results: Results, papers: tuple[Paper, ...], out_dir: str | Path) -> list[Path]:
    """Every figure whose inputs exist, plus ``data/*.csv``; returns the files written."""
    out_dir = Path(out_dir)
    files: list[Path] = []
    pareto, pareto_data = plot_speedup_vs_quality(results, papers, out_dir)
    accept, accept_data = plot_acceptance_vs_exit(results, papers, out_dir)
    readable, readable_data = plot_readability(results, out_dir)
    calm, calm_data = plot_calm(results, out_dir)
    batched, batched_data = plot_throughput(results.throughput, out_dir, _save, _source_line)
    files += pareto + plot_sweep_heatmap(results, out_dir) + accept + readable + calm + batched
    sweep_data = [
        {
            "model": r.model,
            "dtype": r.dtype,
            "method": r.method,
            "exit_layer": r.exit_layer,
            "num_speculations": r.num_speculations,
            **estimate_columns("speedup_vs_greedy", sweep_estimate(r, "speedup_vs_greedy")),
            **estimate_columns("acceptance_rate", sweep_estimate(r, "acceptance_rate")),
        }
        for rows in (_sweep_groups(results.sweep.rows).values() if results.sweep else [])
        for r in rows
    ]
    for name, rows in (
        ("speedup_vs_quality.csv", pareto_data),
        ("sweep_speedup.csv", sweep_data),
        ("acceptance_vs_exit.csv", accept_data),
        ("readability.csv", readable_data),
        ("calm_threshold.csv", calm_data),
        ("throughput_speedup.csv", batched_data),
    ):
        if rows:
            files.append(write_csv(out_dir / "data" / name, rows))
    return files
