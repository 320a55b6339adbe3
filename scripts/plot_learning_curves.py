"""Plot the TOPv2 learning curves (scripts/learning_curve.py) of `plain` and `layerskip` and project, from them,
the steps each of the `topv2` twin's targets needs.

    python scripts/plot_learning_curves.py results/learning_curves/topv2_plain.json \\
        results/learning_curves/topv2_layerskip.json --out results/learning_curves/topv2

Writes ``<out>.png`` (three panels: last-layer exact match, early-exit quality fraction and self-speculative
acceptance at each depth, 95% intervals; with ``--twin``, the twin run's own measurement at its step budget as
open markers: its larger quality sample, and acceptance at the twin's d) and ``<out>_targets.json``: per target,
the curve's value at its last snapshot and the steps at which a straight line in log(steps) through the last two
snapshots would reach the target (a projection from two points, not a measurement: it says roughly how far, not
when).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

# The `topv2` twin's targets (issue "CPU-scale twins"): plain EM, layerskip within 0.08 of plain, acceptance at
# E/L = 0.5 and the early-exit EM fraction at E/L = 0.75.
TARGETS = {"plain_em": 0.50, "layerskip_gap": 0.08, "acceptance_mid": 0.80, "exit_fraction_deep": 0.50}


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def series(curve: dict[str, Any], key: str) -> tuple[list[int], list[float], list[float], list[float]]:
    """(steps, estimates, lows, highs) of ``key`` (an interval) over the curve's snapshots."""
    steps, mid, low, high = [], [], [], []
    for snap in curve["snapshots"]:
        value = snap.get(key)
        if isinstance(value, dict):
            steps.append(snap["step"])
            mid.append(value["estimate"])
            low.append(value["low"])
            high.append(value["high"])
    return steps, mid, low, high


def fraction(curve: dict[str, Any], layer: int) -> tuple[list[int], list[float]]:
    points = [(s["step"], s[f"em_fraction@{layer}"]) for s in curve["snapshots"] if s.get(f"em_fraction@{layer}")
              is not None]
    return [p[0] for p in points], [p[1] for p in points]


def projected_steps(steps: list[int], values: list[float], target: float) -> float | None:
    """Steps where the line through the last two (log steps, value) points reaches ``target``; None when it does
    not rise (or there are fewer than two points); the last step itself when the target is already met."""
    if values and values[-1] >= target:
        return float(steps[-1])
    if len(steps) < 2:
        return None
    (s0, v0), (s1, v1) = (steps[-2], values[-2]), (steps[-1], values[-1])
    slope = (v1 - v0) / (math.log(s1) - math.log(s0))
    if slope <= 0:
        return None
    return math.exp(math.log(s1) + (target - v1) / slope)


def targets(plain: dict[str, Any], layerskip: dict[str, Any], mid: int, deep: int) -> dict[str, Any]:
    p_steps, p_em, _, _ = series(plain, "em_last")
    l_steps, l_em, _, _ = series(layerskip, "em_last")
    a_steps, a_mid, _, _ = series(layerskip, f"acceptance@{mid}")
    f_steps, f_deep = fraction(layerskip, deep)
    common = sorted(set(p_steps) & set(l_steps))
    gaps = [p_em[p_steps.index(s)] - l_em[l_steps.index(s)] for s in common]
    return {
        "plain_em": {"target": f">= {TARGETS['plain_em']}", "last": p_em[-1] if p_em else None,
                     "at_step": p_steps[-1] if p_steps else None,
                     "projected_steps": projected_steps(p_steps, p_em, TARGETS["plain_em"])},
        "layerskip_gap": {"target": f"plain - layerskip <= {TARGETS['layerskip_gap']}", "last": gaps[-1] if gaps
                          else None, "at_step": common[-1] if common else None, "by_step": dict(zip(common, gaps,
                                                                                                     strict=True))},
        f"acceptance@{mid}": {"target": f">= {TARGETS['acceptance_mid']}", "last": a_mid[-1] if a_mid else None,
                              "at_step": a_steps[-1] if a_steps else None,
                              "projected_steps": projected_steps(a_steps, a_mid, TARGETS["acceptance_mid"])},
        f"exit_fraction@{deep}": {"target": f">= {TARGETS['exit_fraction_deep']}", "last": f_deep[-1] if f_deep
                                  else None, "at_step": f_steps[-1] if f_steps else None,
                                  "projected_steps": projected_steps(f_steps, f_deep, TARGETS["exit_fraction_deep"])},
    }


def _interval(summary: dict[str, Any], metric: str, value: float | None) -> dict[str, Any] | None:
    stored = summary.get("intervals", {}).get(metric)
    if stored:
        return {key: stored[key] for key in ("estimate", "low", "high", "n")}
    return None if value is None else {"estimate": value, "low": value, "high": value, "n": summary["num_samples"]}


