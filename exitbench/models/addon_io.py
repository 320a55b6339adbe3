"""Saving and loading an add-on trained on a frozen model (Kangaroo's adapter, MindSkip's routers): written whole or
not at all, read back with one clear error naming the stage to rerun."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from exitbench.errors import ExitbenchError


def save_module(path: Path, payload: dict[str, Any]) -> None:
    """``payload`` (with a module's ``state_dict``, copied to the CPU) to ``path``, whole or not at all."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    state = {key: value.detach().cpu().clone() for key, value in payload["state_dict"].items()}
    torch.save({**payload, "state_dict": state}, temporary)
    temporary.replace(path)


def read_module(path: Path, expected_format: int, what: str, stage: str, section: str) -> dict[str, Any]:
    """The payload :func:`save_module` wrote at ``path``; one line naming the stage to run when it is missing or of
    another format."""
    if not path.exists():
        raise ExitbenchError(
            f"{what} {path} not found; run `dvc repro {stage}` ({section}.models in params.yaml names the models it "
            "trains for)"
        )
    payload = torch.load(path, map_location="cpu", weights_only=True)
    if payload.get("format") != expected_format:
        raise ExitbenchError(
            f"{path}: {what} format {payload.get('format')}, expected {expected_format}; rerun `dvc repro {stage}`"
        )
    return payload


def load_state(module: nn.Module, state: dict[str, torch.Tensor], path: Path, stage: str) -> None:
    """``module.load_state_dict(state)``, one line when the shapes say it was trained for another model."""
    try:
        module.load_state_dict(state)
    except RuntimeError as err:
        first = str(err).splitlines()[0]
        raise ExitbenchError(f"{path} was trained for another model ({first}); rerun `dvc repro {stage}`")
