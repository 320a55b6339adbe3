"""Shared fixtures: the seeded tiny random-weight Llama (4 layers, hidden 64, vocab 128)."""

from __future__ import annotations

import pytest
import torch

from exitbench.models.tiny import random_llama
from exitbench.models.view import EarlyExitModel

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_lm():
    """The Hugging Face model object (float32, eval mode)."""
    return random_llama(seed=0)


@pytest.fixture(scope="session")
def tiny_model(tiny_lm) -> EarlyExitModel:
    return EarlyExitModel(tiny_lm)
