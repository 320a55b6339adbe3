"""The evaluate stage: every (model, task, method) -> quality, speed and exactness, resumably.

For each (model, task) the greedy baseline runs first; every other method is scored on the same samples
and compared with it token for token (mismatch rate, first divergence) and in time per token (speed-up
as LayerSkip defines it: mean time per generated token of greedy / of the method, same model, dtype,
prompts and process). The samples are the task's seeded, stratified draw (:meth:`Task.samples`, ids
recorded in every summary): greedy and the inexact methods run on all of it (the quality sample), exact
methods on its first ``timing_samples`` (the timing sample; their quality is greedy's by construction).
Per-sample records are appended to ``<out>/<model>/<task>/<method>.jsonl`` (fsynced per line), so an
interrupted run resumes where it stopped. A record is reused only for the same settings (model weights,
decoding code, options, budget, dtype) *and* the same sample (prompt token ids, reference, data row):
other data regenerates exactly the samples that differ. A crash on one sample is recorded, not fatal.
The summary JSON is written atomically.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import traceback
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from exitbench.config import Config, TaskEvalConfig, stage_view
from exitbench.data.io import atomic_write_json, atomic_write_text, read_jsonl
from exitbench.decoding import StopRule, base_method, build_method, method_class, parse_options
from exitbench.decoding.base import DecodingMethod
from exitbench.errors import ExitbenchError
from exitbench.exit_vocab import report_path, trained_exit_vocabulary, write_draft_vocab
from exitbench.identity import method_code_identity, model_identity
from exitbench.models.load import load_early_exit_model, load_tokenizer
from exitbench.models.view import EarlyExitModel
from exitbench.provenance import provenance
from exitbench.stats import Interval, mean_interval, ratio_interval, speedup_interval
from exitbench.subvocab import write_task_calibration
from exitbench.tasks.base import require_isolation
from exitbench.tasks.registry import Sample, Task, TaskSettings, build_task

FRAMEWORK_GREEDY = "hf_greedy"  # the baseline of methods that run inside transformers (framework "transformers")
BASELINE = "autoregressive"
# How records are timed; part of their key, so records timed another way are not mixed in.
TIMING_PROTOCOL = "methods interleaved per sample, one process, one warm-up each"
#: on a GPU, the first call of a matrix product of a new shape (a new prompt length) costs far more than the
#: next (the library picks its kernel then): measured on an H200 in bfloat16, greedy, always first in a round,
#: ran at 51 ms/token against 10 ms for prompt lookup on the same tokens until every prompt was warmed first
CUDA_PROMPT_WARMUP = "; on CUDA each sample's prompt prefilled once, untimed, before its round"


def timing_protocol(device_type: str) -> str:
    """The timing protocol of a run on ``device_type`` (part of every stored record's settings)."""
    return TIMING_PROTOCOL + (CUDA_PROMPT_WARMUP if device_type == "cuda" else "")


@dataclass
class EvalContext:
    """One loaded model and what every method on it shares."""

    name: str
    model: EarlyExitModel
    tokenizer: Any
    draft: EarlyExitModel | None
    model_key: str
    model_info: dict[str, Any]
    train_report: Path | None = None  # results/train/<model>.json of a model trained here
    _exit_vocab: dict[str, list[int] | None] = field(default_factory=dict, repr=False)

    def trained_exit_vocab(self, data_dir: Path) -> list[int] | None:
        """The sub-vocabulary this model's exits were trained over (:mod:`exitbench.exit_vocab`), or None."""
        if self.train_report is None:
            return None
        if str(data_dir) not in self._exit_vocab:
            self._exit_vocab[str(data_dir)] = trained_exit_vocabulary(self.train_report, data_dir, self.tokenizer)
        return self._exit_vocab[str(data_dir)]


def _model_key(model_dir: Path) -> str:
    return model_identity(model_dir)[:16]


def load_context(
    cfg: Config,
    models_dir: Path,
    name: str,
    stages: Sequence[str] | None = None,
    train_reports: Path | None = None,
) -> EvalContext:
    """Load model ``name`` (and the prepared draft when a method of ``stages``, default all, needs it); with
    ``train_reports``, its training report (how its exits were trained: :meth:`EvalContext.trained_exit_vocab`)."""
    model_dir = models_dir / name
    if not (model_dir / "config.json").exists():
        raise ExitbenchError(
            f"evaluate: model '{name}' not found at {model_dir}; it is made by `dvc repro "
            f"{'prepare_model' if name == 'base' else 'train'}` (or remove it from evaluate.models)"
        )
    model = load_early_exit_model(model_dir, cfg.base.dtype, cfg.base.device)
    draft = None
    labels = [label for label in cfg.evaluate.methods if stages is None or base_method(label) in stages]
    if any(needs_prepared_draft(label, cfg.evaluate.methods[label]) for label in labels):
        draft_dir = models_dir / "draft"
        if not (draft_dir / "config.json").exists():
            raise ExitbenchError(f"evaluate: method 'speculative' needs {draft_dir}; run `dvc repro prepare_model`")
        draft = load_early_exit_model(draft_dir, cfg.base.dtype, cfg.base.device)
    info_path = model_dir / "model_info.json"
    info = json.loads(info_path.read_text()) if info_path.exists() else {}
    model_info = {
        "num_parameters": info.get("num_parameters") or model.num_parameters,
        "num_layers": model.num_layers,
        "source": info.get("source"),
        "projection": model.projection,
    }
    tokenizer = load_tokenizer(model_dir)
    return EvalContext(
        name, model, tokenizer, draft, _model_key(model_dir), model_info, report_path(train_reports, name)
    )


def needs_prepared_draft(label: str, options: dict[str, Any] | None) -> bool:
    """Whether method ``label`` drafts with the prepared ``models/draft`` (``speculative`` without
    ``draft_layers``; with it, the method copies the evaluated model's own first layers)."""
    return base_method(label) == "speculative" and not (options or {}).get("draft_layers")


def uses_chat_template(cfg: Config, model: str, task: str) -> bool:
    """Whether ``model``'s prompts of ``task`` go through its chat template (``evaluate.chat_template`` for every
    model and task, or the tasks ``evaluate.chat_template_models`` names for the model)."""
    return cfg.evaluate.chat_template or task in cfg.evaluate.chat_template_models.get(model, [])


def encode_prompt(tokenizer: Any, prompt: str, chat_template: bool) -> list[int]:
    """Prompt text -> token ids (a chat template only when params ask for it; BOS as the tokenizer adds)."""
    if chat_template:
        messages = [{"role": "user", "content": prompt}]
        prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer(prompt, add_special_tokens=True)["input_ids"]


def stop_rule(tokenizer: Any, task: Task) -> StopRule:
    eos = tokenizer.eos_token_id
    eos_ids = frozenset(eos if isinstance(eos, list) else [eos]) if eos is not None else frozenset()
    return StopRule(eos_ids, task.stop_strings, lambda ids: tokenizer.decode(ids, skip_special_tokens=True))


def load_samples(task: Task, data_dir: Path, num_samples: int) -> list[Sample]:
    def rows(split: str) -> list[dict[str, Any]]:
        path = data_dir / task.name / f"{split}.jsonl"
        if not path.exists():
            raise ExitbenchError(
                f"evaluate: {path} not found; run `dvc repro prepare_data` (is '{task.name}' in data.tasks?)"
            )
        return list(read_jsonl(path))

    task.set_context({split: rows(split) for split in task.context_splits})
    return task.samples(rows(task.split), num_samples)


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first differing token (the shorter length if one is a prefix), None if equal."""
    if list(a) == list(b):
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def sample_key(sample: Sample, prompt_ids: Sequence[int]) -> str:
    """sha256 of everything a stored record of ``sample`` was made from and scored against: the exact prompt
    token ids, the sample's id, its reference and its whole data row (HumanEval's tests live there)."""
    payload = {"id": sample.sample_id, "prompt_ids": list(prompt_ids), "reference": sample.reference, "row": sample.row}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Shard:
    """This process's slice of every sample list when evaluation runs under ``torchrun`` (one process per GPU):
    sample ``i`` belongs to rank ``i % world``. Each rank times every method beside greedy on its own samples,
    interleaved per sample as in one process, so each per-sample speed-up stays a same-process ratio."""

    rank: int = 0
    world: int = 1
    barrier: Callable[[], None] = field(default=lambda: None, compare=False)

    def owns(self, index: int) -> bool:
        return index % self.world == self.rank

    def records_path(self, path: Path, rank: int | None = None) -> Path:
        """Where a rank keeps its records until rank 0 merges them (the whole file when not sharded)."""
        if self.world == 1:
            return path
        return path.with_name(f"{path.stem}.rank{self.rank if rank is None else rank}-of-{self.world}{path.suffix}")


def merge_shards(shard: Shard, path: Path, key: str) -> RecordFile:
    """Rank 0, after the barrier: every rank's records of ``path`` joined into ``path`` (the part files go)."""
    merged = RecordFile(path, key)
    parts = [shard.records_path(path, rank) for rank in range(shard.world)]
    for part in parts:
        if part.exists():
            merged.stored.update(RecordFile(part, key).stored)
    merged._rewrite()
    for part in parts:
        part.unlink(missing_ok=True)
    return merged


