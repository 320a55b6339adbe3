"""The decoding benchmark: a sweep of exit layer E x speculations d, timed against greedy in the same run.

Protocol (what makes the numbers comparable):

- every method decodes the same prompts, with the same model, dtype, stop rule and token budget;
- one warm-up generation per method is run first and discarded;
- methods are interleaved per prompt and repeat (A B C .. A B C ..), so drift in machine speed (thermal,
  other load) hits every method alike; the seed is reset before each generation;
- :meth:`DecodingMethod.generate` times with ``time.perf_counter`` and synchronises CUDA before reading
  the clock; torch's thread count comes from ``base.threads`` and is recorded in the provenance block;
- time per token is reported as the median and inter-quartile range over prompts x repeats, and the
  speed-up as LayerSkip defines it (Elhoushi et al. 2024, §5): the time per generated token of greedy
  autoregressive decoding / that of the method (total seconds / total tokens, as `evaluate` computes it),
  both measured in this run; its 95% interval is a paired bootstrap over prompts
  (:func:`exitbench.stats.speedup_interval`, repeats summed per prompt), and the acceptance rate's one
  resamples prompts' accepted / drafted counts (:func:`exitbench.stats.ratio_interval`);
- exactness: the method's tokens against greedy's for every prompt (mismatches, first divergence);
- the ideal speed-up of speculative decoding (Leviathan et al. 2023, Theorem 3.8, with LayerSkip's
  verify cost, see :mod:`exitbench.cost_model`) uses the per-token acceptance ``a`` derived from the
  measured acceptance rate and step costs measured on the same model: ``c_draft`` (one draft step, E
  layers + head, relative to one full greedy step) and ``c_verify`` (one verification forward over d + 1
  positions: layers E..L-1 for self-speculation, which reuses the draft's layers, or all L layers for
  the peers that re-run them), each the median of a small timed loop.

A peer in ``bench.peers`` runs at the same (E, d) as self-speculation: ``hf_early_exit`` drafts with E
layers; ``speculative`` drafts with a separate-cache view of the first E layers (shared weights), so it
differs from self-speculation only in what draft and verify share.
"""

from __future__ import annotations

import copy
import csv
import dataclasses
import io
import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from exitbench.config import BenchConfig, Config, check_exit_layers, stage_view
from exitbench.cost_model import SUBVOCAB_TAG, alpha_from_acceptance_rate, fraction_of_ideal, ideal_speedup
from exitbench.data.io import atomic_write_json, atomic_write_text, read_jsonl
from exitbench.decoding import DecodeResult, DecodingMethod, StopRule, build_method, method_class
from exitbench.decoding.draft_verify import DraftHead
from exitbench.decoding.steps import as_ids, draft_hidden, full_step, greedy, prefill
from exitbench.errors import ExitbenchError
from exitbench.exit_vocab import model_exit_vocabulary, write_draft_vocab
from exitbench.models.load import load_early_exit_model, load_tokenizer
from exitbench.models.view import EarlyExitModel
from exitbench.prompts import encode_prompt, first_divergence, stop_rule
from exitbench.provenance import provenance
from exitbench.roofline import Bandwidth, ReadCounter, measure_bandwidth, roofline_fraction
from exitbench.stats import DEFAULT_SEED, Interval, median_interval, ratio_interval, speedup_interval
from exitbench.subvocab import task_train_path
from exitbench.tasks.registry import Task, TaskSettings, build_task
from exitbench.timing import interleaved_medians