def twin_snapshot(root: Path, model: str, layers: list[int]) -> dict[str, Any] | None:
    """The twin run's own measurement of ``model`` as one snapshot (its step budget, its quality sample and its
    timing sample at the twin's d): last-layer EM, early-exit EM and fraction, self-speculative acceptance."""
    report = root / "train" / f"{model}.json"
    greedy = root / "eval" / "autoregressive" / model / "topv2" / "autoregressive.json"
    if not report.exists() or not greedy.exists():
        return None
    last = load(greedy)
    snap: dict[str, Any] = {"step": load(report)["steps"],
                            "em_last": _interval(last, "exact_match", last["quality"].get("exact_match"))}
    for layer in layers:
        early = root / "eval" / "early_exit" / model / "topv2" / f"early_exit@{layer}.json"
        if early.exists():
            summary = load(early)
            snap[f"em@{layer}"] = _interval(summary, "exact_match", summary["quality"].get("exact_match"))
            fraction = summary.get("intervals", {}).get("fraction_of_greedy/exact_match")
            snap[f"em_fraction@{layer}"] = fraction["estimate"] if fraction else None
        spec = root / "eval" / "self_speculative" / model / "topv2" / f"self_speculative@{layer}.json"
        if spec.exists():
            summary = load(spec)
            snap[f"acceptance@{layer}"] = _interval(summary, "acceptance_rate", summary["speed"].get("acceptance_rate"))
            snap[f"d@{layer}"] = summary["options"].get("num_speculations")
    return snap


def plot(curves: dict[str, dict[str, Any]], layers: list[int], out: Path,
         twin: dict[str, dict[str, Any]] | None = None) -> Path:
    fig, axes = plt.subplots(1, 3, figsize=(15, 6.2))
    colors = {"plain": "tab:gray", "layerskip": "tab:blue"}
    for name, curve in curves.items():
        steps, mid, low, high = series(curve, "em_last")
        axes[0].errorbar(steps, mid, yerr=[[m - lo for m, lo in zip(mid, low, strict=True)],
                                           [h - m for m, h in zip(mid, high, strict=True)]],
                         marker="o", capsize=3, color=colors.get(name), label=f"{name} (last layer)")
        for index, layer in enumerate(layers):
            style = ["-", "--", ":"][index % 3]
            f_steps, values = fraction(curve, layer)
            axes[1].plot(f_steps, values, style, marker="o", color=colors.get(name), label=f"{name} E={layer}")
            a_steps, a_mid, _, _ = series(curve, f"acceptance@{layer}")
            axes[2].plot(a_steps, a_mid, style, marker="o", color=colors.get(name), label=f"{name} E={layer}")
    for name, snap in (twin or {}).items():  # the twin's own run: its quality sample, its d
        color, step = colors.get(name), snap["step"]
        em = snap.get("em_last")
        if em:
            error = [[em["estimate"] - em["low"]], [em["high"] - em["estimate"]]]
            axes[0].errorbar([step], [em["estimate"]], yerr=error, marker="s", ms=8, mfc="none", capsize=3, color=color,
                             label=f"{name}: twin run (n={em['n']})")
        for index, layer in enumerate(layers):
            marker = ["s", "D", "^"][index % 3]
            if snap.get(f"em_fraction@{layer}") is not None:
                axes[1].plot([step], [snap[f"em_fraction@{layer}"]], marker, ms=8, mfc="none", color=color,
                             label=f"{name} E={layer}: twin run")
            acceptance = snap.get(f"acceptance@{layer}")
            if acceptance:
                axes[2].plot([step], [acceptance["estimate"]], marker, ms=8, mfc="none", color=color,
                             label=f"{name} E={layer}: twin run (d={snap.get(f'd@{layer}')}, n={acceptance['n']})")
    axes[0].axhline(TARGETS["plain_em"], color="black", lw=0.8, ls="--", label="target 0.50")
    axes[1].axhline(TARGETS["exit_fraction_deep"], color="black", lw=0.8, ls="--", label="target 0.50 (E/L 0.75)")
    axes[2].axhline(TARGETS["acceptance_mid"], color="black", lw=0.8, ls="--", label="target 0.80 (E/L 0.5)")
    titles = ("TOPv2 exact match, last layer (95% CI)", "early-exit EM / last-layer EM", "self-speculative acceptance")
    for axis, title in zip(axes, titles, strict=True):
        axis.set_xscale("log")
        axis.set_xlabel("training steps (x 24 examples)")
        axis.set_title(title, fontsize=10)
        axis.grid(alpha=0.3)
        # below the axes: a legend never covers a point
        axis.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)
    n = next(iter(curves.values()))["snapshots"][0]["em_last"]["n"]
    fig.suptitle(f"TOPv2-only finetunes of SmolLM2-135M (30 layers), n = {n} stratified test prompts per point",
                 fontsize=11)
    fig.tight_layout()
    path = out.with_suffix(".png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("plain", type=Path)
    parser.add_argument("layerskip", type=Path, nargs="?", help="absent: plain's curve alone")
    parser.add_argument("--out", type=Path, required=True, help="path without suffix")
    parser.add_argument("--twin", type=Path, help="a twin's results folder: its own run drawn at its step budget")
    args = parser.parse_args()
    curves = {"plain": load(args.plain)}
    if args.layerskip is not None and args.layerskip.exists():
        curves["layerskip"] = load(args.layerskip)
    layers = curves["plain"]["exit_layers"]
    mid, deep = layers[len(layers) // 2], layers[-1]
    twin = {}
    if args.twin is not None:
        twin = {name: snap for name in curves if (snap := twin_snapshot(args.twin, name, layers)) is not None}
        if not twin:
            raise SystemExit(f"--twin: no training report and greedy result of plain or layerskip under {args.twin}")
    png = plot(curves, layers, args.out, twin)
    summary = targets(curves["plain"], curves.get("layerskip", {"snapshots": []}), mid, deep)
    if twin:
        summary["twin_run"] = {name: {k: v for k, v in snap.items()} for name, snap in twin.items()}
    summary_path = args.out.parent / f"{args.out.name}_targets.json"
    summary_path.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"wrote {png} and {summary_path}")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
