"""Readable plots: short point labels (at most 40 characters, no file path), and no text drawn over another in
any committed plot (the committed results of every run: the default one and each twin) nor in the fixture
results."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from exitbench.replications import load_replications
from exitbench.report import plots
from exitbench.report.results import load_results

REPO = Path(__file__).resolve().parents[1]
PAPERS = load_replications(REPO / "replications")
ROOTS = [REPO / "results", *sorted(p for p in (REPO / "results" / "twins").glob("*") if (p / "eval").is_dir()),
         Path(__file__).parent / "fixtures" / "results"]


def _figures(root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Figure]:
    drawn: dict[str, Figure] = {}

    def keep(fig: Figure, out_dir: Path, name: str) -> list[Path]:
        if not hasattr(fig.canvas, "get_renderer"):  # a figure drawn without plots._figure
            FigureCanvasAgg(fig)
        fig.canvas.draw()  # the layout and text positions as saved
        drawn[name] = fig
        return []

    monkeypatch.setattr(plots, "_save", keep)
    plots.write_plots(load_results(root), PAPERS, tmp_path)
    return drawn


def _overlaps(fig: Figure) -> list[tuple[str, str, float]]:
    """Pairs of visible, non-empty texts inside one axes whose boxes overlap (by more than 1 square pixel)."""
    renderer = fig.canvas.get_renderer()
    found = []
    for ax in fig.axes:
        texts: list[Any] = [t for t in ax.texts if t.get_visible() and t.get_text().strip()]
        boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in texts]
        for (a, box_a), (b, box_b) in itertools.combinations(boxes, 2):
            area = plots._overlap(box_a, box_b)
            if area > 1.0:
                found.append((a, b, area))
    return found


@pytest.mark.parametrize("root", [r for r in ROOTS if r.is_dir()], ids=lambda p: p.relative_to(REPO).as_posix())
def test_no_text_is_drawn_over_another(root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    figures = _figures(root, tmp_path, monkeypatch)
    assert figures, f"no plot drawn from {root}"
    clashes = {name: found for name, fig in figures.items() if (found := _overlaps(fig))}
    assert not clashes, clashes


def test_point_labels_are_short_and_name_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    results = load_results(REPO / "results")
    labels = {plots.point_label(r) for r in results.evals}
    assert "self-spec E12 d1 sub-vocab" in labels and "early exit E15" in labels
    assert all(len(label) <= 40 and "/" not in label and ".json" not in label for label in labels), labels
    figures = _figures(REPO / "results", tmp_path, monkeypatch)
    texts = [t.get_text() for t in figures["speedup_vs_quality_topv2"].axes[0].texts]
    assert "self-spec E12 d1 sub-vocab" in texts and not any("draft_vocab_file" in t for t in texts)