BASELINE = "autoregressive"
#: the A/A control's tag: greedy timed against greedy exactly like a method; its speed-up interval must contain
#: 1.00x, and its width is the timing noise of the run (Spec-Bench's protocol has no such row; a noise floor
#: needs one)
CONTROL_TAG = " (A/A)"
SHARED_VERIFY = frozenset({"self_speculative"})  # methods whose verify pass starts at layer E
INTERVAL_METRICS = ("speedup_vs_greedy", "acceptance_rate")  # each row: <metric>, _low, _high, _n (95%)
COLUMNS = (
    "model",
    "dtype",
    "method",
    "exit_layer",
    "num_speculations",
    "time_per_token_ms",
    "iqr_ms",
    "mean_time_per_token_ms",
    "speedup_vs_greedy",
    "speedup_vs_greedy_low",
    "speedup_vs_greedy_high",
    "speedup_vs_greedy_n",
    "acceptance_rate",
    "acceptance_rate_low",
    "acceptance_rate_high",
    "acceptance_rate_n",
    "alpha",
    "tokens_per_round",
    "c_draft",
    "c_draft_low",
    "c_draft_high",
    "c_tail",
    "c_tail_low",
    "c_tail_high",
    "c_verify",
    "c_verify_low",
    "c_verify_high",
    "ideal_speedup",
    "ideal_fraction",
    "exact",
    "num_mismatched",
    "first_divergence",
    "num_prompts",
    "repeats",
    "max_new_tokens",
    "mean_new_tokens",
    "bytes_per_token",
    "roofline_ms_per_token",
    "roofline_fraction",
)


@dataclass(frozen=True)
class SweepEntry:
    """One method at one (E, d): what to build and how to label it."""

    method: str
    options: tuple[tuple[str, int | str], ...] = ()
    exit_layer: int | None = None
    num_speculations: int | None = None
    tag: str = ""  # distinguishes variants of one method, e.g. SUBVOCAB_TAG

    @property
    def name(self) -> str:
        return self.method + self.tag

    @property
    def label(self) -> str:
        if self.exit_layer is None and self.num_speculations is None:
            return self.name
        return f"{self.name}[E={self.exit_layer},d={self.num_speculations}]"


@dataclass(frozen=True)
class StepCosts:
    """Measured step costs relative to one full greedy step: the median over interleaved rounds of each round's
    ratio, with the interval of that median (:func:`~exitbench.stats.median_interval`) in ``bounds``."""

    full_step_s: float
    c_draft: float
    c_verify: float
    c_tail: float = 0.0  # the last draft's layers 0..E-1 (no head), run once a round by a verify from the exit
    bounds: dict[str, tuple[float, float]] = field(default_factory=dict)  # cost name -> (low, high)


COST_NAMES = ("c_draft", "c_tail", "c_verify")


def cost_fields(costs: StepCosts | None) -> dict[str, float | None]:
    """A sweep row's cost columns: each cost and its interval's ends (None where not measured)."""
    out: dict[str, float | None] = {}
    for name in COST_NAMES:
        low, high = costs.bounds.get(name, (None, None)) if costs else (None, None)
        out.update({name: getattr(costs, name) if costs else None, f"{name}_low": low, f"{name}_high": high})
    return out


def sweep_entries(bench: BenchConfig, num_layers: int, draft_vocab_file: str | None = None) -> list[SweepEntry]:
    """Greedy first, then self-speculation and each peer at every (E, d); an E outside 1..L-1 is an error.

    With ``draft_vocab_file``, self-speculation also runs with its draft head restricted to that file's ids.
    """
    check_exit_layers("bench.exit_layers", bench.exit_layers, num_layers)
    entries = [SweepEntry(BASELINE), SweepEntry(BASELINE, tag=CONTROL_TAG)]
    for exit_layer in bench.exit_layers:
        for d in bench.num_speculations:
            for name in ("self_speculative", *bench.peers):
                cls = method_class(name)
                fields = cls.Options.model_fields
                options = tuple(
                    (key, value)
                    for key, value in (("exit_layer", exit_layer), ("num_speculations", d))
                    if key in fields
                )
                uses_exit = "exit_layer" in fields or getattr(cls, "needs_draft", False)
                uses_d = "num_speculations" in fields
                entry = SweepEntry(name, options, exit_layer if uses_exit else None, d if uses_d else None)
                if entry not in entries:  # a peer without d (e.g. early_exit) runs once per E
                    entries.append(entry)
            if draft_vocab_file:
                options = (("exit_layer", exit_layer), ("num_speculations", d), ("draft_vocab_file", draft_vocab_file))
                entries.append(SweepEntry("self_speculative", options, exit_layer, d, tag=SUBVOCAB_TAG))
    return entries


