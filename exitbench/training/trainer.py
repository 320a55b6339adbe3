"""The training loop: LayerSkip / CALM early-exit finetuning with checkpoints, resume and a report.

A plain PyTorch loop rather than the Hugging Face ``Trainer``: the early-exit loss needs the hidden state
after every enabled layer through the shared head, and layer dropout removes samples from individual
layers' batches. Both need a custom forward (:class:`EarlyExitObjective`), and the HF Trainer would hide
them behind ``compute_loss`` and the model's own forward while adding nothing the loop needs here.

One optimizer step t: draw the layer-dropout mask for the global batch (the trainer's seeded generator),
choose the enabled exits C(t, .), run the micro-batches (gradient accumulation, bf16 autocast), clip,
AdamW, linear warm-up + cosine LR. Every ``checkpoint_every`` steps the whole state is written atomically;
a re-run resumes from the last checkpoint, so a kill -9 at any moment loses at most that interval. The one
before it is kept too: a newest file that cannot be read (truncated, corrupt) falls back to it. Once the
model and report are saved, the run's checkpoints are deleted: they only serve to resume an unfinished run.

Under ``torchrun`` (:mod:`exitbench.training.distributed`, DDP or FSDP) checkpoints and the saved model are
written by rank 0 in the single-process format; under FSDP their full state is gathered from the shards first.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import pickle
import shutil
import statistics
import time
import zipfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from tqdm import tqdm

from exitbench.config import BaseConfig, TrainVariant
from exitbench.errors import ExitbenchError
from exitbench.models.load import load_causal_lm, load_tokenizer, resolve_device
from exitbench.subvocab import frequent_token_ids
from exitbench.training import distributed as dist_utils
from exitbench.training.corpora import Corpus, DataOrder, Example, build_corpus, collate
from exitbench.training.distributed import DistContext
from exitbench.training.early_exit_loss import EarlyExitObjective, exit_scales, normalized_weights
from exitbench.training.layer_dropout import keep_mask
from exitbench.training.schedules import dropout_rates, enabled_exits, lr_factor

logger = logging.getLogger(__name__)

# Fields that do not change the training trajectory; changing them keeps an existing checkpoint valid.
_NON_TRAJECTORY_FIELDS = ("checkpoint_every", "timing_steps")
_FINAL_EVAL_ROWS = 8
CHECKPOINT_FILE = "checkpoint.pt"
PREVIOUS_CHECKPOINT_FILE = "checkpoint.prev.pt"  # the one before, kept in case the newest cannot be read
# What torch.load raises on a truncated or corrupt file (zip reader, unpickler, legacy-format reader).
_UNREADABLE = (
    RuntimeError, EOFError, KeyError, ValueError, FileNotFoundError, pickle.UnpicklingError, zipfile.BadZipFile,
)


@dataclass(frozen=True)
class TrainPaths:
    base_model: Path
    data: Path
    out: Path
    checkpoints: Path
    report: Path


@dataclass
class TrainState:
    """Everything of a run, besides model/optimizer/RNG state, that a checkpoint carries."""

    step: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    weight_share: list[float] = field(default_factory=list)
    step_times: list[float] = field(default_factory=list)
    trained_tokens: int = 0
    trained_loss_tokens: int = 0
    resumed_from: int | None = None


@dataclass
class Run:
    """The wired-up pieces of one training run."""

    variant: TrainVariant
    seed: int
    ctx: DistContext
    device: torch.device
    objective: EarlyExitObjective  # sharded in place under FSDP
    module: torch.nn.Module  # the objective, DDP-wrapped when distributed (the objective itself under FSDP)
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    generator: torch.Generator
    corpus: Corpus
    order: DataOrder
    pad_id: int
    scales: list[float]
    fingerprint: str

    @property
    def num_layers(self) -> int:
        return self.objective.view.num_layers

    @property
    def global_batch(self) -> int:
        return self.variant.batch_size * self.variant.grad_accum

    @contextlib.contextmanager
    def compute(self) -> Iterator[None]:
        """bf16 autocast when the variant asks for it; on CPU, the math attention kernel: for training
        sequences this short (<= a few hundred tokens) it runs forward + backward ~3x faster than the flash one.
        """
        autocast = torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.variant.autocast_bf16)
        kernel = sdpa_kernel(SDPBackend.MATH) if self.device.type == "cpu" else contextlib.nullcontext()
        with autocast, kernel:
            yield


def fingerprint(variant: TrainVariant, seed: int, corpus: Corpus, base_model: Path) -> str:
    """Hash of what determines the trajectory: a checkpoint with another fingerprint is not resumed."""
    config = {k: v for k, v in variant.model_dump(mode="json").items() if k not in _NON_TRAJECTORY_FIELDS}
    base_config = (Path(base_model) / "config.json").read_text()
    payload = json.dumps(
        {"variant": config, "seed": seed, "corpus": corpus.totals(), "base": base_config}, sort_keys=True
    )
    return hashlib.sha256(payload.encode()).hexdigest()


def build_run(variant: TrainVariant, base: BaseConfig, paths: TrainPaths, ctx: DistContext) -> tuple[Run, Any]:
    """Load model, tokenizer and corpus; build objective, optimizer, scheduler and generator."""
    device = resolve_device(base.device)
    tokenizer = load_tokenizer(paths.base_model)
    causal_lm = load_causal_lm(paths.base_model, "float32", base.device).train()
    size = variant.max_examples or variant.steps * variant.batch_size * variant.grad_accum  # one pass of the run
    corpus = build_corpus(variant.corpus, paths.data, tokenizer, variant.seq_len, size, base.seed)
    objective = EarlyExitObjective(causal_lm)
    objective.exit_targets = variant.exit_targets
    if variant.exit_vocab_size:
        objective.set_exit_vocab(exit_vocabulary(corpus.examples, variant.exit_vocab_size, [tokenizer.eos_token_id]))
    if variant.freeze_embeddings:
        freeze_embeddings(causal_lm)
    module = dist_utils.wrap(objective, ctx, find_unused=variant.p_max > 0)
    optimizer = build_optimizer(causal_lm, variant, device)  # after wrap: FSDP replaces the parameters
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, variant.warmup_steps, variant.steps)
    )
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    run = Run(
        variant=variant,
        seed=base.seed,
        ctx=ctx,
        device=device,
        objective=objective,
        module=module,
        optimizer=optimizer,
        scheduler=scheduler,
        generator=torch.Generator().manual_seed(base.seed),
        corpus=corpus,
        order=DataOrder(len(corpus.examples), variant.batch_size * variant.grad_accum, base.seed),
        pad_id=int(pad_id or 0),
        scales=exit_scales(variant.recipe, objective.view.num_layers, variant.e_scale),
        fingerprint=fingerprint(variant, base.seed, corpus, paths.base_model),
    )
    return run, tokenizer


def target_tokens(example: Example) -> tuple[int, ...]:
    """The tokens ``example`` is trained to predict (the labels :func:`collate` leaves un-ignored)."""
    return example.tokens[max(example.prompt_len, 1) :]


def exit_vocabulary(examples: Sequence[Example], size: int, always: Iterable[int | None] = ()) -> list[int]:
    """The exits' sub-vocabulary: the ``size`` most frequent target tokens of the training examples (ties by
    id), plus ``always`` (the stop token: a draft must be able to end an answer)."""
    return frequent_token_ids(map(target_tokens, examples), size, [token for token in always if token is not None])


def exit_vocab_coverage(examples: Sequence[Example], vocab: Sequence[int]) -> float:
    """Share of the training target tokens inside ``vocab``: the share of positions that carry an exit loss."""
    chosen = set(vocab)
    total = sum(len(target_tokens(example)) for example in examples)
    inside = sum(token in chosen for example in examples for token in target_tokens(example))
    return inside / total if total else 0.0


def freeze_embeddings(causal_lm: torch.nn.Module) -> None:
    """Stop gradients into the token embedding and the LM head (the same tensor when they are tied)."""
    causal_lm.get_input_embeddings().weight.requires_grad_(False)
    causal_lm.get_output_embeddings().weight.requires_grad_(False)


def build_optimizer(causal_lm: torch.nn.Module, variant: TrainVariant, device: torch.device) -> torch.optim.AdamW:
    """AdamW over the trainable parameters; the fused kernel on CPU and CUDA (same update, one pass)."""
    params = [p for p in causal_lm.parameters() if p.requires_grad]
    if not params:
        raise ExitbenchError("train: no trainable parameters left; set freeze_embeddings: false")
    fused = device.type in ("cpu", "cuda")
    return torch.optim.AdamW(params, lr=variant.lr, weight_decay=variant.weight_decay, fused=fused)


def step_plan(run: Run, step: int) -> tuple[torch.Tensor, dict[int, float]]:
    """The layer-dropout keep mask [L, global batch] and the normalised exit weights e~(t, .) of step t."""
    v = run.variant
    rates = dropout_rates(step, v.steps, run.num_layers, v.p_max, v.dropout_schedule)
    keep = keep_mask(rates, run.global_batch, run.generator)
    exits = enabled_exits(v.curriculum, step, v.steps, run.num_layers, v.rotation)
    return keep, normalized_weights(run.scales, exits)


def micro_batches(rows: range, lengths: list[int], size: int) -> list[list[int]]:
    """This rank's rows of the global batch, in chunks of at most ``size`` (gradient accumulation).

    Rows are sorted by length first, so each micro-batch pads only to its own longest row: the step's
    loss (a sum over the global batch) is unchanged, and padded positions, pure waste, are fewer.
    """
    ordered = sorted(rows, key=lambda row: (lengths[row], row))
    return [ordered[i : i + size] for i in range(0, len(ordered), size)]


def accumulate_gradients(run: Run, batch: list[Example], keep: torch.Tensor, weights: dict[int, float]) -> torch.Tensor:
    """Gradients of J over the global ``batch`` into ``.grad``, from this rank's share of the rows.

    keep [L, len(batch)] is the layer-dropout mask of the whole batch, weights the exits' e~(t, .). The rows
    run in micro-batches of ``batch_size`` (gradient accumulation; ranks reduce gradients on the last one).
    Returns the per-exit CE sums over the global batch [E] (float64, summed over ranks).
    """
    num_tokens = sum(example.loss_tokens for example in batch)
    lengths = [len(example.tokens) for example in batch]
    chunks = micro_batches(dist_utils.shard(len(batch), run.ctx), lengths, run.variant.batch_size)
    must_run = keep.any(dim=1) if run.ctx.sharded else None  # FSDP: every rank calls the same layers
    ce_sums = torch.zeros(len(weights), dtype=torch.float64)
    for number, rows in enumerate(chunks):
        ids, labels = collate([batch[row] for row in rows], run.pad_id)
        ids, labels = ids.to(run.device), labels.to(run.device)
        with dist_utils.grad_sync(run.module, sync=number == len(chunks) - 1):
            with run.compute():
                loss, sums = run.module(ids, labels, keep[:, rows], weights, num_tokens, must_run=must_run)
            (loss * run.ctx.world_size).backward()  # DDP and FSDP average gradients over ranks; J is a global sum
        ce_sums += sums.double().cpu()
    return dist_utils.all_reduce_sum(ce_sums, run.ctx)


def train_step(run: Run, step: int) -> dict[str, Any]:
    """One optimizer step over the global batch; returns its losses (global means) and token counts."""
    keep, weights = step_plan(run, step)
    batch = [run.corpus.examples[index] for index in run.order.step_indices(step)]
    ce_sums = accumulate_gradients(run, batch, keep, weights)
    torch.nn.utils.clip_grad_norm_(run.objective.parameters(), run.variant.grad_clip)
    run.optimizer.step()
    run.scheduler.step()
    run.optimizer.zero_grad(set_to_none=True)
    num_tokens = sum(example.loss_tokens for example in batch)
    exit_losses = {layer: float(total) / num_tokens for layer, total in zip(sorted(weights), ce_sums, strict=True)}
    loss_value = sum(weights[layer] * value for layer, value in exit_losses.items())
    return {
        "step": step,
        "loss": loss_value,
        "exits": {str(layer): value for layer, value in exit_losses.items()},
        "weights": weights,
        "tokens": sum(len(example.tokens) for example in batch),
        "loss_tokens": num_tokens,
    }


def record_step(state: TrainState, result: dict[str, Any], seconds: float, num_layers: int) -> None:
    if not state.weight_share:
        state.weight_share = [0.0] * num_layers
    for layer, weight in result["weights"].items():
        state.weight_share[layer] += weight
    state.history.append({"step": result["step"], "loss": result["loss"], "exits": result["exits"]})
    state.step_times.append(seconds)
    state.trained_tokens += result["tokens"]
    state.trained_loss_tokens += result["loss_tokens"]
    state.step = result["step"] + 1


def checkpoint_payload(run: Run, state: TrainState) -> dict[str, Any]:
    """The whole state of the run; under FSDP every rank must call it (gathering), rank 0's is complete."""
    model, optimizer = dist_utils.full_state(run.objective.lm, run.optimizer, run.ctx)
    return {
        "fingerprint": run.fingerprint,
        "model": model,
        "optimizer": optimizer,
        "scheduler": run.scheduler.state_dict(),
        "state": asdict(state),
        "rng": {"torch": torch.get_rng_state(), "dropout": run.generator.get_state()},
        "data_order": {"seed": run.order.seed, "num_examples": run.order.num_examples, "step": state.step},
    }


