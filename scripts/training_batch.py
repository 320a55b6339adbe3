"""The options and the micro-batch the training-step timing scripts share (``exit_loss_timing``, ``compile_timing``).

One micro-batch of a ``train.variants`` entry: its corpus drawn as the trainer draws it (mixture, sequence length,
steps x batch x accumulation examples, the profile's seed), the first ``batch_size`` rows collated.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from exitbench.cli import set_threads  # noqa: E402
from exitbench.config import Config, TrainVariant, load  # noqa: E402
from exitbench.models.load import load_tokenizer  # noqa: E402
from exitbench.training.corpora import Corpus, build_corpus, collate  # noqa: E402


def timing_parser(description: str, variant: str, repeats: int) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--variant", default=variant)
    parser.add_argument("--models", default="models", help="folder holding the prepared base model (models/base)")
    parser.add_argument("--data", default="data")
    parser.add_argument("--repeats", type=int, default=repeats)
    parser.add_argument("--out", required=True)
    return parser


@dataclass
class TrainingBatch:
    cfg: Config
    variant: TrainVariant
    base: Path  # the prepared base model
    tokenizer: Any
    corpus: Corpus
    ids: torch.Tensor
    labels: torch.Tensor


def training_batch(args: argparse.Namespace) -> TrainingBatch:
    """The variant's first micro-batch (threads set from the profile)."""
    cfg = load(args.params)
    set_threads(cfg.base.threads)
    v = cfg.train.variants[args.variant]
    base = Path(args.models) / "base"
    tokenizer = load_tokenizer(base)
    size = v.steps * v.batch_size * v.grad_accum
    corpus = build_corpus(v.corpus, Path(args.data), tokenizer, v.seq_len, size, cfg.base.seed)
    ids, labels = collate(corpus.examples[: v.batch_size], tokenizer.pad_token_id or 0)
    return TrainingBatch(cfg, v, base, tokenizer, corpus, ids, labels)