def truncated_view(model: EarlyExitModel, num_layers: int) -> EarlyExitModel:
    """The first ``num_layers`` layers of ``model`` plus its head, as a separate model (weights shared).

    It gets its own KV cache (``new_cache``), so as a draft model it behaves like a separate small model.
    """
    view = copy.copy(model)
    view.layers = model.layers[:num_layers]
    view.shape = dataclasses.replace(model.shape, num_layers=num_layers)
    return view


def build_entry(entry: SweepEntry, model: EarlyExitModel) -> DecodingMethod:
    """The method of ``entry``; a method that needs a draft model gets the first E layers of ``model``."""
    cls = method_class(entry.method)
    draft = None
    if getattr(cls, "needs_draft", False):
        if entry.exit_layer is None:
            raise ExitbenchError(f"bench: method '{entry.method}' needs an exit layer for its draft model")
        draft = truncated_view(model, entry.exit_layer)
    return build_method(entry.method, model, dict(entry.options), draft_model=draft)


def run_interleaved(
    methods: dict[str, DecodingMethod],
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    stop: StopRule,
    repeats: int = 1,
    seed: int = 1234,
    progress: bool = True,
    desc: str = "bench",
    reads: dict[str, list[list[int]]] | None = None,
) -> dict[str, list[list[DecodeResult]]]:
    """Results ``[label][repeat][prompt]``, methods interleaved per (repeat, prompt), after one warm-up each.

    ``reads``, when given, is filled with the bytes each generation read (``[label][repeat][prompt]``,
    :class:`~exitbench.roofline.ReadCounter`, installed outside the timed call).
    """
    if not prompts:
        raise ExitbenchError("bench: no prompts to time")
    for method in methods.values():  # warm-up, discarded
        torch.manual_seed(seed)
        method.generate(prompts[0], min(8, max_new_tokens), stop)
    results: dict[str, list[list[DecodeResult]]] = {label: [[] for _ in range(repeats)] for label in methods}
    if reads is not None:
        reads.update({label: [[] for _ in range(repeats)] for label in methods})
    total = repeats * len(prompts) * len(methods)
    with tqdm(total=total, desc=desc, unit="gen", disable=not progress, leave=False) as bar:
        for repeat in range(repeats):
            for prompt in prompts:
                for label, method in methods.items():
                    torch.manual_seed(seed)
                    with ReadCounter(method.model, method.draft_model) as counter:
                        results[label][repeat].append(method.generate(prompt, max_new_tokens, stop))
                    if reads is not None:
                        reads[label][repeat].append(counter.bytes)
                    bar.update()
    return results


@torch.inference_mode()
def interleaved_times(fns: dict[str, Callable[[], Any]], iters: int, warmup: int = 2) -> dict[str, list[float]]:
    """Each entry's wall time in each of ``iters`` rounds, in :func:`~exitbench.timing.interleaved_medians`'
    order (entries alternating call by call, forward and reverse rounds): round i's times are neighbours in time,
    so their ratios are paired measurements. (Kept out of :mod:`exitbench.timing`, whose bytes key every stored
    generation through the models' kernel choice.)"""
    times: dict[str, list[float]] = {name: [] for name in fns}

    def recorded(name: str, fn: Callable[[], Any]) -> Callable[[], None]:
        def call() -> None:
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)

        return call

    interleaved_medians({name: recorded(name, fn) for name, fn in fns.items()}, iters, warmup)
    return {name: values[warmup:] for name, values in times.items()}