class RecordFile:
    """Append-only per-sample records, each valid only for one settings key and one sample; resumable.

    A record is stored under ``record_key = sha256(settings key, sample key)``: the settings (weights, code,
    method options, budget, dtype, ...) and the sample (prompt token ids, reference, data row). A record is
    reused only when both match, so a new mirror, a new sampling seed or a mended row regenerates exactly
    the samples that changed, whatever their index. Records of other settings stay in the file, so
    switching a method's options back reuses them. A torn last line (a kill mid-write) is dropped.
    """

    VERSION = 2  # records of earlier layouts (keyed by index) are never reused

    def __init__(self, path: Path, key: str, writable: bool = True) -> None:
        self.path = path
        self.key = key
        self.stored: dict[str, dict[str, Any]] = {}
        self.made = 0
        self.writable = writable  # False: another stage's records, read and never rewritten
        if path.exists():
            for line in path.read_text().splitlines():
                record = _parse(line)
                if record is not None and record.get("layout") == self.VERSION and "record_key" in record:
                    self.stored[record["record_key"]] = record
        if writable:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._rewrite()

    def record_key(self, sample_key: str) -> str:
        return hashlib.sha256(f"{self.key}/{sample_key}".encode()).hexdigest()[:32]

    def get(self, sample_key: str) -> dict[str, Any] | None:
        """The stored record of this sample under this file's settings, or None."""
        return self.stored.get(self.record_key(sample_key))

    def _rewrite(self) -> None:
        tmp = self.path.with_suffix(".jsonl.tmp")
        with tmp.open("w") as handle:
            for record in self.stored.values():
                handle.write(json.dumps(record) + "\n")
        os.replace(tmp, self.path)

    def append(self, record: dict[str, Any], sample_key: str) -> dict[str, Any]:
        """Store ``record`` for ``sample_key`` (fsynced before returning) and return it as stored."""
        if not self.writable:
            raise RuntimeError(f"{self.path}: opened read-only (another stage's records)")
        record = {**record, "layout": self.VERSION, "settings_key": self.key, "sample_key": sample_key,
                  "record_key": self.record_key(sample_key)}
        with self.path.open("a") as handle:
            handle.write(json.dumps(record) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        self.stored[record["record_key"]] = record
        self.made += 1
        return record


def _parse(line: str) -> dict[str, Any] | None:
    try:
        value = json.loads(line)
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


@dataclass
class TaskBatch:
    """One task's samples on one model, encoded once and shared by every method."""

    task: Task
    samples: list[Sample]
    prompt_ids: list[list[int]]
    stop: StopRule
    max_new_tokens: int
    tokenizer: Any

    @cached_property
    def sample_keys(self) -> list[str]:
        """Each sample's :func:`sample_key` (what its stored records must match)."""
        return [sample_key(s, ids) for s, ids in zip(self.samples, self.prompt_ids, strict=True)]


def run_methods(
    runs: dict[str, tuple[DecodingMethod, RecordFile]],
    batch: TaskBatch,
    desc: str,
    limits: Mapping[str, int] | None = None,
    shard: Shard | None = None,
    warm_each_sample: bool = False,
    references: Mapping[str, Mapping[str, DecodingMethod]] | None = None,
    reference_limit: int | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """Generate and score every sample a method has not recorded yet, methods interleaved per sample.

    Sample i runs under every method that runs on it before sample i+1 does, so a slow phase of the machine
    (another job, thermal throttling) hits all methods alike and the speed-ups, ratios of times taken
    minutes apart otherwise, compare like with like. Each method warms up once (not recorded) before the
    first timed sample. ``limits[name]`` (default: every sample) runs that method on the first samples only.
    Returns each method's records in sample order; with a ``shard`` (one process of several), only the
    samples it owns are generated, and what it has is returned. ``warm_each_sample`` (on a GPU): before a
    sample's round, the first method prefills its prompt once, untimed (:data:`CUDA_PROMPT_WARMUP`).

    ``references[name]`` = {field: reference method}: the runs a method's speed-ups are paired with (greedy
    as ``reference_decode``; a transformers peer's own greedy as ``framework_reference_decode``). In each
    round a reference runs once, timed and not scored, before the methods, and its decode goes into every new
    record of that round as ``field``; a reference that is itself one of ``runs`` and due in the round (greedy
    in its own stage) lends its fresh record's decode instead. Past ``reference_limit`` samples (the timing
    sample) the field is None: the record counts for quality, not for speed.
    """
    keys = batch.sample_keys
    references = references or {}
    ref_limit = len(keys) if reference_limit is None else reference_limit
    limit = {name: min((limits or {}).get(name, len(keys)), len(keys)) for name in runs}
    owned = shard.owns if shard is not None else (lambda index: True)
    todo = {
        name: {i for i in range(limit[name]) if owned(i) and records.get(keys[i]) is None}
        for name, (_, records) in runs.items()
    }
    ran = {id(method): name for name, (method, _) in runs.items()}
    warm: dict[int, tuple[DecodingMethod, int]] = {}
    for name, (method, _) in runs.items():
        if todo[name]:
            warm.setdefault(id(method), (method, min(todo[name])))
            for reference in references.get(name, {}).values():
                warm.setdefault(id(reference), (reference, min(todo[name])))
    for method, index in warm.values():
        method.generate(batch.prompt_ids[index], min(4, batch.max_new_tokens), batch.stop)
    total = sum(len(indices) for indices in todo.values())
    first_method = next(iter(runs.values()))[0]
    with tqdm(total=total, desc=desc, unit="gen", leave=False) as bar:
        for index in range(len(batch.samples)):
            due = [name for name in runs if index in todo[name]]
            if not due:
                continue
            if warm_each_sample:
                first_method.generate(batch.prompt_ids[index], 1, batch.stop)
            timed: dict[int, dict[str, Any] | None] = {}
            if index < ref_limit:
                for name in due:
                    for reference in references.get(name, {}).values():
                        lent = ran.get(id(reference)) in due
                        if id(reference) not in timed and not lent:
                            timed[id(reference)] = _timed_only(reference, batch, index)
            fresh: dict[int, dict[str, Any] | None] = {}
            for name in due:
                method, records = runs[name]
                record = _one_sample(method, batch, index)
                fresh[id(method)] = record.get("decode")
                for field_name, reference in references.get(name, {}).items():
                    found = timed.get(id(reference), fresh.get(id(reference)))
                    record[field_name] = found if index < ref_limit else None
                records.append(record, keys[index])
                bar.update()
    done: dict[str, list[dict[str, Any]]] = {}
    for name, (_, records) in runs.items():
        found = [records.get(key) for key in keys[: limit[name]]]
        assert shard is not None or all(record is not None for record in found)
        # a record reused from another position (the sample moved in the file) takes its index here
        done[name] = [{**record, "index": i} for i, record in enumerate(found) if record is not None]
    return done


def run_method(method: DecodingMethod, batch: TaskBatch, records: RecordFile, label: str) -> list[dict[str, Any]]:
    """:func:`run_methods` for one method."""
    return run_methods({label: (method, records)}, batch, label)[label]


def _timed_only(method: DecodingMethod, batch: TaskBatch, index: int) -> dict[str, Any] | None:
    """The reference's decode record of one sample, generated and timed but not scored (its stored record
    already holds the scores; scoring HumanEval would run the sandbox again); None if it fails."""
    try:
        return method.generate(batch.prompt_ids[index], batch.max_new_tokens, batch.stop).to_dict()
    except ExitbenchError:
        raise
    except Exception:  # a failing re-run leaves the new records paired with the stored reference
        return None


def _one_sample(method: DecodingMethod, batch: TaskBatch, index: int) -> dict[str, Any]:
    sample = batch.samples[index]
    record: dict[str, Any] = {"index": index, "sample_id": sample.sample_id}
    try:
        result = method.generate(batch.prompt_ids[index], batch.max_new_tokens, batch.stop)
        text = batch.tokenizer.decode(result.tokens, skip_special_tokens=True)
        completion = batch.task.postprocess(text)
        record.update(tokens=result.tokens, completion=completion, decode=result.to_dict())
        record["scores"] = batch.task.score(sample, completion)
        record["error"] = None
    except ExitbenchError:
        raise
    except Exception as err:  # one broken sample is a recorded failure, not a failed run
        record.update(error=f"{type(err).__name__}: {err}", traceback=traceback.format_exc(limit=3))
    return record


def sample_limits(methods: Mapping[str, DecodingMethod], num_samples: int, timing_samples: int) -> dict[str, int]:
    """How many samples (a prefix of the quality sample) each method runs on: greedy and every inexact
    method the whole quality sample; an exact method, whose outputs equal greedy's by construction, only
    the first ``timing_samples`` (0 = all), enough to time it and to check that exactness."""
    timing = min(timing_samples or num_samples, num_samples)
    return {name: timing if method.exact and name != BASELINE else num_samples for name, method in methods.items()}


def sample_info(task: Task, samples: Sequence[Sample]) -> dict[str, Any]:
    """How the samples run were drawn: seed, strategy, count and count per stratum."""
    strata = Counter(task.stratum(sample.row) for sample in samples)
    return {
        "seed": task.settings.seed,
        "strategy": task.sample_strategy(),
        "num_samples": len(samples),
        "strata": dict(sorted(strata.items())),
    }


def summarize(
    task: Task,
    method: DecodingMethod,
    samples: list[Sample],
    records: list[dict[str, Any]],
    greedy: list[dict[str, Any]] | None,
    *,
    is_baseline: bool = False,
) -> dict[str, Any]:
    """Quality, speed and exactness of one (model, task, method) from its per-sample records.

    ``samples`` is the quality sample and ``greedy`` the baseline's records of it; ``records`` may cover a
    prefix of it only (an exact method's timing sample): speed-up and mismatches compare it with greedy's
    records of the same samples. An exact method other than the baseline (``is_baseline``) reports greedy's
    quality on the whole quality sample (``quality_from`` says so) and its own as ``quality_measured``.
    """
    quality_sample, samples = samples, samples[: len(records)]
    full_greedy, greedy = greedy, greedy[: len(records)] if greedy is not None else None
    ok = [(s, r) for s, r in zip(samples, records, strict=True) if r.get("error") is None]
    quality = task.aggregate([s for s, _ in ok], [r["scores"] for _, r in ok])
    tokens = sum(r["decode"]["num_tokens"] for _, r in ok)
    seconds = sum(r["decode"]["wall_time_s"] for _, r in ok)
    drafted = sum(r["decode"]["num_drafted"] for _, r in ok)
    rounds = sum(r["decode"]["num_rounds"] for _, r in ok)
    speed = {
        "time_per_token_ms": 1000.0 * seconds / max(tokens, 1),
        "num_tokens": tokens,
        "acceptance_rate": sum(r["decode"]["num_accepted"] for _, r in ok) / drafted if drafted else None,
        "tokens_per_round": tokens / rounds if rounds else None,
        "speedup_vs_greedy": None,
        "ideal_fraction": None,
    }
    exit_layers = [layer for _, r in ok for layer in r["decode"].get("exit_layers", [])]
    if exit_layers:
        speed["avg_exit_layer"] = sum(exit_layers) / len(exit_layers)
    correctness: dict[str, Any] = {"exact_claimed": method.exact}
    if greedy is not None:
        timed = timed_pairs(records, greedy)
        m_tokens, m_seconds = sum(m["num_tokens"] for m, _ in timed), sum(m["wall_time_s"] for m, _ in timed)
        g_tokens, g_seconds = sum(g["num_tokens"] for _, g in timed), sum(g["wall_time_s"] for _, g in timed)
        if g_tokens and m_tokens:
            speed["speedup_vs_greedy"] = (g_seconds / g_tokens) / (m_seconds / m_tokens)
        speed["num_timed"] = len(timed)
        correctness.update(_compare(records, greedy))
    summary = {
        "num_samples": len(samples),
        "num_failed": len(samples) - len(ok),
        "quality": quality,
        "speed": speed,
        "correctness": correctness,
        "errors": [r["error"] for r in records if r.get("error")][:5],
        "sample_ids": [s.sample_id for s in samples],
        "sample": sample_info(task, samples),
    }
    scored = list(zip(samples, records, strict=True))
    if method.exact and not is_baseline and full_greedy is not None:
        summary.update(
            quality=greedy_quality(task, quality_sample, full_greedy),
            quality_measured=quality,
            quality_from=f"{BASELINE} (exact method; measured on the timing sample of {len(samples)})",
            num_quality_samples=len(quality_sample),
        )
        scored = list(zip(quality_sample, full_greedy, strict=True))
    summary["intervals"] = intervals(task, scored, records, greedy)
    return summary


def intervals(
    task: Task,
    scored: Sequence[tuple[Sample, dict[str, Any]]],
    records: Sequence[dict[str, Any]],
    greedy: Sequence[dict[str, Any]] | None,
) -> dict[str, dict[str, Any]]:
    """95% bootstrap intervals (:mod:`exitbench.stats`, resampling samples) of every number a summary reports.

    Quality metrics over ``scored`` (the (sample, record) pairs the reported quality comes from; TOPv2's
    per-domain exact match as ``per_domain/<domain>``); speed-up paired per sample with greedy's record of
    the same sample; acceptance = accepted / drafted over samples; mismatch rate over compared samples;
    ``fraction_of_greedy/<metric>`` = sum of the method's scores / greedy's over the samples both scored
    (early exit's share of the last layer's quality), pairs resampled together.
    """
    seed = task.settings.seed
    out: dict[str, dict[str, Any]] = {}
    ok = [(sample, record) for sample, record in scored if record.get("error") is None]
    metrics = sorted({key for _, record in ok for key, value in record["scores"].items() if _is_number(value)})
    for metric in metrics:
        out[metric] = mean_interval([float(r["scores"].get(metric, 0.0)) for _, r in ok], seed).to_dict()
    if task.primary_metric in metrics and len({task.stratum(sample.row) for sample, _ in ok}) > 1:
        by_stratum: dict[str, list[float]] = {}
        for sample, record in ok:
            by_stratum.setdefault(task.stratum(sample.row), []).append(float(record["scores"][task.primary_metric]))
        for stratum, values in sorted(by_stratum.items()):
            out[f"per_domain/{stratum}"] = mean_interval(values, seed).to_dict()
    mine = [r for r in records if r.get("error") is None]
    drafted = [(r["decode"]["num_accepted"], r["decode"]["num_drafted"]) for r in mine]
    if sum(d for _, d in drafted):
        out["acceptance_rate"] = ratio_interval([a for a, _ in drafted], [d for _, d in drafted], seed).to_dict()
    if greedy is not None:
        pairs = [
            (r, g) for r, g in zip(records, greedy, strict=True) if r.get("error") is None and g.get("error") is None
        ]
        if (speedup := paired_speedup(records, greedy, seed)) is not None:
            out["speedup_vs_greedy"] = speedup.to_dict()
        if pairs:
            mismatched = [float(first_divergence(r["tokens"], g["tokens"]) is not None) for r, g in pairs]
            out["mismatch_rate"] = mean_interval(mismatched, seed).to_dict()
        for metric in metrics:  # the method's quality as a fraction of greedy's (last layer), paired by sample
            mine_scores = [float(r["scores"].get(metric, 0.0)) for r, _ in pairs]
            greedy_scores = [float(g["scores"].get(metric, 0.0)) for _, g in pairs]
            if pairs and sum(greedy_scores) > 0:
                out[f"fraction_of_greedy/{metric}"] = ratio_interval(mine_scores, greedy_scores, seed).to_dict()
    return out


def reference_of(record: dict[str, Any], baseline: dict[str, Any]) -> dict[str, Any] | None:
    """The greedy run ``record``'s speed-up is paired with: the one timed in its own round (``reference_decode``,
    see :func:`run_methods`; None past the timing sample: no pair). A record from before references were
    recorded per round pairs with greedy's stored record, which was timed in that same round."""
    if "reference_decode" in record:
        return record["reference_decode"]
    return baseline["decode"]


def timed_pairs(
    records: Sequence[dict[str, Any]],
    baseline: Sequence[dict[str, Any]],
    reference: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any] | None] = reference_of,
) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(method decode, reference decode) per sample both generated without error and with tokens, in order
    (the shorter list's prefix); ``reference`` picks the reference decode of a (record, baseline record)."""
    pairs = []
    for r, b in zip(records, baseline, strict=False):
        if r.get("error") is not None or b.get("error") is not None:
            continue
        ref = reference(r, b)
        if ref is not None and r["decode"]["num_tokens"] * ref["num_tokens"]:
            pairs.append((r["decode"], ref))
    return pairs


def paired_speedup(
    records: Sequence[dict[str, Any]],
    baseline: Sequence[dict[str, Any]],
    seed: int,
    reference: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any] | None] = reference_of,
) -> Interval | None:
    """The speed-up over ``baseline`` (time per token ratio) with its interval, prompt by prompt over
    :func:`timed_pairs`; None when there is none."""
    timed = timed_pairs(records, baseline, reference)
    if not timed:
        return None
    return speedup_interval(
        [b["wall_time_s"] for _, b in timed], [b["num_tokens"] for _, b in timed],
        [m["wall_time_s"] for m, _ in timed], [m["num_tokens"] for m, _ in timed], seed,
    )