def restore(run: Run, checkpoint_dir: Path) -> TrainState:
    """The state to continue from: the last checkpoint when it matches this run's fingerprint, else fresh."""
    payload = load_checkpoint(checkpoint_dir)
    if payload is None:
        return TrainState()
    if payload["fingerprint"] != run.fingerprint:
        logger.warning("%s: checkpoint is from another config or corpus; training from step 0", checkpoint_dir)
        return TrainState()
    dist_utils.load_full_state(run.objective.lm, run.optimizer, payload["model"], payload["optimizer"], run.ctx)
    run.scheduler.load_state_dict(payload["scheduler"])
    torch.set_rng_state(payload["rng"]["torch"])
    run.generator.set_state(payload["rng"]["dropout"])
    state = TrainState(**payload["state"])
    state.resumed_from = state.step
    return state


def train_loop(run: Run, state: TrainState, checkpoint_dir: Path, stop: int, progress: bool) -> TrainState:
    """Steps state.step .. stop-1, with a checkpoint every ``checkpoint_every`` steps and at the end."""
    variant = run.variant
    bar = tqdm(total=variant.steps, initial=state.step, disable=not (progress and run.ctx.is_main), desc="train")
    with bar:
        for step in range(state.step, stop):
            started = time.perf_counter()
            result = train_step(run, step)
            record_step(state, result, time.perf_counter() - started, run.num_layers)
            bar.update(1)
            bar.set_postfix({f"x{layer}": f"{value:.3f}" for layer, value in result["exits"].items()})
            if state.step % variant.checkpoint_every == 0 or state.step == variant.steps:
                payload = checkpoint_payload(run, state)  # on every rank: FSDP gathers the shards
                if run.ctx.is_main:
                    save_checkpoint(checkpoint_dir, payload)
                dist_utils.barrier(run.ctx)
    return state


