"""Load a prepared model directory (safetensors + tokenizer) for every stage after `prepare_model`."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from exitbench.errors import ExitbenchError
from exitbench.models.view import EarlyExitModel

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def torch_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ExitbenchError(f"unknown dtype '{name}'; allowed: {', '.join(DTYPES)}")
    return DTYPES[name]


def resolve_device(name: str) -> torch.device:
    """'cpu', 'cuda' or 'auto' (cuda when available) -> a torch.device, with a clear error if absent."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ExitbenchError("base.device is 'cuda' but torch sees no CUDA device; set base.device: cpu or auto")
    return torch.device(name)


def _require_model_dir(path: Path) -> None:
    marker = path / "absent.json"
    if marker.exists():
        raise ExitbenchError(
            f"{path}: this role is not part of the active experiment ({marker}); remove it from the stage's models "
            "list in params.yaml, or give the role a source in the experiment"
        )
    if not (path / "config.json").exists():
        raise ExitbenchError(
            f"{path}: no prepared model (config.json missing); run `dvc repro prepare_model` "
            "(or the train stage for a trained variant) first"
        )


def load_causal_lm(path: str | Path, dtype: str = "float32", device: str = "cpu") -> torch.nn.Module:
    """A prepared ``*ForCausalLM`` in eval mode, on ``device`` in ``dtype``."""
    path = Path(path)
    _require_model_dir(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype(dtype))
    return model.to(resolve_device(device)).eval()


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    path = Path(path)
    _require_model_dir(path)
    return AutoTokenizer.from_pretrained(path)


def load_early_exit_model(path: str | Path, dtype: str = "float32", device: str = "cpu") -> EarlyExitModel:
    return EarlyExitModel(load_causal_lm(path, dtype, device))
