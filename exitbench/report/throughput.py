"""The report's batched-decoding part: ``results/throughput/throughput.json`` -> a README section, a table
and the speed-up-over-greedy-against-batch-size plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from exitbench.report.format import NONE, Column, fmt, markdown
from exitbench.report.results import Provenance

SOURCE = "throughput/throughput.json"
GREEDY = "autoregressive"


def provenance_of(data: dict[str, Any]) -> Provenance:
    return Provenance.model_validate(data["provenance"])


def _speedup(row: dict[str, Any]) -> str:
    if row.get("speedup_vs_greedy") is None:
        return "–"
    low, high, n = row.get("speedup_vs_greedy_low"), row.get("speedup_vs_greedy_high"), row.get("speedup_vs_greedy_n")
    return f"{row['speedup_vs_greedy']:.2f}x [{fmt(low, 2)}, {fmt(high, 2)}] n={n}"


def _acceptance(row: dict[str, Any]) -> str:
    if row.get("acceptance_rate") is None:
        return "–"
    spread = f"rows {row['row_acceptance_min']:.0%}–{row['row_acceptance_max']:.0%}"
    return (
        f"{row['acceptance_rate']:.1%} [{row['acceptance_rate_low']:.1%}, {row['acceptance_rate_high']:.1%}], {spread}"
    )


def _depth(row: dict[str, Any]) -> str:
    if row.get("batch_effective_depth") is not None:
        carried = f"{row['carried_layer_share']:.0%} carried"
        return f"{row['mean_exit_layer']:.1f} / {row['batch_effective_depth']:.1f} ({carried})"
    return fmt(row.get("mean_exit_layer"), 1)


def _mismatches(row: dict[str, Any]) -> str:
    parts = [
        f"{row['mismatches_vs_b1']} vs B=1" if row.get("mismatches_vs_b1") is not None else "",
        f"{row['mismatches_vs_greedy_b1']} vs greedy" if row.get("mismatches_vs_greedy_b1") is not None else "",
    ]
    return ", ".join(p for p in parts if p) or "–"


def table_rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    """``tables/throughput.csv``: the stage's rows as they are."""
    return [dict(row) for row in data["rows"]]


def throughput_section(data: dict[str, Any] | None) -> list[str]:
    lines = ["## Latency vs throughput: batched decoding", ""]
    if data is None:
        return [*lines, "Not run (`dvc repro throughput`).", ""]
    prov = provenance_of(data)
    samples = data.get("samples", {})
    strata = samples.get("strata", {})
    lines += [
        f"`{SOURCE}` · model `{data['model']}` · task `{data['task']}` · {samples.get('num_samples')} prompts "
        f"({samples.get('strategy')}, {len(strata)} strata) · up to {data['max_new_tokens']} new tokens · "
        f"{prov.device} · {prov.threads} threads · commit `{prov.short_commit}` · {prov.date}",
        "",
        "Each method decodes the same prompts in batches of B beside greedy decoding at the same B, interleaved per "
        "batch. Speed-up = greedy's time per generated token at that B / the method's (paired bootstrap 95% "
        "interval over batches, n = batches); greedy's own row gives its throughput scaling over B = 1. Exactness: "
        "each row's tokens against the same method at B = 1 and, for exact methods, against greedy at B = 1. "
        "Exit depth (CALM): mean exit layer per token / the batch's depth per step (the deepest live row's), and "
        "the share of run layers spent on rows that had already exited.",
        "",
    ]
    for skipped in data.get("skipped", []):
        lines.append(f"- skipped {skipped['what']}: {skipped['why']}")
    if data.get("skipped"):
        lines.append("")
    rows = sorted(data["rows"], key=lambda r: (r["method"] != GREEDY, r["method"], r["batch_size"]))
    return [*lines, *markdown(THROUGHPUT_COLUMNS, rows), ""]


Row = dict[str, Any]
# the README table (tables/throughput.csv is the stage's rows as they are: every field)
THROUGHPUT_COLUMNS: list[Column[Row]] = [
    Column("method", None, lambda r: f"`{r['method']}`", align="l"),
    Column("B", None, lambda r: r["batch_size"]),
    Column("tokens/s", None, lambda r: r["tokens_per_s"], digits=1),
    Column("ms/token", None, lambda r: r["ms_per_token"], digits=2),
    Column("speed-up vs greedy at B", None, _speedup),
    Column("greedy scaling vs B=1", None, lambda r: r.get("greedy_scaling_vs_b1"), digits=2),
    Column("mismatches", None, _mismatches, align="l"),
    Column("acceptance", None, _acceptance, align="l"),
    Column("exit depth", None, _depth, align="l"),
    Column("padded prefill", None, lambda r: NONE if (v := r.get("padded_prefill_share")) is None else f"{v:.0%}"),
]


def plot_throughput(
    data: dict[str, Any] | None, out_dir: Path, save: Any, source_line: Any
) -> tuple[list[Path], list[dict[str, Any]]]:
    """Speed-up over greedy at the same B (left) and tokens per second (right) against batch size, per method."""
    if data is None or not data["rows"]:
        return [], []
    methods = sorted({r["method"] for r in data["rows"]}, key=lambda m: (m != GREEDY, m))
    fig = Figure(figsize=(10, 4), layout="constrained")
    fig.get_layout_engine().set(rect=(0, 0.045, 1, 0.955))
    left, right = fig.subplots(1, 2)
    csv_rows = []
    for method in methods:
        rows = sorted((r for r in data["rows"] if r["method"] == method), key=lambda r: r["batch_size"])
        sizes = [r["batch_size"] for r in rows]
        speed = [r["speedup_vs_greedy"] for r in rows]
        low = [r["speedup_vs_greedy"] - (r["speedup_vs_greedy_low"] or r["speedup_vs_greedy"]) for r in rows]
        high = [(r["speedup_vs_greedy_high"] or r["speedup_vs_greedy"]) - r["speedup_vs_greedy"] for r in rows]
        left.errorbar(sizes, speed, yerr=[low, high], marker="o", capsize=3, label=method)
        right.plot(sizes, [r["tokens_per_s"] for r in rows], marker="o", label=method)
        csv_rows += [
            {
                "method": method,
                "batch_size": r["batch_size"],
                "speedup": r["speedup_vs_greedy"],
                "speedup_low": r["speedup_vs_greedy_low"],
                "speedup_high": r["speedup_vs_greedy_high"],
                "tokens_per_s": r["tokens_per_s"],
            }
            for r in rows
        ]
    for axis in (left, right):
        axis.set_xscale("log", base=2)
        axis.set_xlabel("batch size B (sequences decoded together)")
        axis.grid(alpha=0.3)
    left.axhline(1.0, color="0.5", lw=0.8, ls="--")
    left.set_ylabel("speed-up over greedy at the same B (x)")
    right.set_ylabel("throughput (generated tokens / s)")
    left.legend(fontsize=8)
    fig.suptitle(f"Batched decoding: {data['model']} on {data['task']} ({data['samples'].get('num_samples')} prompts)")
    source_line(fig, [SOURCE], [provenance_of(data)])
    return save(fig, out_dir, "throughput_vs_batch"), csv_rows