def _eval_batch(run: Run, examples: list[Example]) -> tuple[torch.Tensor, torch.Tensor, int]:
    ids, labels = collate(examples, run.pad_id)
    return ids.to(run.device), labels.to(run.device), sum(example.loss_tokens for example in examples)


def final_exit_losses(run: Run, examples: list[Example]) -> dict[str, float]:
    """Mean CE at every exit over the whole vocabulary (with or without an exit sub-vocabulary, so variants
    compare), no layer dropout, no gradient, on ``examples``."""
    ids, labels, num_tokens = _eval_batch(run, examples)
    keep = torch.ones(run.num_layers, len(examples), dtype=torch.bool)
    weights = {layer: 1.0 for layer in range(run.num_layers)}
    with torch.no_grad(), run.compute():
        _, sums = run.objective(ids, labels, keep, weights, num_tokens, full_vocab=True)
    return {str(layer): float(total) / num_tokens for layer, total in enumerate(sums)}


def _time_fwd_bwd(run: Run, batch: tuple, keep: torch.Tensor, weights: dict[int, float]) -> float:
    """Seconds for one forward + backward of the objective (gradients discarded)."""
    ids, labels, num_tokens = batch
    started = time.perf_counter()
    with run.compute():
        loss, _ = run.objective(ids, labels, keep, weights, num_tokens)
    loss.backward()
    seconds = time.perf_counter() - started
    run.objective.zero_grad(set_to_none=True)
    return seconds


