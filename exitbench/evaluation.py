"""The evaluate stage: every (model, task, method) -> quality, speed and exactness, resumably.

For each (model, task) the greedy baseline runs first; every other method is scored on the same samples
and compared with it token for token (mismatch rate, first divergence) and in time per token (speed-up
as LayerSkip defines it: mean time per generated token of greedy / of the method, same model, dtype,
prompts and process). The samples are the task's seeded, stratified draw (:meth:`Task.samples`, ids
recorded in every summary): greedy and the inexact methods run on all of it (the quality sample), exact
methods on its first ``timing_samples`` (the timing sample; their quality is greedy's by construction).
Per-sample records are appended to ``<out>/<stage>/<model>/<task>/<method>.jsonl`` (fsynced per line), so an
interrupted run resumes where it stopped. A record is reused only for the same settings (model weights,
decoding code, options, budget, dtype) *and* the same sample (prompt token ids, reference, data row):
other data regenerates exactly the samples that differ. A crash on one sample is recorded, not fatal.
The summary JSON is written atomically.

This module loads a model and runs methods; the rest lives beside it: the record store
(:mod:`exitbench.records`), prompts, stop rules and sample keys (:mod:`exitbench.prompts`), which stages run
what (:mod:`exitbench.stage_plan`) and a summary from records (:mod:`exitbench.summaries`).
"""

from __future__ import annotations

import hashlib
import json
import random
import traceback
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from exitbench.config import Config, stage_view
from exitbench.data.io import atomic_write_json, atomic_write_text, read_jsonl
from exitbench.decoding import StopRule, base_method, build_method, method_class, parse_options
from exitbench.decoding.base import DecodeResult, DecodingMethod
from exitbench.errors import ExitbenchError
from exitbench.exit_vocab import report_path, trained_exit_vocabulary, write_draft_vocab
from exitbench.identity import method_code_identity, model_identity
from exitbench.models.load import load_early_exit_model, load_tokenizer
from exitbench.models.trained import TRAINED_FILES
from exitbench.models.view import EarlyExitModel
from exitbench.prompts import TaskBatch, encode_prompt, load_samples, stop_rule, uses_chat_template
from exitbench.provenance import provenance
from exitbench.quality_batches import batched_form, decode_batch, length_batches
from exitbench.recompute_notice import announce_recompute
from exitbench.records import RecordFile, Shard, merge_shards, stage_dir, stored_records
from exitbench.stage_plan import (
    BASELINE,
    FRAMEWORK_GREEDY,
    capped_limits,
    framework_greedy_label,
    method_stages,
    needs_prepared_draft,
    reference_sample_size,
    sample_limits,
    stage_labels,
    timing_sample_size,
)
from exitbench.subvocab import write_task_calibration
from exitbench.summaries import add_framework_speedup, summarize
from exitbench.tasks.base import require_isolation
from exitbench.tasks.registry import Task, TaskSettings, build_task

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
    trained: dict[str, Path] = field(default_factory=dict)  # option -> the file a TRAINED_FILES stage made
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
    trained = {option: models_dir / made.folder / name / made.file for option, made in TRAINED_FILES.items()}
    return EvalContext(
        name,
        model,
        tokenizer,
        draft,
        _model_key(model_dir),
        model_info,
        report_path(train_reports, name),
        {option: path for option, path in trained.items() if path.exists()},
    )


def run_methods(
    runs: dict[str, tuple[DecodingMethod, RecordFile]],
    batch: TaskBatch,
    desc: str,
    limits: Mapping[str, int] | None = None,
    shard: Shard | None = None,
    warm_each_sample: bool = False,
    references: Mapping[str, Mapping[str, DecodingMethod]] | None = None,
    reference_limit: int | None = None,
    batch_from: int | None = None,
    batch_size: int = 1,
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
    sample) the field is None: the record counts for quality, not for speed. With ``batch_size`` > 1, samples
    from ``batch_from`` on (past the timing sample) of a method with a batched form are decoded that many at a
    time first (:mod:`exitbench.quality_batches`; never timed, no reference).
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
        if batch_size > 1 and batch_from is not None:
            for name, (method, records) in runs.items():
                fields = list(references.get(name, {}))
                later = sorted(i for i in todo[name] if i >= batch_from)
                for done_now in _in_batches(method, batch, later, batch_size):
                    for index, record in done_now:
                        records.append({**record, **dict.fromkeys(fields)}, keys[index])
                        todo[name].discard(index)
                        bar.update()
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