def measure_step_costs(
    model: EarlyExitModel,
    context: Sequence[int],
    exit_layer: int,
    num_speculations: int,
    verify_from_exit: bool = True,
    iters: int = 7,
    draft_vocab_file: str | None = None,
) -> StepCosts:
    """c_draft, c_tail and c_verify on ``model`` after ``context`` (a prompt), relative to one full greedy step.

    Each timed call writes the K/V of its positions and crops them off again, so every call sees the same
    cache length; the calls alternate (:func:`~exitbench.timing.interleaved_medians`), so a drift of the
    machine's speed falls on every cost alike. The draft step is what self-speculation runs per drafted token
    (layers 0..E-1, the shared head, argmax), over ``draft_vocab_file``'s ids when given; the tail is the last
    draft's layers 0..E-1 without the head, which a verification from the exit (``verify_from_exit``) needs;
    the verify step is one forward over d + 1 positions through layers E..L-1 (``verify_from_exit``) or
    0..L-1, the head and argmax over all positions.
    """
    length = len(context)
    d = num_speculations
    cache = model.new_cache(length + d + 2)
    prefill(model, cache, context)
    token = int(context[-1])
    verify_tokens = as_ids(model, [token] * (d + 1))
    first = exit_layer if verify_from_exit else 0
    head = DraftHead(model, draft_vocab_file or "")
    sync = torch.cuda.synchronize if model.device.type == "cuda" else (lambda: None)

    def timed(fn):
        def call() -> None:
            sync()
            fn()
            sync()

        return call

    def full() -> None:
        greedy(full_step(model, cache, token, length))
        cache.crop(length)

    def draft() -> None:
        head.propose(draft_hidden(model, cache, [token], length, exit_layer))
        cache.crop(length)

    def tail() -> None:
        draft_hidden(model, cache, [token], length, exit_layer)
        cache.crop(length)

    def verify() -> None:
        hidden = model.embed(verify_tokens)
        model.logits(model.forward_layers(hidden, first, model.num_layers, length, cache))[0].argmax(-1).tolist()
        cache.crop(length)

    fns = {"full": full, "draft": draft, "verify": verify} | ({"tail": tail} if verify_from_exit else {})
    times = interleaved_times({name: timed(fn) for name, fn in fns.items()}, iters)
    ratios = {
        f"c_{name}": median_interval([t / f for t, f in zip(times[name], times["full"], strict=True)])
        for name in fns
        if name != "full"
    }
    return StepCosts(
        full_step_s=statistics.median(times["full"]),
        c_draft=ratios["c_draft"].estimate,
        c_verify=ratios["c_verify"].estimate,
        c_tail=ratios["c_tail"].estimate if verify_from_exit else 0.0,
        bounds={name: (interval.low, interval.high) for name, interval in ratios.items()},
    )


#: token rows a verification forward may carry (d + 1 <= 8 in every profile's sweep and Table 6's d = 8 is 9)
VERIFY_ROWS = (1, 2, 3, 4, 6, 9)


@torch.inference_mode()
def measure_verify_scaling(
    model: EarlyExitModel, context: Sequence[int], exit_layer: int, rows: Sequence[int] = VERIFY_ROWS, iters: int = 9
) -> dict[str, Any]:
    """The cost of one verification forward (layers ``exit_layer..L-1``, the head, argmax) over ``rows`` token rows,
    relative to the same forward over one row, timed interleaved after ``context``.

    At batch 1 a forward reads each weight once whatever the rows if its kernels read them once, so the ratio
    is the price of a longer draft: near 1.0 up to the rows where arithmetic, not reading, takes over. It is
    what decides whether verifying d drafts is cheap, measured per machine and dtype rather than assumed.
    """
    length = len(context)
    cache = model.new_cache(length + max(rows) + 1)
    prefill(model, cache, context)

    def verify(count: int) -> Any:
        ids = as_ids(model, [int(context[-1])] * count)

        def call() -> None:
            hidden = model.forward_layers(model.embed(ids), exit_layer, model.num_layers, length, cache)
            model.logits(hidden)[0].argmax(-1).tolist()
            cache.crop(length)

        return call

    seconds = interleaved_medians({str(count): verify(count) for count in rows}, iters)
    one = seconds[str(rows[0])]
    return {
        "exit_layer": exit_layer,
        "rows": list(rows),
        "relative_cost": [round(seconds[str(count)] / one, 3) for count in rows],
        "one_row_ms": round(1000 * one, 3),
    }