def measure_overhead(run: Run, examples: list[Example], last_step: int) -> dict[str, Any]:
    """Step time (forward + backward) of the early-exit objective vs plain training on the same batch.

    Plain = last-layer CE only, no layer dropout. The early-exit side uses the exits and dropout rates of
    the steps ``last_step - n + 1 .. last_step`` (n = ``timing_steps``), so the rotation's varying number of
    head evaluations is sampled. The two are timed alternately after one warm-up each, so a change of load
    on the machine hits both; ratio = median of the per-pair ratios. The optimizer step is the same for
    both and left out, so the ratio bounds the whole-step ratio from above. Dropout masks come from their
    own seeded generator: timing never changes the training trajectory.
    """
    v, layers = run.variant, run.num_layers
    batch = _eval_batch(run, examples)
    generator = torch.Generator().manual_seed(run.seed + 7)
    plain_keep = torch.ones(layers, len(examples), dtype=torch.bool)
    plain_weights = {layers - 1: 1.0}
    steps = [max(last_step - i, 0) for i in range(v.timing_steps)][::-1]
    plans = []
    for step in steps:
        rates = dropout_rates(step, v.steps, layers, v.p_max, v.dropout_schedule)
        exits = enabled_exits(v.curriculum, step, v.steps, layers, v.rotation)
        plans.append((keep_mask(rates, len(examples), generator), normalized_weights(run.scales, exits)))
    _time_fwd_bwd(run, batch, plain_keep, plain_weights)  # warm-ups
    _time_fwd_bwd(run, batch, *plans[0])
    plain, early = [], []
    for keep, weights in plans:
        plain.append(_time_fwd_bwd(run, batch, plain_keep, plain_weights))
        early.append(_time_fwd_bwd(run, batch, keep, weights))
    return {
        "ratio": statistics.median(e / p for e, p in zip(early, plain, strict=True)),
        "plain_s": plain,
        "early_exit_s": early,
        "steps": steps,
        "head_evaluations": [len(weights) for _, weights in plans],
        "rows": len(examples),
        "measures": "forward+backward, alternating plain/early-exit; optimizer step excluded (same for both)",
    }


