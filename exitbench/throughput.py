"""Latency vs throughput: batched decoding at several batch sizes, each method beside greedy at the same B.

Protocol (what makes the numbers comparable):

- one model, one task, ``num_prompts`` prompts drawn by the task's seeded, stratified sampler (TOPv2: all
  its domains); their ids are recorded. At batch size ``B`` the prompts are cut, in that order, into
  ``num_prompts // B`` batches (the rest, if any, is left out and said so);
- every method (greedy, ``autoregressive``, included) decodes every batch; methods are interleaved per
  batch (the order rotates from batch to batch), after one discarded warm-up call of each method;
- a batch's time is its wall time from the first prefill to the last row's last token; throughput is
  generated tokens per second (all rows); the speed-up over greedy at the same ``B`` is greedy's time per
  generated token / the method's, with a paired bootstrap interval over batches
  (:func:`exitbench.stats.speedup_interval`, ``n`` = batches), and greedy's scaling is its throughput
  at ``B`` over its throughput at ``B = 1``;
- exactness: each row's tokens at ``B > 1`` against the same method's at ``B = 1`` (batching must not
  change a row), and for exact methods against greedy's at ``B = 1`` too;
- self-speculation reports its acceptance (accepted / drafted, interval over rows) and its spread
  across rows, and the share of drafted positions that verification rejected; CALM its mean exit layer
  per token and the batch-effective depth (the deepest live row's exit, which every row of the step paid);
- every batch pays for padding its prompts to the longest: the share of padded prefill positions is
  reported.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from exitbench.batched import BatchedMethod, BatchResult, batched_method
from exitbench.config import Config, stage_view
from exitbench.data.io import atomic_write_json, atomic_write_text
from exitbench.decoding import StopRule, method_class
from exitbench.errors import ExitbenchError
from exitbench.exit_vocab import model_exit_vocabulary, write_draft_vocab
from exitbench.models.load import load_early_exit_model, load_tokenizer
from exitbench.prompts import encode_prompt, load_samples, sample_info, stop_rule
from exitbench.provenance import provenance
from exitbench.stats import Interval, ratio_interval, speedup_interval
from exitbench.tasks.registry import TaskSettings, build_task

GREEDY = "autoregressive"
COLUMNS = (
    "method", "batch_size", "num_batches", "num_sequences", "num_tokens", "tokens_per_s", "ms_per_token",
    "speedup_vs_greedy", "speedup_vs_greedy_low", "speedup_vs_greedy_high", "greedy_scaling_vs_b1",
    "mismatches_vs_b1", "mismatches_vs_greedy_b1", "acceptance_rate", "acceptance_rate_low",
    "acceptance_rate_high", "row_acceptance_min", "row_acceptance_median", "row_acceptance_max",
    "rejected_draft_share", "mean_exit_layer", "batch_effective_depth", "carried_layer_share",
    "padded_prefill_share",
)


def batches_of(prompts: Sequence[Sequence[int]], batch_size: int) -> list[list[list[int]]]:
    """Consecutive full batches of ``batch_size`` prompts (a remainder is left out)."""
    usable = len(prompts) - len(prompts) % batch_size
    return [[list(p) for p in prompts[i : i + batch_size]] for i in range(0, usable, batch_size)]


def rotated(labels: Sequence[str], shift: int) -> list[str]:
    shift %= len(labels)
    return [*labels[shift:], *labels[:shift]]


def run_batches(
    methods: dict[str, BatchedMethod],
    prompts: Sequence[Sequence[int]],
    batch_sizes: Sequence[int],
    max_new_tokens: int,
    stop: StopRule,
    repeats: int = 1,
    progress: bool = True,
) -> dict[tuple[str, int], list[list[BatchResult]]]:
    """``{(method, B): [batch][repeat] -> BatchResult}``, methods interleaved per batch, after one warm-up each."""
    labels = list(methods)
    warm = [list(p) for p in prompts[: min(2, len(prompts))]]
    for label in labels:
        methods[label](warm, min(4, max_new_tokens), stop)
    runs: dict[tuple[str, int], list[list[BatchResult]]] = {}
    plan = [(b, j, batch) for b in batch_sizes for j, batch in enumerate(batches_of(prompts, b))]
    for b in batch_sizes:
        for label in labels:
            runs[(label, b)] = [[] for _ in batches_of(prompts, b)]
    steps = tqdm(total=len(plan) * repeats * len(labels), desc="throughput", unit="batch", disable=not progress)
    for repeat in range(repeats):
        for b, j, batch in plan:
            for label in rotated(labels, j + repeat):
                torch.manual_seed(0)
                runs[(label, b)][j].append(methods[label](batch, max_new_tokens, stop))
                steps.update()
    steps.close()
    return runs


def _interval_fields(name: str, interval: Interval | None) -> dict[str, Any]:
    if interval is None:
        return {name: None, f"{name}_low": None, f"{name}_high": None, f"{name}_n": None}
    low, high = interval.low, interval.high
    return {name: interval.estimate, f"{name}_low": low, f"{name}_high": high, f"{name}_n": interval.n}


def _rows_tokens(batches: list[list[BatchResult]]) -> list[list[int]]:
    """Every sequence's tokens in prompt order (the first repeat)."""
    return [row for batch in batches for row in batch[0].tokens]