def per_prompt_totals(runs: list[list[DecodeResult]]) -> np.ndarray:
    """``[4, prompts]``: seconds, tokens, accepted and drafted tokens per prompt, summed over repeats."""
    totals = np.zeros((4, len(runs[0])))
    for repeat in runs:
        for i, result in enumerate(repeat):
            totals[:, i] += (result.wall_time_s, result.num_tokens, result.num_accepted, result.num_drafted)
    return totals


def pass_speedups(runs: list[list[DecodeResult]], greedy_runs: list[list[DecodeResult]]) -> list[float] | None:
    """The speed-up of each timing pass (repeat) alone: greedy's time per token over the method's, both summed
    over the pass's prompts. Their spread says how much one pass can be trusted (Spec-Bench repeats its timing);
    None where a pass has no time or no tokens."""
    speedups = []
    for repeat, greedy_repeat in zip(runs, greedy_runs, strict=True):
        seconds, tokens = sum(r.wall_time_s for r in repeat), sum(r.num_tokens for r in repeat)
        g_seconds, g_tokens = sum(r.wall_time_s for r in greedy_repeat), sum(r.num_tokens for r in greedy_repeat)
        if min(seconds, tokens, g_seconds, g_tokens) <= 0:
            return None
        speedups.append((g_seconds / g_tokens) / (seconds / tokens))
    return speedups


def _flat(metric: str, interval: Interval) -> dict[str, Any]:
    return {
        metric: interval.estimate,
        f"{metric}_low": interval.low,
        f"{metric}_high": interval.high,
        f"{metric}_n": interval.n,
    }


def interval_fields(
    runs: list[list[DecodeResult]], greedy_runs: list[list[DecodeResult]], seed: int = DEFAULT_SEED
) -> dict[str, Any]:
    """Speed-up vs greedy (pairs of prompts) and acceptance, each with its 95% bootstrap interval over prompts.

    None where undefined (no tokens or no time; nothing drafted).
    """
    seconds, tokens, accepted, drafted = per_prompt_totals(runs)
    g_seconds, g_tokens, _, _ = per_prompt_totals(greedy_runs)
    fields: dict[str, Any] = dict.fromkeys(
        f"{metric}{suffix}" for metric in INTERVAL_METRICS for suffix in ("", "_low", "_high", "_n")
    )
    if seconds.sum() > 0 and tokens.sum() > 0 and g_tokens.sum() > 0:
        fields.update(_flat("speedup_vs_greedy", speedup_interval(g_seconds, g_tokens, seconds, tokens, seed)))
    if drafted.sum() > 0:
        fields.update(_flat("acceptance_rate", ratio_interval(accepted, drafted, seed)))
    return fields


