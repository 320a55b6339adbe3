"""Prompts and greedy references shared by the decoding tests (tiny seeded model, see conftest.py)."""

from __future__ import annotations

import torch

from exitbench.decoding import build_method
from exitbench.models.view import EarlyExitModel


def prompts() -> list[list[int]]:
    """Three seeded prompts of 5, 12 and 17 tokens from the tiny model's vocabulary (ids 3..127)."""
    gen = torch.Generator().manual_seed(7)
    return [torch.randint(3, 128, (n,), generator=gen).tolist() for n in (5, 12, 17)]


def greedy_tokens(model: EarlyExitModel, max_new_tokens: int) -> list[list[int]]:
    """Greedy decoding's tokens for each of :func:`prompts`: the reference every exact method must equal."""
    method = build_method("autoregressive", model)
    return [method.generate(p, max_new_tokens).tokens for p in prompts()]