def save_checkpoint(checkpoint_dir: Path, payload: dict[str, Any]) -> None:
    """torch.save to a temporary file, fsync, then os.replace: each checkpoint is always whole or absent.

    The previous newest checkpoint is then renamed to ``checkpoint.prev.pt``, so the last two are kept. The
    one before that is deleted before writing, so at most two checkpoints are ever on disk at once (the newest
    stays readable while the next one is written).
    """
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    for stale in checkpoint_dir.glob(f"{CHECKPOINT_FILE}.tmp-*"):  # left by a save that was killed
        stale.unlink(missing_ok=True)
    if (checkpoint_dir / CHECKPOINT_FILE).exists():
        (checkpoint_dir / PREVIOUS_CHECKPOINT_FILE).unlink(missing_ok=True)
    temporary = checkpoint_dir / f"{CHECKPOINT_FILE}.tmp-{os.getpid()}"
    with open(temporary, "wb") as handle:
        torch.save(payload, handle)
        handle.flush()
        os.fsync(handle.fileno())
    newest = checkpoint_dir / CHECKPOINT_FILE
    if newest.exists():  # a kill between the two renames leaves only the previous one: load_checkpoint uses it
        os.replace(newest, checkpoint_dir / PREVIOUS_CHECKPOINT_FILE)
    os.replace(temporary, newest)