def summarize_entry(
    entry: SweepEntry,
    runs: list[list[DecodeResult]],
    greedy_runs: list[list[DecodeResult]],
    costs: StepCosts | None,
    seed: int = DEFAULT_SEED,
    reads: list[list[int]] | None = None,
    bandwidth: Bandwidth | None = None,
) -> dict[str, Any]:
    """One sweep row: speed over prompts x repeats, acceptance, exactness and the ideal bound; with ``reads``
    (bytes per generation, as ``runs``) and the machine's ``bandwidth``, the roofline: bytes per token, the time
    they need at that bandwidth and its fraction of the measured time (:mod:`exitbench.roofline`)."""
    flat = [r for repeat in runs for r in repeat]
    per_token = np.array([r.time_per_token_ms for r in flat])
    q25, q75 = np.percentile(per_token, [25, 75])
    mean_ms = float(per_token.mean())
    rounds = sum(r.num_rounds for r in flat)
    intervals = interval_fields(runs, greedy_runs, seed)
    speedup, rate = intervals["speedup_vs_greedy"], intervals["acceptance_rate"]
    divergences = [
        first_divergence(r.tokens, g.tokens)
        for repeat, greedy_repeat in zip(runs, greedy_runs, strict=True)
        for r, g in zip(repeat, greedy_repeat, strict=True)
    ]
    num_prompts = len(runs[0])
    mismatched_prompts = {i % num_prompts for i, div in enumerate(divergences) if div is not None}
    row: dict[str, Any] = {
        "method": entry.name,
        "exit_layer": entry.exit_layer,
        "num_speculations": entry.num_speculations,
        "time_per_token_ms": float(np.median(per_token)),
        "iqr_ms": float(q75 - q25),
        "mean_time_per_token_ms": mean_ms,
        **intervals,
        "speedup_passes": pass_speedups(runs, greedy_runs),
        "alpha": None,
        "tokens_per_round": sum(r.num_tokens for r in flat) / rounds if rounds else None,
        **cost_fields(costs),
        "ideal_speedup": None,
        "ideal_fraction": None,
        "exact": not mismatched_prompts,
        "num_mismatched": len(mismatched_prompts),
        "first_divergence": min((d for d in divergences if d is not None), default=None),
        "num_prompts": num_prompts,
        "repeats": len(runs),
        "mean_new_tokens": float(np.mean([r.num_tokens for r in flat])),  # a stop rule may end generations early
        **roofline_fields(flat, [b for repeat in reads for b in repeat] if reads else [], bandwidth),
    }
    d = entry.num_speculations
    if costs is not None and rate is not None and d is not None and speedup is not None:
        alpha = alpha_from_acceptance_rate(rate, d)
        ideal = ideal_speedup(alpha, d, costs.c_draft, costs.c_verify, costs.c_tail)
        row.update(alpha=alpha, ideal_speedup=ideal, ideal_fraction=fraction_of_ideal(speedup, ideal))
    return row


def roofline_fields(
    results: Sequence[DecodeResult], reads: Sequence[int], bandwidth: Bandwidth | None
) -> dict[str, float | None]:
    """``bytes_per_token``, ``roofline_ms_per_token`` and ``roofline_fraction`` over ``results`` (total bytes,
    tokens and seconds); None where nothing was counted (a method outside exitbench's forward) or measured."""
    tokens = sum(r.num_tokens for r in results)
    total = float(sum(reads))
    if bandwidth is None or total <= 0 or tokens == 0:
        return dict.fromkeys(("bytes_per_token", "roofline_ms_per_token", "roofline_fraction"))
    seconds = sum(r.wall_time_s for r in results)
    return {
        "bytes_per_token": total / tokens,
        "roofline_ms_per_token": 1000.0 * total / tokens / (bandwidth.gb_per_s * 1e9),
        "roofline_fraction": roofline_fraction(total, seconds, bandwidth.gb_per_s),
    }


