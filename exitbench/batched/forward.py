"""The batched forward: every decoder layer over ``[B, S]`` tokens, row ``b`` at its own positions.

It runs the checkpoint's own submodules through the same projection, RoPE and MLP functions as the
batch-1 view (:mod:`exitbench.models.view`); only the cache (:class:`BatchKVCache`) and the mask differ:
per-row positions instead of one shared start, so rows of different lengths, and rows that accepted
different numbers of drafts, decode in one call. Shapes: hidden ``[B, S, H]``, positions ``[B, S]``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from exitbench.batched.cache import BatchKVCache
from exitbench.models.view import EarlyExitModel, apply_rope, linear

Rope = tuple[torch.Tensor, torch.Tensor]


def position_mask(positions: torch.Tensor, length: int) -> torch.Tensor:
    """Boolean ``[B, 1, S, T]``: query ``(b, s)`` at ``positions[b, s]`` sees keys ``0..positions[b, s]`` of row b."""
    keys = torch.arange(length, device=positions.device)
    return keys.view(1, 1, 1, length) <= positions.unsqueeze(1).unsqueeze(-1)


def new_batch_cache(model: EarlyExitModel, batch_size: int, capacity: int) -> BatchKVCache:
    s = model.shape
    return BatchKVCache(s.num_layers, batch_size, s.num_kv_heads, s.head_dim, capacity, model.dtype, model.device)


def rope_at(model: EarlyExitModel, hidden: torch.Tensor, positions: torch.Tensor) -> Rope:
    """cos, sin ``[B, S, D]`` at each row's own positions."""
    return model.rotary_emb(hidden, positions)


def _kv(model: EarlyExitModel, index: int, x: torch.Tensor, rope: Rope) -> tuple[torch.Tensor, torch.Tensor]:
    """Layer ``index``'s keys (RoPE applied) and values ``[B, H_kv, S, D]`` from its normed input ``x``."""
    attn = model.layers[index].self_attn
    bsz, seq, _ = x.shape
    k = linear(attn.k_proj, x, model.skinny_rows).view(bsz, seq, -1, attn.head_dim)
    v = linear(attn.v_proj, x, model.skinny_rows).view(bsz, seq, -1, attn.head_dim).transpose(1, 2)
    if hasattr(attn, "k_norm"):
        k = attn.k_norm(k)
    return apply_rope(k.transpose(1, 2), *rope), v


def layer_forward(
    model: EarlyExitModel, index: int, hidden: torch.Tensor, rope: Rope, positions: torch.Tensor,
    cache: BatchKVCache,
) -> torch.Tensor:
    """One decoder layer over ``hidden [B, S, H]``; its K/V are cached at ``positions`` first."""
    layer = model.layers[index]
    attn = layer.self_attn
    bsz, seq, _ = hidden.shape
    x = layer.input_layernorm(hidden)
    q = linear(attn.q_proj, x, model.skinny_rows).view(bsz, seq, -1, attn.head_dim)
    if hasattr(attn, "q_norm"):
        q = attn.q_norm(q)
    q = apply_rope(q.transpose(1, 2), *rope)
    k, v = cache.write(index, *_kv(model, index, x, rope), positions)
    mask = position_mask(positions, k.shape[2])
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=attn.scaling, enable_gqa=True)
    hidden = hidden + linear(attn.o_proj, out.transpose(1, 2).reshape(bsz, seq, -1), model.skinny_rows)
    return model.mlp_block(index, hidden)


def write_kv_only(
    model: EarlyExitModel, index: int, hidden: torch.Tensor, rope: Rope, positions: torch.Tensor,
    cache: BatchKVCache,
) -> None:
    """Layer ``index``'s K/V from ``hidden`` (CALM §3.3.1 state propagation), without attention or MLP."""
    x = model.layers[index].input_layernorm(hidden)
    cache.write(index, *_kv(model, index, x, rope), positions)


def forward_layers(
    model: EarlyExitModel, hidden: torch.Tensor, first: int, last: int, positions: torch.Tensor,
    cache: BatchKVCache,
) -> torch.Tensor:
    """Layers ``first..last-1`` over ``hidden [B, S, H]`` at ``positions [B, S]``."""
    rope = rope_at(model, hidden, positions)
    for index in range(first, last):
        hidden = layer_forward(model, index, hidden, rope, positions, cache)
    return hidden


def pad_prompts(
    model: EarlyExitModel, prompts: Sequence[Sequence[int]], pad_id: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids ``[B, S_max]`` and the prompt lengths ``[B]``; padding sits after each prompt, where
    the position mask keeps every real token from seeing it and decoding overwrites it."""
    longest = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), longest), pad_id, dtype=torch.long, device=model.device)
    for row, prompt in enumerate(prompts):
        ids[row, : len(prompt)] = torch.tensor(list(prompt), dtype=torch.long, device=model.device)
    lengths = torch.tensor([len(p) for p in prompts], dtype=torch.long, device=model.device)
    return ids, lengths


def prefill(
    model: EarlyExitModel, cache: BatchKVCache, prompts: Sequence[Sequence[int]], last_layer: int | None = None
) -> torch.Tensor:
    """Every prompt through layers ``0..last_layer-1`` (all by default) in one call; each row's greedy
    next token ``[B]`` (from its own last prompt position)."""
    ids, lengths = pad_prompts(model, prompts)
    positions = torch.arange(ids.shape[1], device=model.device).unsqueeze(0).expand_as(ids)
    last = model.num_layers if last_layer is None else last_layer
    hidden = forward_layers(model, model.embed(ids), 0, last, positions, cache)
    final = hidden[torch.arange(len(prompts), device=model.device), lengths - 1].unsqueeze(1)  # [B, 1, H]
    return model.logits(final)[:, -1].argmax(-1)