def _in_batches(
    method: DecodingMethod, batch: TaskBatch, indices: list[int], size: int
) -> Iterator[list[tuple[int, dict[str, Any]]]]:
    """The records of ``indices`` under ``method``'s batched form, ``size`` prompts a batch (each batch's as it
    is done); nothing for a method without one. A batch that fails is left to the one-prompt path."""
    form = batched_form(method) if indices else None
    if form is None:
        return
    for chunk in length_batches(indices, batch.prompt_ids, size):
        try:
            results = decode_batch(form, batch.prompt_ids, chunk, batch.max_new_tokens, batch.stop)
        except ExitbenchError:
            raise
        except Exception as err:  # the one-prompt path records each sample's own failure
            tqdm.write(f"{method.name}: a batch of {len(chunk)} failed ({type(err).__name__}: {err}); one at a time")
            continue
        made = zip(chunk, results, strict=True)
        yield [(index, _one_sample(method, batch, index, result, len(chunk))) for index, result in made]


def _one_sample(
    method: DecodingMethod, batch: TaskBatch, index: int, made: DecodeResult | None = None, batch_size: int = 1
) -> dict[str, Any]:
    """Sample ``index``'s scored record under ``method``, generated here unless ``made`` (a batched row) is given."""
    sample = batch.samples[index]
    record: dict[str, Any] = {"index": index, "sample_id": sample.sample_id}
    try:
        if (result := made) is None:
            result = method.generate(batch.prompt_ids[index], batch.max_new_tokens, batch.stop)
        text = batch.tokenizer.decode(result.tokens, skip_special_tokens=True)
        completion = batch.task.postprocess(text)
        decode = result.to_dict() if batch_size == 1 else {**result.to_dict(), "batch_size": batch_size}
        record.update(tokens=result.tokens, completion=completion, decode=decode)
        record["scores"] = batch.task.score(sample, completion)
        record["error"] = None
    except ExitbenchError:
        raise
    except Exception as err:  # one broken sample is a recorded failure, not a failed run
        record.update(error=f"{type(err).__name__}: {err}", traceback=traceback.format_exc(limit=3))
    return record


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
    return write_corpus_calibration(
        data_dir / CALIBRATION_CORPORA[task.name] / "train.jsonl",
        ctx.tokenizer,
        CALIBRATION_ROWS,
        task.settings.seed,
        target,
    )


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


#: options naming a file evaluate gives a method; a record's settings name the file and its content, not its folder
FILE_OPTIONS = ("draft_vocab_file", "calibration_file", "adapter_file", "router_file")


def trained_files_for(ctx: EvalContext, label: str) -> dict[str, Path]:
    """The files of :data:`TRAINED_FILES` that ``label`` takes, for this model, each checked to be trained on
    these very weights (one line naming the stage to run otherwise)."""
    out = {}
    for option in method_class(label).Options.model_fields:
        if (made := TRAINED_FILES.get(option)) is None:
            continue
        path = ctx.trained.get(option)
        if path is None:
            raise ExitbenchError(
                f"evaluate: '{label}' runs on '{ctx.name}', which has no trained {made.what}; add {ctx.name} to "
                f"{made.section}.models in params.yaml and run `dvc repro {made.stage}`"
            )
        info = torch.load(path, map_location="cpu", weights_only=True).get("info", {})
        if info.get("model_key") != ctx.model_key:
            raise ExitbenchError(
                f"evaluate: {path} was trained on other weights than models/{ctx.name}'s (model key "
                f"{info.get('model_key')} vs {ctx.model_key}); run `dvc repro {made.stage}`"
            )
        out[option] = path
    return out