def run_sweep(
    model: EarlyExitModel,
    prompts: Sequence[Sequence[int]],
    bench: BenchConfig,
    stop: StopRule | None = None,
    *,
    model_name: str = "model",
    dtype: str = "",
    seed: int = 1234,
    cost_iters: int = 7,
    progress: bool = True,
    draft_vocab_file: str | None = None,
    bandwidth: Bandwidth | None = None,
) -> list[dict[str, Any]]:
    """The (E, d) sweep of ``bench`` on one loaded model: one row per method and (E, d), greedy first, then
    greedy's A/A control; each with its roofline fraction at ``bandwidth`` when given."""
    stop = stop or StopRule()
    prompts = [list(p) for p in prompts]
    entries = sweep_entries(bench, model.num_layers, draft_vocab_file)
    methods = {entry.label: build_entry(entry, model) for entry in entries}
    dtype_name = dtype or str(model.dtype).removeprefix("torch.")
    desc = f"{model_name}/{dtype_name}"
    reads: dict[str, list[list[int]]] = {}
    results = run_interleaved(
        methods, prompts, bench.max_new_tokens, stop, bench.repeats, seed, progress, desc, reads=reads
    )
    costs: dict[tuple[int, int, bool, str], StepCosts] = {}
    rows = []
    for entry in entries:
        entry_costs = None
        if entry.exit_layer is not None and entry.num_speculations is not None:
            vocab = dict(entry.options).get("draft_vocab_file", "")
            key = (entry.exit_layer, entry.num_speculations, entry.method in SHARED_VERIFY, vocab)
            if key not in costs:
                costs[key] = measure_step_costs(model, prompts[0], *key[:3], iters=cost_iters, draft_vocab_file=vocab)
            entry_costs = costs[key]
        row = summarize_entry(
            entry, results[entry.label], results[BASELINE], entry_costs, seed, reads[entry.label], bandwidth
        )
        rows.append({"model": model_name, "dtype": dtype_name, **row, "max_new_tokens": bench.max_new_tokens})
    return rows


