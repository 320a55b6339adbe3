"""Kangaroo's adapter: what turns a shallow layer's hidden state into a draft (Liu et al. 2024, arXiv:2404.18911, §3.1).

The draft model of Kangaroo is the target model's own first ``E`` layers (the shallow sub-network) followed by a
small adapter: one multi-head attention with a normalisation before it, and the model's LM head. Its input is
the layer-``E`` hidden state ``h`` (what layers ``0..E-1`` compute for the full model, so drafting writes the same
K/V a verification reads); its output ``h + Attn(Norm(h))`` goes through the model's own final norm and LM head
(the shared exit head of :class:`EarlyExitModel`). The adapter attends over its own K/V cache of every earlier
position's layer-``E`` state.

Where this differs from the paper, and why: the paper's second normalisation is trained with the adapter; here
it is the model's final norm, frozen, so the adapter's output reads through exactly the exit head (and its draft
sub-vocabulary) every other early-exit method here drafts with. The adapter starts as a copy of layer ``E``'s
attention and input norm (a warm start: the paper does not say how it is initialised).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from exitbench.errors import ExitbenchError
from exitbench.models.addon_io import load_state, read_module, save_module
from exitbench.models.cache import KVCache
from exitbench.models.view import EarlyExitModel, apply_rope, causal_mask

ADAPTER_FORMAT = 1
ADAPTER_FILE = "kangaroo.pt"  # <models>/adapters/<model>/ADAPTER_FILE, written by train_adapters


class KangarooAdapter(nn.Module):
    """``h -> h + Attn(Norm(h))`` on layer-``exit_layer`` states, with the model's own attention module type."""

    def __init__(self, model: EarlyExitModel, exit_layer: int) -> None:
        super().__init__()
        if not 1 <= exit_layer < model.num_layers:
            raise ExitbenchError(
                f"Kangaroo: exit_layer {exit_layer} must be in 1..{model.num_layers - 1} (the model has "
                f"{model.num_layers} layers)"
            )
        self.exit_layer = exit_layer
        layer = model.layers[exit_layer]
        self.norm = copy.deepcopy(layer.input_layernorm)
        self.attn = copy.deepcopy(layer.self_attn)
        for param in self.parameters():
            param.requires_grad_(True)

    def new_cache(self, model: EarlyExitModel, max_len: int) -> KVCache:
        """The adapter's own K/V cache (one layer)."""
        s = model.shape
        return KVCache(1, s.num_kv_heads, s.head_dim, max_len, model.dtype, model.device)

    def forward(
        self,
        hidden: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        start: int = 0,
        cache: KVCache | None = None,
    ) -> torch.Tensor:
        """Hidden ``[B, S, H]`` at positions ``start..start+S-1`` -> the draft's hidden state (read by the exit head).

        With a cache its K/V are written at ``start`` and attention covers the cached prefix; without one
        (training), attention is causal over the S positions."""
        attn = self.attn
        bsz, seq, _ = hidden.shape
        x = self.norm(hidden)
        q = attn.q_proj(x).view(bsz, seq, -1, attn.head_dim)
        k = attn.k_proj(x).view(bsz, seq, -1, attn.head_dim)
        v = attn.v_proj(x).view(bsz, seq, -1, attn.head_dim).transpose(1, 2)
        if hasattr(attn, "q_norm"):
            q, k = attn.q_norm(q), attn.k_norm(k)
        q = apply_rope(q.transpose(1, 2), *rope)
        k = apply_rope(k.transpose(1, 2), *rope)
        if cache is not None:
            k, v = cache.write(0, k, v, start)
            mask = causal_mask(seq, start, hidden.device)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=attn.scaling, enable_gqa=True)
        else:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=seq > 1, scale=attn.scaling, enable_gqa=True)
        return hidden + attn.o_proj(out.transpose(1, 2).reshape(bsz, seq, -1))


def save_adapter(adapter: KangarooAdapter, path: Path, info: dict[str, Any]) -> None:
    """The adapter's weights, exit layer and ``info`` (what it was trained on), written whole or not at all."""
    payload = {"format": ADAPTER_FORMAT, "exit_layer": adapter.exit_layer, "state_dict": adapter.state_dict()}
    save_module(path, {**payload, "info": info})


def load_adapter(model: EarlyExitModel, path: str | Path) -> KangarooAdapter:
    """The adapter saved at ``path`` for ``model`` (on its device and dtype); one clear error when it does not fit."""
    path = Path(path)
    payload = read_module(path, ADAPTER_FORMAT, "Kangaroo adapter", "train_adapters", "adapters")
    adapter = KangarooAdapter(model, int(payload["exit_layer"]))
    load_state(adapter, payload["state_dict"], path, "train_adapters")
    return adapter.to(device=model.device, dtype=model.dtype).eval()