def file_option_key(value: str) -> str:
    """A file option's part of a record's settings: its name and a hash of its content (a draft vocabulary or
    calibration set that changes makes new records; where the file lives does not)."""
    path = Path(value)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16] if path.exists() else "missing"
    return f"{path.name}:{digest}"


def settings_key(cfg: Config, ctx: EvalContext, task: Task, label: str, options: dict[str, Any], chat: bool) -> str:
    """The key of everything a stored record of ``label`` was made with (see :class:`RecordFile`)."""
    settings = settings_of(cfg, ctx, task, label, options, chat)
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


def settings_of(
    cfg: Config, ctx: EvalContext, task: Task, label: str, options: dict[str, Any], chat: bool
) -> dict[str, Any]:
    """Everything a stored record of ``label`` is made with, part by part (its summary states them)."""
    return {
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


def method_options(
    cfg: Config,
    label: str,
    draft_vocab: Path | None,
    calibration: Path | None,
    trained: dict[str, Path] | None = None,
) -> dict[str, Any]:
    """``evaluate.methods[label]`` with the files evaluate prepared for the options that take them."""
    options = dict(cfg.evaluate.methods.get(label, {}))
    fields = method_class(label).Options.model_fields
    for option, path in (trained or {}).items():
        if option in fields:
            options[option] = str(path)
    if draft_vocab is not None and "draft_vocab_file" in fields:
        options["draft_vocab_file"] = str(draft_vocab)
    if calibration is not None and "calibration_file" in fields:
        options = {"calibration_file": str(calibration), **options}
    return options


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
    settings: dict[str, dict[str, Any]] = {}
    for label in labels:
        options = method_options(cfg, label, draft_vocab, calibration, trained_files_for(ctx, label))
        settings[label] = settings_of(cfg, ctx, task, label, options, chat)
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
    if shard.rank == 0:  # before the first sample: say so when stored results of other settings are recomputed
        records_of = {label: records for label, (_, records) in runs.items()}
        announce_recompute(f"evaluate@{stage} {ctx.name}/{task_name}", target, settings, records_of, batch, limits)
    warm = ctx.model.device.type == "cuda"
    run_args = {"references": references, "reference_limit": reference_sample_size(task_cfg), "warm_each_sample": warm,
                "batch_from": timing_samples, "batch_size": cfg.evaluate.quality_batch_size}
    if shard.world > 1:
        run_methods(runs, batch, f"{stage} {ctx.name}/{task_name} rank {shard.rank}", limits, shard, **run_args)
        shard.barrier()
        if shard.rank != 0:
            return {}
        runs = {
            label: (method, merge_shards(shard, target / f"{label}.jsonl", records.key))
            for label, (method, records) in runs.items()
        }
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
        summary["settings"] = settings[label]  # what that key hashes, part by part (what a later run compares)
        if (memory := getattr(method, "extra_memory", lambda: None)()) is not None:
            summary["extra_memory"] = memory  # a separate draft model's weights and cache, beside the model
        if (chosen := getattr(method, "calibration_summary", lambda: None)()) is not None:
            summary["calibration"] = chosen  # what the method chose on calibration text, and what choosing cost
        summary["model_info"] = ctx.model_info
        summary["provenance"] = provenance(stage_view(cfg, "evaluate"), ctx.model.device, cfg.base.dtype)
        summary["provenance"]["num_parameters"] = ctx.model_info["num_parameters"]
        summary["timing"] = timing_protocol(ctx.model.device.type)
        atomic_write_json(target / f"{label}.json", summary)
        summaries[label] = summary
    return summaries


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
        (model, task)
        for model in cfg.evaluate.models
        for task in cfg.evaluate.tasks
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