def _mismatches(tokens: list[list[int]], reference: list[list[int]] | None) -> int | None:
    if reference is None:
        return None
    return sum(a != b for a, b in zip(tokens, reference, strict=False))


def summarize(
    runs: dict[tuple[str, int], list[list[BatchResult]]], exact: dict[str, bool], seed: int
) -> list[dict[str, Any]]:
    """One row per (method, B): throughput, the paired speed-up over greedy at that B, exactness, costs."""
    rows = []
    greedy_b1 = runs.get((GREEDY, 1))
    greedy_rate_b1 = None
    if greedy_b1:
        flat = [r for batch in greedy_b1 for r in batch]
        greedy_rate_b1 = sum(r.num_tokens for r in flat) / sum(r.wall_time_s for r in flat)
    for (label, b), batches in runs.items():
        if not batches:
            continue
        seconds = [sum(r.wall_time_s for r in batch) for batch in batches]
        tokens = [sum(r.num_tokens for r in batch) for batch in batches]
        greedy = runs[(GREEDY, b)]
        g_seconds = [sum(r.wall_time_s for r in batch) for batch in greedy]
        g_tokens = [sum(r.num_tokens for r in batch) for batch in greedy]
        speedup = speedup_interval(g_seconds, g_tokens, seconds, tokens, seed)
        sequences = _rows_tokens(batches)
        own_b1 = _rows_tokens(runs[(label, 1)]) if runs.get((label, 1)) else None
        greedy_ref = _rows_tokens(greedy_b1) if greedy_b1 and exact.get(label) else None
        rate = sum(tokens) / sum(seconds)
        row: dict[str, Any] = {
            "method": label, "batch_size": b, "num_batches": len(batches), "num_sequences": len(sequences),
            "num_tokens": sum(tokens), "tokens_per_s": rate, "ms_per_token": 1000.0 * sum(seconds) / sum(tokens),
            **_interval_fields("speedup_vs_greedy", speedup),
            "greedy_scaling_vs_b1": rate / greedy_rate_b1 if label == GREEDY and greedy_rate_b1 else None,
            "mismatches_vs_b1": _mismatches(sequences, own_b1) if b != 1 else None,
            "mismatches_vs_greedy_b1": _mismatches(sequences, greedy_ref) if label != GREEDY else None,
        }
        row.update(_method_costs([r for batch in batches for r in batch], seed))
        rows.append(row)
    return rows


def _method_costs(results: list[BatchResult], seed: int) -> dict[str, Any]:
    """Acceptance and its spread over rows (self-speculation), exit depths (CALM, early exit), waste."""
    out: dict[str, Any] = {}
    work = {key: sum(r.work.get(key, 0) for r in results) for key in {k for r in results for k in r.work}}
    if work.get("prefill_positions"):
        out["padded_prefill_share"] = work["padded_prefill_positions"] / work["prefill_positions"]
    per_row = [row for r in results for row in r.rows]
    drafted = [row["drafted"] for row in per_row if "drafted" in row]
    if drafted and sum(drafted):
        accepted = [row["accepted"] for row in per_row if "drafted" in row]
        out.update(_interval_fields("acceptance_rate", ratio_interval(accepted, drafted, seed)))
        shares = [a / d for a, d in zip(accepted, drafted, strict=True) if d]
        out.update(row_acceptance_min=min(shares), row_acceptance_median=float(np.median(shares)),
                   row_acceptance_max=max(shares), rejected_draft_share=work["rejected_draft_positions"] / sum(drafted))
    exits = [layer for row in per_row for layer in row.get("exit_layers", [])[1:]]  # the prefill's token: full depth
    if exits:
        out["mean_exit_layer"] = float(np.mean(exits))
    depths = [d for r in results for d in r.step_depths]
    if depths:
        out["batch_effective_depth"] = float(np.mean(depths))
        out["carried_layer_share"] = work.get("carried_token_layers", 0) / max(work.get("run_token_layers", 0), 1)
    return out


