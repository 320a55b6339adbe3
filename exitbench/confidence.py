"""CALM's three local confidence measures, and the early-exit classifier's training and storage.

Schuster et al. 2022, "Confident Adaptive Language Modeling" (CALM, arXiv:2207.07061), §3.5: after
layer ``i`` a token exits when its confidence ``c_t^i`` exceeds the (decaying) threshold. The measures
are pure functions of tensors; only :func:`train_exit_classifier` touches a model (frozen, read only).

Layer numbers here are counts: "layer ``i``" is the hidden state after running layers ``0..i-1``,
so ``i`` ranges over ``1..L`` and ``0`` is the embedding output (as ``exit_layer`` elsewhere).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F

from exitbench.errors import ExitbenchError
from exitbench.models.view import EarlyExitModel

CLASSIFIER_FORMAT = "exitbench-calm-exit-classifier-v1"


def softmax_response(logits: torch.Tensor) -> torch.Tensor:
    """Softmax response (CALM §3.5): top-1 minus top-2 probability of ``softmax(logits)``, over the last dim.

    ``logits [..., V]`` come from the shared head applied to the layer-``i`` state. Result ``[...]`` in
    ``[0, 1]``; 1 means a one-hot prediction, 0 a tie between the two best tokens.
    """
    probs = torch.softmax(logits.float(), dim=-1)
    top = torch.topk(probs, k=2, dim=-1).values
    return top[..., 0] - top[..., 1]


def state_saturation(hidden: torch.Tensor, previous: torch.Tensor) -> torch.Tensor:
    """Hidden-state saturation (CALM §3.5): ``cos(h_t^i, h_t^{i-1})`` over the last dim.

    ``hidden`` is the state after layer ``i``, ``previous`` the state after layer ``i-1`` (the embedding
    for ``i = 1``). Near 1 when the layer barely changed the state. Result in ``[-1, 1]``.
    """
    return F.cosine_similarity(hidden.float(), previous.float(), dim=-1)


def classifier_confidence(features: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Early-exit classifier (CALM §3.5): ``sigmoid(w · h + b)``, one linear map shared across layers.

    ``features [..., H]`` are the layer-``i`` states passed through the model's final norm
    (:func:`classifier_features`); ``weight [H]``, ``bias []``: the ``H + 1`` trained parameters.
    """
    return torch.sigmoid(features.float() @ weight.float() + bias.float())


def classifier_features(model: EarlyExitModel, hidden: torch.Tensor) -> torch.Tensor:
    """The classifier's input: the final norm of the layer-``i`` state, the input the shared head sees.

    The residual stream's scale grows with depth; normalising it lets one linear classifier serve every
    layer (CALM shares its classifier across layers, §3.5).
    """
    return model.norm(hidden)


def oracle_labels(layer_logits: torch.Tensor, final_logits: torch.Tensor) -> torch.Tensor:
    """CALM Eq. 6's target: ``1[argmax p(y | d^i) == argmax p(y | d^L)]`` per position, as floats."""
    return (layer_logits.argmax(-1) == final_logits.argmax(-1)).float()


def classifier_loss(
    weight: torch.Tensor, bias: torch.Tensor, features: torch.Tensor, labels: torch.Tensor
) -> torch.Tensor:
    """CALM Eq. 6: binary cross-entropy of the classifier against the oracle labels, averaged over layers.

    ``features [K, N, H]`` and ``labels [K, N]`` hold ``N`` token positions at each of ``K`` layers; the
    per-layer mean cross-entropies are averaged with equal weight (``1/L sum_i``).
    """
    scores = features @ weight + bias  # [K, N]
    per_layer = F.binary_cross_entropy_with_logits(scores, labels, reduction="none").mean(dim=1)
    return per_layer.mean()


