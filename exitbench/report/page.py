"""``results/index.html``: the report and the check as one page to look at, with every table sortable and,
per (model, task), the outputs themselves side by side (what early exit wrote where greedy wrote the right parse).

Rendered from what the report and check stages wrote (``README.md``, ``check.md``: the tables are not built a
second time) with markdown-it-py, and from the per-sample records under ``eval/`` (JSON only: no model, no torch).
Every model output is HTML-escaped: it is text a model wrote, shown, never interpreted.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from markdown_it import MarkdownIt

from exitbench.data.io import atomic_write_text, read_jsonl
from exitbench.tasks.base import Sample, Task, TaskSettings
from exitbench.tasks.registry import TASKS

GREEDY = "autoregressive"
SHOWN_SAMPLES = 6  # per (model, task): the first of the seeded, stratified sample (identical across methods)
PROMPT_TAIL = 240  # characters of the prompt shown (its end: the question being answered)

_SORT_SCRIPT = """
document.querySelectorAll("table").forEach(table => {
  table.querySelectorAll("th").forEach((th, column) => {
    th.title = "click to sort";
    th.addEventListener("click", () => {
      const body = table.tBodies[0], rows = Array.from(body.rows);
      const key = r => { const t = (r.cells[column] || {}).innerText || ""; const n = parseFloat(t);
                         return isNaN(n) ? t : n; };
      const up = th.dataset.order !== "up"; th.dataset.order = up ? "up" : "down";
      rows.sort((a, b) => { const x = key(a), y = key(b);
        return (x > y ? 1 : x < y ? -1 : 0) * (up ? 1 : -1); });
      rows.forEach(r => body.appendChild(r));
    });
  });
});
"""

_IMAGE_SCRIPT = """
document.querySelectorAll("img").forEach(img => {
  const mark = () => {
    img.dataset.loaded = img.naturalWidth > 0 ? "yes" : "no";
    if (img.naturalWidth === 0) img.insertAdjacentText("afterend", " [missing image: " + img.getAttribute("src") + "]");
  };
  if (img.complete) mark(); else { img.addEventListener("load", mark); img.addEventListener("error", mark); }
});
window.addEventListener("load", () => document.querySelectorAll("h1[id], h2[id], h3[id]").forEach(h => {
  h.dataset.y = Math.round(h.getBoundingClientRect().top + window.scrollY);  // where a section starts (screenshots)
}));
"""

_STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 1400px; padding: 0 1em; color: #222; }
table { border-collapse: collapse; margin: 0.8em 0; font-size: 13px; display: block; overflow-x: auto; }
th, td { border: 1px solid #ccc; padding: 3px 7px; vertical-align: top; }
th { background: #f2f2f2; cursor: pointer; }
td.out { font-family: ui-monospace, monospace; white-space: pre-wrap; max-width: 420px; }
td.right { background: #eaf7ea; } td.wrong { background: #fbecec; }
img { max-width: 100%; } nav a { margin-right: 1em; }
"""


@dataclass(frozen=True)
class Shown:
    """One sample of one (model, task): its prompt's end, reference, and each method's output with its score."""

    sample_id: str
    prompt: str
    reference: str
    outputs: dict[str, tuple[str, float | None]]


def render_markdown(text: str) -> str:
    """CommonMark with tables, raw HTML off (the report's text is ours, but stays data); every heading gets a
    unique id from its text, a sub-heading after its section's (``quality-speed-and-exactness-per-task-topv2``),
    so a link can point at one table."""
    md = MarkdownIt("commonmark", {"html": False}).enable("table")
    tokens = md.parse(text)
    parents: dict[int, str] = {}  # level -> the id of the last heading of that level
    used: set[str] = set()
    for index, token in enumerate(tokens):
        if token.type == "heading_open":
            level = int(token.tag[1])
            above = [parents[k] for k in sorted(parents) if k < level and k > 1]  # h1 is the page's title
            name = slug(tokens[index + 1].content)
            wanted = f"{above[-1]}-{name}" if level > 2 and above else name  # topv2 under its section's id
            anchor, repeat = wanted, 0
            while anchor in used:
                repeat += 1
                anchor = f"{wanted}-{repeat}"
            used.add(anchor)
            parents = {k: v for k, v in parents.items() if k < level} | {level: anchor}
            token.attrSet("id", anchor)
    return md.renderer.render(tokens, md.options, {})


def slug(title: str) -> str:
    """A heading's anchor: lower case, words joined by '-', nothing else (GitHub's anchors, near enough)."""
    return "-".join(re.findall(r"[a-z0-9]+", title.lower()))


def _records(path: Path) -> dict[str, dict[str, Any]]:
    return {record["sample_id"]: record for record in read_jsonl(path) if isinstance(record, dict)}


def _task_samples(task: Task, data_dir: Path, drawn: int, ids: Iterable[str]) -> dict[str, Sample]:
    """The :class:`~exitbench.tasks.base.Sample` of each id among the task's first ``drawn`` (the evaluate stage's
    seeded draw, prefix-stable), rebuilt from the prepared data; empty when the data is not there."""
    folder = data_dir / task.name
    needed = [folder / f"{name}.jsonl" for name in (task.split, *task.context_splits)]
    if not all(path.exists() for path in needed):
        return {}
    task.set_context({name: read_jsonl(folder / f"{name}.jsonl") for name in task.context_splits})
    wanted = set(ids)
    return {s.sample_id: s for s in task.samples(read_jsonl(needed[0]), drawn) if s.sample_id in wanted}