def _read_checkpoint(path: Path) -> tuple[dict[str, Any] | None, str]:
    """``(payload, "")``, or ``(None, reason)`` when torch cannot read the file (truncated or corrupt)."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True), ""
    except _UNREADABLE as err:
        detail = (str(err).splitlines() or [""])[0][:100]
        return None, f"{type(err).__name__}: {detail}" if detail else type(err).__name__


def load_checkpoint(checkpoint_dir: Path) -> dict[str, Any] | None:
    """The newest readable checkpoint in ``checkpoint_dir`` (None if there is none).

    A newest file that cannot be read falls back to the previous one, with one warning naming it; the bad
    file is moved aside (``checkpoint.pt.unreadable``) so the next save keeps the good one as the previous.
    When no file can be read, one error naming the folder. Leftovers of killed saves are ignored.
    """
    paths = [checkpoint_dir / name for name in (CHECKPOINT_FILE, PREVIOUS_CHECKPOINT_FILE)]
    problems: list[str] = []
    for path in filter(Path.exists, paths):
        payload, reason = _read_checkpoint(path)
        if payload is None:
            problems.append(f"{path.name}: {reason}")
            continue
        if problems:
            logger.warning("%s: cannot read %s; resuming from %s", checkpoint_dir, problems[0], path.name)
            with contextlib.suppress(FileNotFoundError):  # another rank may have moved it already
                os.replace(paths[0], paths[0].with_name(f"{CHECKPOINT_FILE}.unreadable"))
        return payload
    if not problems:
        return None
    raise ExitbenchError(
        f"{checkpoint_dir}: no checkpoint can be read ({'; '.join(problems)}); "
        f"delete {checkpoint_dir} to train from step 0"
    )


def clear_checkpoints(checkpoint_dir: Path) -> None:
    """Delete a finished run's checkpoints (the directory stays, empty).

    They exist only to resume an unfinished run; the saved model and report are the results. Any change of
    the trajectory's settings starts from step 0 anyway, so a finished run's checkpoints are never reused, and
    each one is model + AdamW state (about 1.4 GB for a 135M model).
    """
    for path in [*checkpoint_dir.glob(f"{CHECKPOINT_FILE}*"), checkpoint_dir / PREVIOUS_CHECKPOINT_FILE]:
        path.unlink(missing_ok=True)  # newest, temporaries, one moved aside as unreadable, previous


def atomic_write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    temporary.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(temporary, path)


def atomic_save_model(causal_lm: torch.nn.Module, tokenizer: Any, out: Path) -> None:
    """save_pretrained (safetensors) + tokenizer into a temporary sibling dir, then rename it to ``out``.

    An existing ``out`` is moved aside first and removed after, so ``out`` is never a partial model.
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    for stale in out.parent.glob(f".{out.name}.partial-*"):
        shutil.rmtree(stale, ignore_errors=True)
    temporary = out.parent / f".{out.name}.partial-{os.getpid()}"
    causal_lm.eval()
    causal_lm.save_pretrained(temporary, safe_serialization=True)
    tokenizer.save_pretrained(temporary)
    old = out.parent / f".{out.name}.old-{os.getpid()}"
    if out.exists():
        os.replace(out, old)
    os.replace(temporary, out)
    shutil.rmtree(old, ignore_errors=True)


def build_report(run: Run, state: TrainState, name: str, final: dict[str, float], timing: dict | None) -> dict:
    """train_report.json: steps, losses per exit, token counts, step times, loss-weight shares, config."""
    steps_done = len(state.history)
    last_seen: dict[str, float] = {}
    for entry in state.history:
        last_seen.update(entry["exits"])
    times = state.step_times
    return {
        "variant": name,
        "config": run.variant.model_dump(mode="json"),
        "seed": run.seed,
        "world_size": run.ctx.world_size,
        "steps": state.step,
        "resumed_from_step": state.resumed_from,
        "final_loss": state.history[-1]["loss"] if state.history else None,
        "final_exit_losses": final,
        "last_seen_exit_losses": dict(sorted(last_seen.items(), key=lambda item: int(item[0]))),
        "loss_weight_share": {str(i): share / max(steps_done, 1) for i, share in enumerate(state.weight_share)},
        "tokens": {
            "corpus": run.corpus.totals(),
            "per_source": run.corpus.counts,
            "trained_tokens": state.trained_tokens,
            "trained_loss_tokens": state.trained_loss_tokens,
        },
        "time_per_step_s": {
            "mean": statistics.fmean(times) if times else None,
            "median": statistics.median(times) if times else None,
            "total": sum(times),
        },
        "trainable_parameters": sum(p.numel() for p in run.objective.parameters() if p.requires_grad),
        "exit_vocab": exit_vocab_report(run),
        "step_time_ratio": timing,
        "history": state.history,
    }