def framework_reference_of(record: dict[str, Any], own_greedy: dict[str, Any] | None) -> dict[str, Any] | None:
    """The transformers greedy run a peer's record is paired with: the one timed in its round
    (``framework_reference_decode``), else (a record from before those were recorded) ``hf_greedy``'s stored
    record of the same sample and round, when given."""
    if "framework_reference_decode" in record:
        return record["framework_reference_decode"]
    return None if own_greedy is None else own_greedy["decode"]


def add_framework_speedup(
    summary: dict[str, Any],
    records: Sequence[dict[str, Any]],
    own_greedy: Sequence[dict[str, Any] | None],
    seed: int,
) -> None:
    """A peer's speed-up against its own framework's greedy decoding (``hf_greedy``), paired per sample.

    ``speedup_vs_greedy`` compares a transformers peer with exitbench's greedy decoding: what a user of the
    peer gets, engine and kernels included. ``speedup_vs_framework_greedy`` compares it with transformers'
    own greedy ``generate()`` on the same prompts: the method's merit inside its framework. ``own_greedy``:
    ``hf_greedy``'s stored records of the same samples (None where there is none), for older records only.
    """
    baseline = [{"error": None} if g is None else g for g in own_greedy]
    interval = paired_speedup(
        records, baseline, seed, lambda r, b: framework_reference_of(r, b if "decode" in b else None)
    )
    if interval is None:
        return
    summary["speed"]["speedup_vs_framework_greedy"] = interval.estimate
    summary["intervals"]["speedup_vs_framework_greedy"] = interval.to_dict()
    summary["framework_greedy"] = FRAMEWORK_GREEDY


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def greedy_quality(task: Task, samples: Sequence[Sample], greedy: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The baseline's quality on ``samples`` (its failed samples left out), what an exact method's is."""
    kept = [(s, g) for s, g in zip(samples, greedy, strict=True) if g.get("error") is None]
    return task.aggregate([s for s, _ in kept], [g["scores"] for _, g in kept])


def _compare(records: list[dict[str, Any]], greedy: list[dict[str, Any]]) -> dict[str, Any]:
    pairs = [(r, g) for r, g in zip(records, greedy, strict=True) if r.get("error") is None and g.get("error") is None]
    divergences = [first_divergence(r["tokens"], g["tokens"]) for r, g in pairs]
    mismatched = [d for d in divergences if d is not None]
    return {
        "num_compared": len(pairs),
        "num_mismatched": len(mismatched),
        "mismatch_rate": len(mismatched) / len(pairs) if pairs else None,
        "first_divergence_mean": sum(mismatched) / len(mismatched) if mismatched else None,
        "first_divergence_min": min(mismatched) if mismatched else None,
    }


def draft_vocab_for(
    cfg: Config, ctx: EvalContext, task: Task, stop: StopRule, data_dir: Path, target_dir: Path
) -> Path | None:
    """The draft sub-vocabulary file of (model, task): the set the model's exits were trained over when it was
    trained with ``exit_vocab_size`` (whatever the task: the other logits of its exits are untrained), plus the
    task's stop tokens; else the task's ``evaluate.draft_vocab_size`` most frequent train-split tokens when that
    asks for them and the task has a train split; else None (drafts over the whole vocabulary).
    """
    target = target_dir / "draft_vocab.json"
    trained, size = ctx.trained_exit_vocab(data_dir), cfg.evaluate.draft_vocab_size
    return write_draft_vocab(trained, task, data_dir, ctx.tokenizer, size, stop.eos_token_ids, target)


CALIBRATION_ROWS = 32  # train-split examples written for methods with a ``calibration_file`` option


#: prepared training corpora (``<data>/<corpus>/train.jsonl``, rows with "text") that stand in for a task's train
#: split where it has none, as calibration text: HumanEval's is the code corpus (MBPP's non-test problems and pinned
#: wheels' source, checked to hold no HumanEval problem)
CALIBRATION_CORPORA = {"humaneval": "code"}
CORPUS_TOKENS = 512  # a corpus document's first tokens (a whole library module can run to 10k)


def calibration_for(methods: list[str], ctx: EvalContext, task: Task, data_dir: Path, target_dir: Path) -> Path | None:
    """The task's calibration text (token-id lists of train examples, or of its :data:`CALIBRATION_CORPORA`
    corpus without a train split) when one of ``methods`` takes a ``calibration_file``; else None."""
    if not any("calibration_file" in method_class(name).Options.model_fields for name in methods):
        return None
    target = target_dir / "calibration.json"
    written = write_task_calibration(task, data_dir, ctx.tokenizer, CALIBRATION_ROWS, target)
    if written is not None or task.name not in CALIBRATION_CORPORA:
        return written
    return write_corpus_calibration(data_dir / CALIBRATION_CORPORA[task.name] / "train.jsonl", ctx.tokenizer,
                                    CALIBRATION_ROWS, task.settings.seed, target)


def write_corpus_calibration(corpus: Path, tokenizer: Any, rows: int, seed: int, target: Path) -> Path | None:
    """``rows`` documents of ``corpus`` (a seeded shuffle, each cut to :data:`CORPUS_TOKENS` tokens) as a JSON list
    of token-id lists at ``target``; None when the corpus is not there."""
    if not corpus.exists():
        return None
    documents = sorted(read_jsonl(corpus), key=lambda row: str(row.get("id", "")))
    random.Random(seed).shuffle(documents)
    texts = [str(row["text"]) for row in documents[:rows]]
    ids = [tokenizer(text, add_special_tokens=False)["input_ids"][:CORPUS_TOKENS] for text in texts]
    return atomic_write_text(target, json.dumps(ids) + "\n")


def runs_on(cfg: Config, method: str, model: str, task: str) -> bool:
    """Whether ``method`` runs on (``model``, ``task``): every model and task unless ``evaluate.method_models`` /
    ``evaluate.method_tasks`` name its own."""
    ev = cfg.evaluate
    return model in ev.method_models.get(method, [model]) and task in ev.method_tasks.get(method, [task])


def timing_sample_size(task_cfg: TaskEvalConfig) -> int:
    """How many samples exact methods run on: ``timing_samples`` capped at ``num_samples`` (0 = all), so a
    profile that shrinks the quality sample (smoke) needs no second override."""
    return min(task_cfg.timing_samples or task_cfg.num_samples, task_cfg.num_samples)


def reference_sample_size(task_cfg: TaskEvalConfig) -> int:
    """How many samples of the timing sample re-time greedy beside a method (its speed-ups pair over them):
    ``reference_samples`` capped at the timing sample (0 = all of it)."""
    timing = timing_sample_size(task_cfg)
    return min(task_cfg.reference_samples or timing, timing)


def capped_limits(limits: Mapping[str, int], method_samples: Mapping[str, int]) -> dict[str, int]:
    """``limits`` with each label named in ``evaluate.method_samples`` held to at most its own count."""
    return {label: min(limit, method_samples.get(label, limit)) for label, limit in limits.items()}


#: options naming a file evaluate writes beside a stage's results; a record's settings name the file, not its folder
FILE_OPTIONS = ("draft_vocab_file", "calibration_file")


def method_stages(cfg: Config) -> list[str]:
    """The evaluation stages ``cfg`` runs, one per registered method its ``evaluate.methods`` labels name
    (``early_exit@8`` and ``early_exit@15`` are both stage ``early_exit``), greedy's first: the reference."""
    stages = [BASELINE]
    for label in cfg.evaluate.methods:
        if base_method(label) not in stages:
            stages.append(base_method(label))
    return stages