def shown_outputs(eval_dir: Path, data_dir: Path, model: str, task_name: str, seed: int) -> list[Shown]:
    """The first :data:`SHOWN_SAMPLES` samples of (``model``, ``task_name``) with greedy's output and every
    other method's on the same sample."""
    greedy_file = eval_dir / GREEDY / model / task_name / f"{GREEDY}.jsonl"
    if not greedy_file.exists() or task_name not in TASKS:
        return []
    task = TASKS[task_name](TaskSettings(seed=seed))
    greedy = _records(greedy_file)
    order = sorted(greedy.values(), key=lambda record: record.get("index", 0))[:SHOWN_SAMPLES]
    methods: dict[str, dict[str, dict[str, Any]]] = {}
    for path in sorted(eval_dir.glob(f"*/{model}/{task_name}/*.jsonl")):
        if path != greedy_file:
            methods[path.stem] = _records(path)
    drawn = 1 + max((record.get("index", 0) for record in greedy.values()), default=0)
    samples = _task_samples(task, data_dir, drawn, [record["sample_id"] for record in order])
    shown = []
    for record in order:
        sample_id = record["sample_id"]
        sample = samples.get(sample_id)
        outputs = {GREEDY: (record.get("completion", ""), (record.get("scores") or {}).get(task.primary_metric))}
        for label, records in methods.items():
            other = records.get(sample_id)
            if other is not None and other.get("completion") is not None:
                outputs[label] = (other["completion"], (other.get("scores") or {}).get(task.primary_metric))
        shown.append(Shown(sample_id, sample.prompt[-PROMPT_TAIL:] if sample else "", sample.reference if sample
                           else "", outputs))
    return shown


def _outputs_table(model: str, task_name: str, shown: list[Shown]) -> str:
    metric = TASKS[task_name].primary_metric
    labels = sorted({label for item in shown for label in item.outputs}, key=lambda name: (name != GREEDY, name))
    head = "".join(f"<th>{html.escape(label)}</th>" for label in labels)
    rows = []
    for item in shown:
        cells = []
        for label in labels:
            text, score = item.outputs.get(label, ("", None))
            kind = "" if score is None else (" right" if score >= 1.0 else " wrong" if score == 0.0 else "")
            note = "" if score is None else f"\n[{metric} {score:.2f}]"
            cells.append(f'<td class="out{kind}">{html.escape(text + note)}</td>')
        rows.append(f"<tr><td>{html.escape(item.sample_id)}</td><td class=\"out\">…{html.escape(item.prompt)}</td>"
                    f"<td class=\"out\">{html.escape(item.reference)}</td>{''.join(cells)}</tr>")
    return (f'<h3 id="outputs-{slug(model + " " + task_name)}">{html.escape(model)} / {html.escape(task_name)}</h3>'
            f"\n<table><thead><tr><th>sample</th>"
            f"<th>prompt (end)</th><th>reference</th>{head}</tr></thead><tbody>\n" + "\n".join(rows)
            + "\n</tbody></table>")


def render_page(results_dir: Path, data_dir: Path, seed: int) -> str:
    """The whole page: navigation, the report, the check, then the outputs of every (model, task)."""
    parts = []
    for name, title in (("check.md", "Against the papers"), ("README.md", "Results")):
        path = results_dir / name
        if path.exists():
            parts.append(f'<section id="{name.split(".")[0].lower()}"><h1>{title}</h1>'
                         f"{render_markdown(path.read_text())}</section>")
    eval_dir = results_dir / "eval"
    pairs = sorted({(p.parent.parent.name, p.parent.name) for p in eval_dir.glob(f"{GREEDY}/*/*/{GREEDY}.jsonl")})
    tables = [_outputs_table(model, task, shown) for model, task in pairs
              if (shown := shown_outputs(eval_dir, data_dir, model, task, seed))]
    if tables:
        parts.append('<section id="outputs"><h1>Outputs side by side</h1><p>The first samples of each (model, '
                     "task), identical for every method; green: the primary metric is 1, red: 0.</p>"
                     + "\n".join(tables) + "</section>")
    nav = ('<nav><a href="#check">Against the papers</a><a href="#readme">Results</a>'
           '<a href="#outputs">Outputs</a></nav>')
    return (f"<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>exitbench results</title>"
            f"<style>{_STYLE}</style></head>\n<body>{nav}\n" + "\n".join(parts)
            + f"\n<script>{_SORT_SCRIPT}{_IMAGE_SCRIPT}</script>\n</body></html>\n")


def write_page(results_dir: str | Path, data_dir: str | Path, out: str | Path, seed: int) -> Path:
    """Write :func:`render_page` to ``out`` atomically (``seed``: base.seed, the samples' draw); returns its path."""
    return atomic_write_text(Path(out), render_page(Path(results_dir), Path(data_dir), seed))


def page_summary(path: Path) -> str:
    """What a written page holds, for the stage's log line."""
    text = path.read_text()
    outputs = text.count('<h3 id="outputs-')
    return f"{text.count('<table>')} tables, {outputs} output tables, {len(text.encode()) // 1024} KiB"
