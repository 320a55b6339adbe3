"""What every add-on trained on a frozen model shares (Kangaroo's adapter, MindSkip's routers): the frozen
model, the resumable loop and the per-model setup of its stage.

The loop: AdamW on the add-on's parameters, warm-up + cosine (:func:`exitbench.training.schedules.lr_factor`), the
trainer's data order (:class:`DataOrder`: resuming at step t needs nothing but t), a checkpoint (add-on +
optimizer + step + curves) every ``checkpoint_every`` steps written whole or not at all, and a progress bar.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm import tqdm

from exitbench.config import BaseConfig, FrozenTrainingConfig
from exitbench.errors import ExitbenchError
from exitbench.models.load import load_early_exit_model, load_tokenizer
from exitbench.models.sources import absent_role
from exitbench.models.trained import TrainedFile
from exitbench.models.view import EarlyExitModel
from exitbench.training import schedules
from exitbench.training.corpora import DataOrder, Example, build_corpus, collate
from exitbench.training.trainer import clear_checkpoints, load_checkpoint, save_checkpoint

#: one step's loss and the curves' other values (name -> value), from a batch ``(ids, labels)``
StepLoss = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, dict[str, float]]]


@contextmanager
def frozen(model: EarlyExitModel) -> Iterator[None]:
    """No gradient reaches ``model``'s own parameters meanwhile; their ``requires_grad`` is restored after."""
    params = list(model.hf.parameters())
    trainable = [param.requires_grad for param in params]
    for param in params:
        param.requires_grad_(False)
    try:
        yield
    finally:
        for param, flag in zip(params, trainable, strict=True):
            param.requires_grad_(flag)


@dataclass
class FrozenRun:
    """One add-on's training on a frozen model: the model, the add-on, its optimizer, the data and their order."""

    model: EarlyExitModel
    module: nn.Module
    cfg: FrozenTrainingConfig
    train: list[Example]
    held_out: list[Example]
    pad_id: int
    seed: int
    optimizer: torch.optim.AdamW = field(init=False)
    order: DataOrder = field(init=False)

    def __post_init__(self) -> None:
        self.optimizer = torch.optim.AdamW(self.module.parameters(), lr=self.cfg.lr, weight_decay=0.0)
        self.order = DataOrder(len(self.train), self.cfg.batch_size, self.seed)

    def held_out_batches(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The held-out examples, ``batch_size`` at a time, collated."""
        for start in range(0, len(self.held_out), self.cfg.batch_size):
            yield collate(self.held_out[start : start + self.cfg.batch_size], self.pad_id)


@dataclass
class Curves:
    """What a finished loop reports: the loss per step, the other per-step values, and the seconds spent."""

    losses: list[float]
    values: dict[str, list[float]]
    seconds: float


def train_loop(
    run: FrozenRun, step_loss: StepLoss, checkpoints: Path, identity: dict[str, Any], desc: str, progress: bool
) -> Curves:
    """``cfg.steps`` optimizer steps of ``step_loss`` on ``run.module`` with the model frozen, resuming from
    ``checkpoints`` when they hold a run of the same ``identity`` (one error naming the folder otherwise); the
    finished run's checkpoints are deleted."""
    cfg, module = run.cfg, run.module
    payload = load_checkpoint(checkpoints)
    step, curves = 0, Curves([], {}, 0.0)
    if payload is not None:
        if payload.get("identity") != identity:
            raise ExitbenchError(
                f"{checkpoints} holds another run's checkpoint ({', '.join(identity)} differ); delete {checkpoints} "
                "to train from step 0"
            )
        module.load_state_dict(payload["module"])
        run.optimizer.load_state_dict(payload["optimizer"])
        step, curves = payload["step"], Curves(payload["losses"], payload["values"], payload["seconds"])
    module.train()
    bar = tqdm(total=cfg.steps, initial=step, disable=not progress, desc=desc)
    with frozen(run.model):
        while step < cfg.steps:
            start = time.perf_counter()
            for group in run.optimizer.param_groups:
                group["lr"] = cfg.lr * schedules.lr_factor(step, cfg.warmup_steps, cfg.steps)
            ids, labels = collate([run.train[i] for i in run.order.step_indices(step)], run.pad_id)
            loss, values = step_loss(ids, labels)
            run.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(module.parameters(), 1.0)
            run.optimizer.step()
            step += 1
            curves.losses.append(round(loss.item(), 5))
            for name, value in values.items():
                curves.values.setdefault(name, []).append(round(value, 4))
            curves.seconds += time.perf_counter() - start
            bar.update(1)
            bar.set_postfix(loss=f"{curves.losses[-1]:.3f}", **{k: f"{v:.2f}" for k, v in values.items()})
            if step % cfg.checkpoint_every == 0 and step < cfg.steps:
                state = {"module": module.state_dict(), "optimizer": run.optimizer.state_dict(), "step": step}
                save_checkpoint(checkpoints, {**state, **vars(curves), "identity": identity})
    bar.close()
    module.eval()
    clear_checkpoints(checkpoints)
    return curves


def prepare_run(
    name: str,
    build: Callable[[EarlyExitModel], nn.Module],
    cfg: FrozenTrainingConfig,
    made: TrainedFile,
    base: BaseConfig,
    models_dir: Path,
    data_dir: Path,
) -> tuple[FrozenRun, dict[str, int]]:
    """Model ``name`` (fp32), the add-on ``build`` makes for it and its training text, as a run; and the corpus
    counts. One line when ``<section>.models`` names a model this run does not have or has not made yet."""
    model_dir = models_dir / name
    if (absent := absent_role(model_dir)) is not None:
        raise ExitbenchError(
            f"{made.section}.models names '{name}', which this run has no model for ({absent['why']}); "
            f"remove it from {made.section}.models"
        )
    if not (model_dir / "config.json").exists():
        raise ExitbenchError(
            f"{made.stage}: model '{name}' not found at {model_dir}; run `dvc repro` for the stage that makes it "
            "(prepare_model or train) first"
        )
    model = load_early_exit_model(model_dir, "float32", base.device)
    tokenizer = load_tokenizer(model_dir)
    rows = cfg.steps * cfg.batch_size + cfg.held_out
    corpus = build_corpus(cfg.corpus, data_dir, tokenizer, cfg.seq_len, rows, base.seed)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    held_out, train = corpus.examples[: cfg.held_out], corpus.examples[cfg.held_out :]
    return FrozenRun(model, build(model), cfg, train, held_out, int(pad or 0), base.seed), corpus.counts