def build_methods(
    cfg: Config, model: Any, draft_vocab: Path | None, say: Any = print
) -> tuple[dict[str, BatchedMethod], list[dict[str, str]]]:
    """Greedy plus every ``throughput.methods`` entry that has a batched form; the others are skipped with
    one line each (the rest still run)."""
    methods = {GREEDY: batched_method(GREEDY, model, {})}
    skipped = []
    for label, options in cfg.throughput.methods.items():
        if label == GREEDY:
            continue
        opts = dict(options)
        cls = method_class(label)
        takes_vocab = "draft_vocab_file" in cls.Options.model_fields
        if draft_vocab is not None and takes_vocab and "draft_vocab_file" not in opts:
            opts["draft_vocab_file"] = str(draft_vocab)
        try:
            methods[label] = batched_method(label, model, opts)
        except ExitbenchError as err:
            skipped.append({"what": label, "why": str(err)})
            say(f"throughput: skipped method '{label}': {err}")
    return methods, skipped


def run_throughput(
    cfg: Config,
    models_dir: Path,
    data_dir: Path,
    out_dir: Path,
    progress: bool = True,
    train_reports: Path | None = None,
) -> dict[str, Any]:
    """The whole stage: load, measure, summarise, write ``throughput.{json,csv}`` under ``out_dir``.
    ``train_reports``: the training reports' folder (a model trained with ``exit_vocab_size`` drafts over its
    exits' set, as in evaluate)."""
    tp = cfg.throughput
    model_dir = models_dir / tp.model
    if not (model_dir / "config.json").exists():
        raise ExitbenchError(f"throughput: model '{tp.model}' not found at {model_dir}; run `dvc repro` up to it first")
    task = build_task(tp.task, TaskSettings(cfg.base.seed, 10.0))
    samples = load_samples(task, data_dir, tp.num_prompts)
    model = load_early_exit_model(model_dir, cfg.base.dtype, cfg.base.device)
    tokenizer = load_tokenizer(model_dir)
    prompts = [encode_prompt(tokenizer, s.prompt, tp.chat_template) for s in samples]
    stop = stop_rule(tokenizer, task)
    draft_vocab = None
    if tp.draft_vocab_size:
        trained = model_exit_vocabulary(train_reports, tp.model, data_dir, tokenizer)
        target = out_dir / "draft_vocab.json"
        size = tp.draft_vocab_size
        draft_vocab = write_draft_vocab(trained, task, data_dir, tokenizer, size, stop.eos_token_ids, target)
    methods, skipped = build_methods(cfg, model, draft_vocab)
    sizes = []
    for b in tp.batch_sizes:
        if b > len(prompts):
            why = f"batch size {b} is larger than throughput.num_prompts ({len(prompts)}); raise num_prompts"
            skipped.append({"what": f"B={b}", "why": why})
            print(f"throughput: skipped {why}")
        else:
            sizes.append(b)
    if not sizes:
        raise ExitbenchError("throughput: no batch size fits throughput.num_prompts; lower throughput.batch_sizes")
    runs = run_batches(methods, prompts, sizes, tp.max_new_tokens, stop, tp.repeats, progress)
    exact = {label: method_class(label).exact for label in methods}
    rows = summarize(runs, exact, cfg.base.seed)
    left_out = {b: len(prompts) % b for b in sizes if len(prompts) % b}
    report = {
        "provenance": provenance(stage_view(cfg, "throughput"), model.device, cfg.base.dtype),
        "model": tp.model, "task": tp.task, "max_new_tokens": tp.max_new_tokens, "repeats": tp.repeats,
        "samples": {**sample_info(task, samples), "ids": [s.sample_id for s in samples]},
        "prompts_left_out": left_out, "skipped": skipped,
        "methods": {label: m.options.model_dump() for label, m in methods.items()},
        "rows": rows,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out_dir / "throughput.json", report)
    atomic_write_text(out_dir / "throughput.csv", csv_text(rows))
    return report


def csv_text(rows: Sequence[dict[str, Any]]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(COLUMNS), extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({key: "" if row.get(key) is None else row[key] for key in COLUMNS})
    return buffer.getvalue()