def stage_labels(cfg: Config, stage: str, model: str, task: str) -> list[str]:
    """The labels stage ``stage`` runs on (``model``, ``task``); the reference stage's begin with greedy."""
    labels = [
        label for label in cfg.evaluate.methods
        if base_method(label) == stage and label != BASELINE and runs_on(cfg, label, model, task)
    ]
    return [BASELINE, *labels] if stage == BASELINE else labels


def stage_dir(out_dir: Path, stage: str, model: str, task: str) -> Path:
    """Where stage ``stage`` keeps its records and summaries of (``model``, ``task``): one folder per stage."""
    return out_dir / stage / model / task


def file_option_key(value: str) -> str:
    """A file option's part of a record's settings: its name and a hash of its content (a draft vocabulary or
    calibration set that changes makes new records; where the file lives does not)."""
    path = Path(value)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16] if path.exists() else "missing"
    return f"{path.name}:{digest}"


def settings_key(cfg: Config, ctx: EvalContext, task: Task, label: str, options: dict[str, Any], chat: bool) -> str:
    """The key of everything a stored record of ``label`` was made with (see :class:`RecordFile`)."""
    settings = {
        "model": ctx.model_key,
        "code": method_code_identity(method_class(label))[:16],
        "timing": timing_protocol(ctx.model.device.type),
        "method": label,
        "options": {key: file_option_key(value) if key in FILE_OPTIONS else value for key, value in options.items()},
        "task": task.name,
        "task_version": task.version,
        "max_new_tokens": cfg.evaluate.tasks[task.name].max_new_tokens,
        "dtype": cfg.base.dtype,
        "device": cfg.base.device,
        "chat_template": chat,
        "seed": cfg.base.seed,
    }
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