def exit_vocab_report(run: Run) -> dict[str, Any] | None:
    """Size of the exits' sub-vocabulary and the share of training target tokens it covers (None: full)."""
    vocab = run.objective.exit_vocab
    if vocab is None:
        return None
    ids = vocab.tolist()
    return {"size": len(ids), "target_coverage": exit_vocab_coverage(run.corpus.examples, ids)}


def unsharded(run: Run, base_model: Path) -> Run:
    """``run``, or under FSDP a copy of it on rank 0 around a whole model with the trained weights.

    What :func:`finish` does on rank 0 alone (evaluation, timing, ``save_pretrained``) then needs no other rank.
    Collective under FSDP (every rank calls it; the other ranks get ``run`` back).
    """
    if not run.ctx.sharded:
        return run
    model_state = dist_utils.full_model_state(run.objective.lm, run.ctx)
    if not run.ctx.is_main:
        return run
    causal_lm = load_causal_lm(base_model, "float32", run.device.type).train()
    causal_lm.load_state_dict(model_state)
    if run.variant.freeze_embeddings:
        freeze_embeddings(causal_lm)
    objective = EarlyExitObjective(causal_lm)
    objective.set_exit_vocab(None if run.objective.exit_vocab is None else run.objective.exit_vocab.tolist())
    objective.exit_targets = run.objective.exit_targets
    return replace(run, objective=objective, module=objective)


def finish(run: Run, state: TrainState, tokenizer: Any, paths: TrainPaths, name: str) -> dict[str, Any]:
    """Rank 0: final per-exit losses, the step-time ratio, the model dir and the report."""
    examples = [run.corpus.examples[i] for i in run.order.step_indices(max(state.step - 1, 0))]
    final = final_exit_losses(run, examples[:_FINAL_EVAL_ROWS])
    rows = examples[: run.variant.batch_size]
    timing = measure_overhead(run, rows, max(state.step - 1, 0)) if run.variant.timing_steps else None
    atomic_save_model(run.objective.lm, tokenizer, paths.out)
    report = build_report(run, state, name, final, timing)
    atomic_write_json(paths.report, report)
    return report


def train(
    variant: TrainVariant,
    base: BaseConfig,
    paths: TrainPaths,
    name: str = "train",
    max_steps_this_run: int | None = None,
    progress: bool = True,
) -> dict[str, Any] | None:
    """Train (or resume) one variant; returns the report, or None when stopped by ``max_steps_this_run``.

    Runs single-process, or as one rank of a ``torchrun`` job when ``variant.distributed`` is ``ddp`` or ``fsdp``.
    ``max_steps_this_run`` stops after that many steps without saving anything beyond the regular
    checkpoints, which is what a kill at that moment leaves behind (used by the resume test).
    """
    torch.manual_seed(base.seed)
    with dist_utils.session(variant.distributed, resolve_device(base.device)) as ctx:
        run, tokenizer = build_run(variant, base, paths, ctx)
        state = restore(run, paths.checkpoints)
        stop = variant.steps if max_steps_this_run is None else min(variant.steps, state.step + max_steps_this_run)
        state = train_loop(run, state, paths.checkpoints, stop, progress)
        if state.step < variant.steps:
            return None
        run = unsharded(run, paths.base_model)
        report = finish(run, state, tokenizer, paths, name) if ctx.is_main else None
        dist_utils.barrier(ctx)
        if ctx.is_main:
            clear_checkpoints(paths.checkpoints)
        return report