def _csv_text(rows: Sequence[dict[str, Any]]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(COLUMNS), extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({key: "" if row.get(key) is None else row[key] for key in COLUMNS})
    return buffer.getvalue()


def bench_bandwidths(out_dir: str | Path) -> dict[str, dict[str, Any]]:
    """The memory bandwidths (per dtype) a finished bench stage wrote to ``<out>/sweep.json``."""
    path = Path(out_dir) / "sweep.json"
    return json.loads(path.read_text())["provenance"].get("memory_bandwidth", {}) if path.exists() else {}


def write_results(
    rows: Sequence[dict[str, Any]], out_dir: str | Path, provenance_block: dict[str, Any], task: str | None = None
) -> list[Path]:
    """``sweep.csv`` and ``sweep.json`` (rows, provenance and the timed prompts' ``task``) under ``out_dir``, each
    written atomically."""
    out_dir = Path(out_dir)
    return [
        atomic_write_text(out_dir / "sweep.csv", _csv_text(rows)),
        atomic_write_json(out_dir / "sweep.json", {"provenance": provenance_block, "task": task, "rows": list(rows)}),
    ]


def bench_draft_vocab(
    task: Task,
    data_dir: str | Path,
    tokenizer: Any,
    size: int,
    stop: StopRule,
    out_dir: str | Path,
    model_name: str,
    trained: list[int] | None = None,
) -> Path:
    """The sub-vocabulary rows' draft set: the one the model's exits were trained over (``trained``), else the
    ``size`` most frequent tokens of the task's train split (never its test data); plus EOS
    (:func:`exitbench.exit_vocab.write_draft_vocab`)."""
    target = Path(out_dir) / f"draft_vocab_{model_name}.json"
    written = write_draft_vocab(trained, task, data_dir, tokenizer, size, stop.eos_token_ids, target)
    if written is None:
        path = task_train_path(task, data_dir)
        raise ExitbenchError(f"bench_decoding: draft_vocab_size needs {path}; set bench.draft_vocab_size: 0")
    return written


def load_prompt_texts(task: Task, data_dir: str | Path, num_prompts: int) -> list[str]:
    """``num_prompts`` prompts of ``data/<task>/<split>.jsonl`` in the task's own format: the task's seeded,
    stratified draw (:meth:`Task.samples`), so with evaluate's seed they are the first of evaluate's samples."""
    data_dir = Path(data_dir)

    def rows(split: str) -> list[dict[str, Any]]:
        path = data_dir / task.name / f"{split}.jsonl"
        if not path.exists():
            raise ExitbenchError(f"bench_decoding: {path} not found; run `dvc repro prepare_data` (task '{task.name}')")
        return list(read_jsonl(path))

    task.set_context({split: rows(split) for split in task.context_splits})
    test_rows = rows(task.split)
    if len(test_rows) < num_prompts:
        raise ExitbenchError(
            f"bench_decoding: {data_dir / task.name / task.split}.jsonl has {len(test_rows)} rows but "
            f"bench.num_prompts is {num_prompts}; lower bench.num_prompts"
        )
    return [sample.prompt for sample in task.samples(test_rows, num_prompts, "bench.num_prompts")]


def check_model_dirs(models_dir: str | Path, names: Sequence[str]) -> list[Path]:
    """Each listed model's directory, or one error naming the first missing one and the stage that makes it."""
    dirs = []
    for name in names:
        path = Path(models_dir) / name
        if not (path / "config.json").exists():
            stage = "prepare_model" if name in ("base", "draft") else "train"
            raise ExitbenchError(
                f"bench_decoding: model '{name}' not found at {path}; run `dvc repro {stage}` "
                "(or remove it from bench.models)"
            )
        dirs.append(path)
    return dirs


def run_bench(
    cfg: Config,
    models_dir: str | Path,
    data_dir: str | Path,
    out_dir: str | Path,
    progress: bool = True,
    train_reports: str | Path | None = None,
) -> list[dict[str, Any]]:
    """The whole stage: every model x dtype in ``bench``, written to ``<out>/sweep.{csv,json}``. ``train_reports``:
    the training reports' folder (a model trained with ``exit_vocab_size`` drafts over its exits' set)."""
    bench = cfg.bench
    for name in (BASELINE, "self_speculative", *bench.peers):  # fail fast on an unknown method
        method_class(name)
    model_dirs = check_model_dirs(models_dir, bench.models)
    task = build_task(bench.task, TaskSettings(cfg.base.seed))  # evaluate's seed: the same draw of prompts
    texts = load_prompt_texts(task, data_dir, bench.num_prompts)
    rows: list[dict[str, Any]] = []
    device = torch.device("cpu")
    projections: dict[str, dict[str, Any]] = {}
    bandwidths: dict[str, Bandwidth] = {}  # measured once per dtype, before the first sweep of that dtype
    verify_scaling: dict[str, dict[str, Any]] = {}
    for name, path in zip(bench.models, model_dirs, strict=True):
        tokenizer = load_tokenizer(path)
        prompts = [encode_prompt(tokenizer, text, chat_template=False) for text in texts]  # as `evaluate` does
        # EOS only: the sweep times a token budget; a task's stop strings would cut an untrained model's
        # output to one token (the base model answers a TOPv2 prompt with a newline first).
        stop = StopRule(stop_rule(tokenizer, task).eos_token_ids)
        vocab_file = None
        if bench.draft_vocab_size:
            trained = model_exit_vocabulary(train_reports, name, data_dir, tokenizer)
            vocab_file = str(
                bench_draft_vocab(task, data_dir, tokenizer, bench.draft_vocab_size, stop, out_dir, name, trained)
            )
        for dtype in bench.dtypes:
            model = load_early_exit_model(path, dtype, cfg.base.device)
            device = model.device
            if dtype not in bandwidths:
                bandwidths[dtype] = measure_bandwidth(model.dtype, device)
            projections[f"{name}/{dtype}"] = model.projection
            verify_scaling[f"{name}/{dtype}"] = measure_verify_scaling(
                model, prompts[0], bench.exit_layers[len(bench.exit_layers) // 2]
            )
            rows.extend(
                run_sweep(
                    model,
                    prompts,
                    bench,
                    stop,
                    model_name=name,
                    dtype=dtype,
                    seed=cfg.base.seed,
                    progress=progress,
                    draft_vocab_file=vocab_file,
                    bandwidth=bandwidths[dtype],
                )
            )
            del model
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    block = {
        **provenance(stage_view(cfg, "bench_decoding"), device, ",".join(bench.dtypes)),
        "projection": projections,
        "memory_bandwidth": {dtype: bandwidth.to_dict() for dtype, bandwidth in bandwidths.items()},
        "verify_scaling": verify_scaling,
    }
    write_results(rows, out_dir, block, bench.task)
    return rows