def method_options(
    cfg: Config, label: str, draft_vocab: Path | None, calibration: Path | None
) -> dict[str, Any]:
    """``evaluate.methods[label]`` with the files evaluate prepared for the options that take them."""
    options = dict(cfg.evaluate.methods.get(label, {}))
    fields = method_class(label).Options.model_fields
    if draft_vocab is not None and "draft_vocab_file" in fields:
        options["draft_vocab_file"] = str(draft_vocab)
    if calibration is not None and "calibration_file" in fields:
        options = {"calibration_file": str(calibration), **options}
    return options


def framework_greedy_label(cfg: Config, model: str, task: str) -> str | None:
    """The ``hf_greedy`` label that runs on (``model``, ``task``), the transformers peers' own reference."""
    return next(
        (label for label in cfg.evaluate.methods
         if base_method(label) == FRAMEWORK_GREEDY and runs_on(cfg, label, model, task)),
        None,
    )


def evaluate_model_task(
    cfg: Config, ctx: EvalContext, task_name: str, data_dir: Path, out_dir: Path, shard: Shard | None = None
) -> dict[str, dict[str, Any]]:
    """Every evaluation stage on one (model, task), greedy's first: what ``dvc repro`` runs stage by stage.
    Returns each label's summary (rank 0's)."""
    summaries: dict[str, dict[str, Any]] = {}
    for stage in method_stages(cfg):
        summaries.update(evaluate_stage(cfg, ctx, task_name, data_dir, out_dir, stage, shard))
    return summaries