@torch.no_grad()
def collect_classifier_data(
    model: EarlyExitModel, token_id_sequences: Sequence[Sequence[int]], layers: Sequence[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Features ``[K, N, H]`` and oracle labels ``[K, N]`` from full forwards of the frozen model.

    Every position of every sequence is one example at each layer count in ``layers`` (1..L).
    """
    num_layers = model.num_layers
    bad = [layer for layer in layers if not 1 <= layer <= num_layers]
    if not layers or bad:
        raise ExitbenchError(
            f"exit classifier layers must be a non-empty subset of 1..{num_layers}, got {list(layers)}"
        )
    sequences = [list(seq) for seq in token_id_sequences if len(seq) > 0]
    if not sequences:
        raise ExitbenchError("exit classifier training needs at least one non-empty token sequence")
    wanted = sorted(set(layers))
    features: list[list[torch.Tensor]] = [[] for _ in wanted]
    labels: list[list[torch.Tensor]] = [[] for _ in wanted]
    for seq in sequences:
        hidden = model.embed(torch.tensor([seq], dtype=torch.long, device=model.device))
        rope = model.rope(hidden, 0)
        states: dict[int, torch.Tensor] = {}
        for index in range(num_layers):
            hidden = model.layer_forward(index, hidden, rope)
            if index + 1 in wanted:
                states[index + 1] = hidden[0]
        final_logits = model.logits(hidden[0:1])[0]
        for k, layer in enumerate(wanted):
            state = states[layer]
            features[k].append(classifier_features(model, state).float().cpu())
            labels[k].append(oracle_labels(model.logits(state.unsqueeze(0))[0], final_logits).cpu())
    return torch.stack([torch.cat(f) for f in features]), torch.stack([torch.cat(y) for y in labels])


def train_exit_classifier(
    model: EarlyExitModel,
    token_id_sequences: Sequence[Sequence[int]],
    layers: Sequence[int],
    steps: int = 200,
    lr: float = 1e-2,
    seed: int = 0,
) -> dict[str, torch.Tensor]:
    """Train CALM's early-exit classifier on a frozen model (CALM §3.5, Eq. 6); returns its state dict.

    Full-batch Adam on :func:`classifier_loss` over the features of :func:`collect_classifier_data`.
    The state dict holds ``weight [H]``, ``bias []`` (float32, CPU) and ``layers`` (the layer counts
    trained on), ready for :func:`save_exit_classifier`.
    """
    if steps < 1 or lr <= 0:
        raise ExitbenchError(f"exit classifier training needs steps >= 1 and lr > 0 (got steps={steps}, lr={lr})")
    features, labels = collect_classifier_data(model, token_id_sequences, layers)
    generator = torch.Generator().manual_seed(seed)
    hidden_size = features.shape[-1]
    weight = (torch.randn(hidden_size, generator=generator) / hidden_size**0.5).requires_grad_(True)
    bias = torch.zeros((), requires_grad=True)
    optimizer = torch.optim.Adam([weight, bias], lr=lr)
    with torch.enable_grad():
        for _ in range(steps):
            optimizer.zero_grad()
            loss = classifier_loss(weight, bias, features, labels)
            loss.backward()
            optimizer.step()
    return {
        "weight": weight.detach().clone(),
        "bias": bias.detach().clone(),
        "layers": torch.tensor(sorted(set(layers)), dtype=torch.long),
    }


def save_exit_classifier(state: dict[str, torch.Tensor], path: str | Path) -> Path:
    """Write a classifier state dict (from :func:`train_exit_classifier`) to ``path`` with torch.save."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"format": CLASSIFIER_FORMAT, **{key: value.cpu() for key, value in state.items()}}
    tmp = path.with_name(f".{path.name}.tmp")
    torch.save(payload, tmp)
    tmp.replace(path)
    return path


def load_exit_classifier(path: str | Path, hidden_size: int | None = None) -> dict[str, torch.Tensor]:
    """Read a classifier saved by :func:`save_exit_classifier`, checking its width against ``hidden_size``."""
    path = Path(path)
    if not path.exists():
        raise ExitbenchError(f"{path}: exit classifier not found; run the calibrate stage with measure 'classifier'")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # any unreadable file is the same user-facing problem
        kind = type(err).__name__
        raise ExitbenchError(f"{path}: not a readable exit classifier ({kind}); delete it and re-run") from None
    if not isinstance(payload, dict) or payload.get("format") != CLASSIFIER_FORMAT:
        raise ExitbenchError(f"{path}: not an exitbench exit classifier (format tag missing); delete it and re-run")
    weight, bias = payload.get("weight"), payload.get("bias")
    if not isinstance(weight, torch.Tensor) or weight.dim() != 1 or not isinstance(bias, torch.Tensor):
        raise ExitbenchError(f"{path}: exit classifier lacks a 1-D 'weight' and a scalar 'bias'; delete it and re-run")
    if hidden_size is not None and weight.numel() != hidden_size:
        raise ExitbenchError(
            f"{path}: exit classifier has width {weight.numel()} but the model's hidden size is {hidden_size}; "
            "it was trained for another model"
        )
    return {key: value for key, value in payload.items() if key != "format"}