def evaluate_stage(
    cfg: Config,
    ctx: EvalContext,
    task_name: str,
    data_dir: Path,
    out_dir: Path,
    stage: str,
    shard: Shard | None = None,
) -> dict[str, dict[str, Any]]:
    """Stage ``stage``'s labels on one (model, task); writes ``<out>/<stage>/<model>/<task>/<label>.{jsonl,json}``.

    The reference stage (greedy) runs greedy on the quality sample. Every other stage reads greedy's records
    (tokens and scores: exactness and quality are compared with them) and times greedy again in each round of
    its timing sample, interleaved with its own methods, so every speed-up is a ratio of one process and minute
    (:func:`run_methods` ``references``); a transformers peer is also timed against ``hf_greedy`` that way.
    Under a :class:`Shard` of several processes each generates its own samples, then (after the barrier) rank 0
    merges the records and writes the summaries, the same as one process's; the other ranks return nothing.
    """
    shard = shard or Shard()
    labels = stage_labels(cfg, stage, ctx.name, task_name)
    if not labels:
        return {}
    task_cfg = cfg.evaluate.tasks[task_name]
    timing_samples = timing_sample_size(task_cfg)
    task = build_task(task_name, TaskSettings(cfg.base.seed, cfg.evaluate.sandbox_timeout_s))
    samples = load_samples(task, data_dir, task_cfg.num_samples)
    chat = uses_chat_template(cfg, ctx.name, task_name)
    prompt_ids = [encode_prompt(ctx.tokenizer, s.prompt, chat) for s in samples]
    batch = TaskBatch(task, samples, prompt_ids, stop_rule(ctx.tokenizer, task), task_cfg.max_new_tokens, ctx.tokenizer)
    target = stage_dir(out_dir, stage, ctx.name, task_name)
    takes = {field for label in labels for field in method_class(label).Options.model_fields}
    draft_vocab = draft_vocab_for(cfg, ctx, task, batch.stop, data_dir, target) if "draft_vocab_file" in takes else None
    calibration = calibration_for(labels, ctx, task, data_dir, target)
    runs: dict[str, tuple[DecodingMethod, RecordFile]] = {}
    options_of: dict[str, dict[str, Any]] = {}
    for label in labels:
        options = method_options(cfg, label, draft_vocab, calibration)
        key = settings_key(cfg, ctx, task, label, options, chat)
        method = build_method(label, ctx.model, options, draft_model=ctx.draft)
        runs[label] = (method, RecordFile(shard.records_path(target / f"{label}.jsonl"), key))
        options_of[label] = options
    greedy_options = method_options(cfg, BASELINE, None, None)
    greedy_key = settings_key(cfg, ctx, task, BASELINE, greedy_options, chat)
    greedy = runs[BASELINE][0] if stage == BASELINE else build_method(BASELINE, ctx.model, greedy_options)
    references: dict[str, dict[str, DecodingMethod]] = {
        label: {"reference_decode": greedy} for label in labels if label != BASELINE
    }
    own_label = framework_greedy_label(cfg, ctx.name, task_name)
    peers = [label for label in labels if runs[label][0].framework != "exitbench" and label != own_label]
    if own_label is not None and peers:
        own = build_method(own_label, ctx.model, method_options(cfg, own_label, None, None))
        for label in peers:
            references[label]["framework_reference_decode"] = own
    limits = sample_limits({label: method for label, (method, _) in runs.items()}, len(samples), timing_samples)
    limits = capped_limits(limits, cfg.evaluate.method_samples)
    warm = ctx.model.device.type == "cuda"
    run_args = {"references": references, "reference_limit": reference_sample_size(task_cfg), "warm_each_sample": warm}
    if shard.world > 1:
        run_methods(runs, batch, f"{stage} {ctx.name}/{task_name} rank {shard.rank}", limits, shard, **run_args)
        shard.barrier()
        if shard.rank != 0:
            return {}
        runs = {label: (method, merge_shards(shard, target / f"{label}.jsonl", records.key))
                for label, (method, records) in runs.items()}
    done = run_methods(runs, batch, f"{stage} {ctx.name}/{task_name}", limits, **run_args)
    if stage == BASELINE:
        greedy_records = done[BASELINE]
    else:
        greedy_records = stored_records(out_dir, BASELINE, BASELINE, ctx.name, batch, greedy_key, required=True)
    own_stored: list[dict[str, Any] | None] = [None] * len(samples)
    if own_label is not None and peers:  # only records from before the per-round framework reference need these
        own_key = settings_key(cfg, ctx, task, own_label, method_options(cfg, own_label, None, None), chat)
        own_stored = stored_records(out_dir, FRAMEWORK_GREEDY, own_label, ctx.name, batch, own_key, required=False)
    summaries: dict[str, dict[str, Any]] = {}
    for label, (method, records) in runs.items():
        summary = summarize(task, method, samples, done[label], greedy_records, is_baseline=label == BASELINE)
        if label in peers and own_label is not None:
            add_framework_speedup(summary, done[label], own_stored, cfg.base.seed)
        summary.update(task=task_name, method=label, base_method=base_method(label), model=ctx.name, stage=stage)
        summary.update(options=options_of[label], dtype=cfg.base.dtype, chat_template=chat)
        summary["settings_key"] = records.key  # which of the store's records (it may hold other settings') are these
        if (memory := getattr(method, "extra_memory", lambda: None)()) is not None:
            summary["extra_memory"] = memory  # a separate draft model's weights and cache, beside the model
        summary["model_info"] = ctx.model_info
        summary["provenance"] = provenance(stage_view(cfg, "evaluate"), ctx.model.device, cfg.base.dtype)
        summary["provenance"]["num_parameters"] = ctx.model_info["num_parameters"]
        summary["timing"] = timing_protocol(ctx.model.device.type)
        atomic_write_json(target / f"{label}.json", summary)
        summaries[label] = summary
    return summaries


def stored_records(
    out_dir: Path, stage: str, label: str, model: str, batch: TaskBatch, key: str, required: bool
) -> list[dict[str, Any] | None]:
    """Another stage's stored records of ``batch``'s samples (read only), in sample order, None where missing;
    ``required``: every sample must have one (greedy's, which every method stage compares with)."""
    path = stage_dir(out_dir, stage, model, batch.task.name) / f"{label}.jsonl"
    records = RecordFile(path, key, writable=False)
    found = [records.get(sample_key) for sample_key in batch.sample_keys]
    missing = sum(record is None for record in found)
    if required and missing:
        raise ExitbenchError(
            f"evaluate: {path} lacks {label}'s records of {missing} of {len(found)} samples under these settings; "
            f"run `dvc repro evaluate@{stage}` first (every method stage compares with them)"
        )
    return [None if record is None else {**record, "index": i} for i, record in enumerate(found)]


def evaluate_all(
    cfg: Config,
    models_dir: Path,
    data_dir: Path,
    out_dir: Path,
    shard: Shard | None = None,
    stages: Sequence[str] | None = None,
    train_reports: Path | None = None,
) -> list[dict[str, Any]]:
    """Every model x task of params.yaml's ``evaluate`` section under ``stages`` (default: all of them, greedy's
    first; rows: rank 0's). ``train_reports``: the training reports' folder (a trained model's draft vocabulary)."""
    for name, options in cfg.evaluate.methods.items():  # fail fast on an unknown method or bad options
        parse_options(name, options)
    require_isolation(list(cfg.evaluate.tasks))
    stages = method_stages(cfg) if stages is None else list(stages)
    wanted = [
        (model, task) for model in cfg.evaluate.models for task in cfg.evaluate.tasks
        if any(stage_labels(cfg, stage, model, task) for stage in stages)
    ]
    rows = []
    for model_name in dict.fromkeys(model for model, _ in wanted):
        ctx = load_context(cfg, models_dir, model_name, stages, train_reports)
        for task_name in [task for model, task in wanted if model == model_name]:
            for stage in stages:
                summaries = evaluate_stage(cfg, ctx, task_name, data_dir, out_dir, stage, shard)
                for method, summary in summaries.items():
                    rows.append({"model": model_name, "task": task_name, "method": method, **summary["speed"]})
        del ctx
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return rows


def stage_methods_used(cfg: Config, stage: str) -> list[str]:
    """The labels stage ``stage`` builds: its own, greedy (the reference) and, for transformers peers, hf_greedy."""
    own = [label for label in cfg.evaluate.methods if base_method(label) == stage]
    used = [BASELINE, *own]
    if any(method_class(label).framework != "exitbench" for label in own):
        used += [label for label in cfg.evaluate.methods if base_method(label) == FRAMEWORK_GREEDY]
    return list(dict.fromkeys(used))


def stage_config_view(cfg: Config, stage: str) -> dict[str, Any]:
    """Stage ``evaluate@<stage>``'s resolved config: the evaluate view with ``methods``, ``method_models``,
    ``method_tasks`` and ``method_samples`` narrowed to the labels it builds, so another method's settings never
    re-run it."""
    view = stage_view(cfg, "evaluate")
    used = set(stage_methods_used(cfg, stage))
    section = view["evaluate"]
    for key in ("methods", "method_models", "method_tasks", "method_samples"):
        section[key] = {label: value for label, value in section[key].items() if label in used}
    return view


def stage_code_view(cfg: Config, stage: str) -> dict[str, Any]:
    """The code identity of every method stage ``stage`` builds (its module and what it imports of exitbench,
    :func:`~exitbench.identity.method_code_identity`): its DVC dependency on exactly that code."""
    used = stage_methods_used(cfg, stage) if stage in method_stages(cfg) else [stage]
    return {base_method(label): method_code_identity(method_class(label)) for label in used}
