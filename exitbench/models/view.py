"""The early-exit view of a Llama-family decoder: embed, a forward over any layer range, the shared head.

It reuses the Hugging Face model's own submodules (projections, norms, MLPs, rotary embedding) and
replaces only attention's cache handling with :class:`~exitbench.models.cache.KVCache`, so that layers
can hold different lengths (draft vs verify) and cropping is free. Works for the Llama, Mistral and Qwen2
layouts (``model.model.layers``, ``model.model.norm``, ``model.lm_head``); Qwen3-style per-head q/k
norms are applied when present. Sliding-window attention is not modelled (full attention everywhere).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from exitbench.errors import ExitbenchError
from exitbench.models.cache import KVCache
from exitbench.timing import interleaved_medians

Rope = tuple[torch.Tensor, torch.Tensor]  # cos, sin [B, S, D]
Cache = KVCache | None  # None: no cache (training), attention causal over the positions given


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """Rotate the two halves of the last dimension: (x1, x2) -> (-x2, x1) (RoFormer, Su et al. 2021)."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding, x * cos + rotate_half(x) * sin. x: [B, H, S, D]; cos, sin: [B, S, D]."""
    return x * cos.unsqueeze(1) + rotate_half(x) * sin.unsqueeze(1)


SKINNY_ROWS = 4  # token rows up to which a CPU projection may use the transposed product


def project(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, skinny_rows: int = 0
) -> torch.Tensor:
    """``F.linear(x, weight, bias)``, computed as ``(weight @ x.T).T`` for at most ``skinny_rows`` token rows.

    Decoding multiplies 1 to d+1 rows by each weight matrix, and which form of that product is faster
    depends on the CPU and its BLAS: on an AMD EPYC (2 cores, MKL) ``W @ x.T`` ran 2-3x faster than
    ``F.linear`` for 576x3072 weights; on an Intel Xeon with AMX it ran 3-4x slower. So the choice is
    measured per machine (:func:`choose_skinny_rows`) and passed in; 0 = always ``F.linear``. A single row
    is padded to two for the transposed form. Same maths, other summation order: results agree to float
    rounding. Under autograd ``F.linear`` is always used.
    """
    rows = x.numel() // x.shape[-1]
    if rows > skinny_rows or torch.is_grad_enabled():
        return F.linear(x, weight, bias)
    flat = x.reshape(rows, x.shape[-1])
    if rows == 1:
        flat = torch.cat((flat, flat))
    out = (weight @ flat.t()).t()[:rows]
    if bias is not None:
        out = out + bias
    return out.reshape(*x.shape[:-1], weight.shape[0])


#: one projection choice per (weight shape, thread count) and process: every model a stage loads takes
#: the same path, so a noisy measurement cannot give two same-shaped models different kernels
_PROJECTION_CHOICES: dict[tuple[tuple[int, ...], int], tuple[int, dict[str, float]]] = {}


@torch.inference_mode()
def choose_skinny_rows(weight: torch.Tensor, repeats: int = 200, warmup: int = 20) -> tuple[int, dict[str, float]]:
    """(skinny_rows, timings): :data:`SKINNY_ROWS` if ``W @ x.T`` beats ``F.linear`` on 2 rows of ``weight``.

    Only float32 weights on the CPU are candidates (bfloat16 and GPUs take ``F.linear``). After ``warmup``
    calls of each form (a freshly loaded weight's pages are cold: whichever form runs first pays for them),
    the two forms alternate, first one then the other, for ``repeats`` calls each; the medians decide. The
    choice is made once per process for a weight shape and thread count and reused by every later model of
    that shape. The timings (microseconds) go into result provenance so a run says which path it took.
    """
    if weight.device.type != "cpu" or weight.dtype != torch.float32:
        return 0, {}
    key = (tuple(weight.shape), torch.get_num_threads())
    if key in _PROJECTION_CHOICES:
        return _PROJECTION_CHOICES[key]
    x = torch.ones(2, weight.shape[1], dtype=weight.dtype)  # no draw from the global RNG
    forms = {
        "transposed_us": lambda: project(x, weight, skinny_rows=SKINNY_ROWS),
        "linear_us": lambda: F.linear(x, weight),
    }
    medians = interleaved_medians(forms, repeats, warmup)
    timings = {name: round(seconds * 1e6, 1) for name, seconds in medians.items()}
    choice = (SKINNY_ROWS if medians["transposed_us"] < medians["linear_us"] else 0), timings
    _PROJECTION_CHOICES[key] = choice
    return choice


def linear(module: nn.Module, x: torch.Tensor, skinny_rows: int = 0) -> torch.Tensor:
    """An ``nn.Linear`` of the checkpoint through :func:`project` (any other module is called as is)."""
    if type(module) is nn.Linear:
        return project(x, module.weight, module.bias, skinny_rows)
    return module(x)


def mlp_forward(mlp: nn.Module, x: torch.Tensor, skinny_rows: int = 0) -> torch.Tensor:
    """The gated MLP down(act(gate(x)) * up(x)) of Llama/Mistral/Qwen2 through :func:`linear`."""
    if not all(hasattr(mlp, name) for name in ("gate_proj", "up_proj", "down_proj", "act_fn")):
        return mlp(x)
    gate = linear(mlp.gate_proj, x, skinny_rows)
    return linear(mlp.down_proj, mlp.act_fn(gate) * linear(mlp.up_proj, x, skinny_rows), skinny_rows)


def causal_mask(query_len: int, start: int, device: torch.device) -> torch.Tensor | None:
    """Boolean mask [S, start+S]: query i (at position start+i) sees keys 0..start+i. None when S == 1."""
    if query_len == 1:
        return None
    rows = torch.arange(query_len, device=device).unsqueeze(1) + start
    cols = torch.arange(start + query_len, device=device).unsqueeze(0)
    return cols <= rows


@dataclass(frozen=True)
class ModelShape:
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int


class EarlyExitModel:
    """Wraps a ``*ForCausalLM`` so any contiguous range of layers can run over a shared KV cache."""

    def __init__(self, causal_lm: nn.Module) -> None:
        inner = getattr(causal_lm, "model", None)
        missing = [
            name
            for name, ok in (
                ("model.layers", hasattr(inner, "layers")),
                ("model.norm", hasattr(inner, "norm")),
                ("model.embed_tokens", hasattr(inner, "embed_tokens")),
                ("model.rotary_emb", hasattr(inner, "rotary_emb")),
                ("lm_head", hasattr(causal_lm, "lm_head")),
            )
            if not ok
        ]
        if missing:
            kind = type(causal_lm).__name__
            raise ExitbenchError(
                f"{kind} is not a Llama-family decoder (missing {', '.join(missing)}); "
                "use a Llama, Mistral or Qwen2-style checkpoint"
            )
        self.hf = causal_lm
        self.embed_tokens = inner.embed_tokens
        self.layers = inner.layers
        self.norm = inner.norm
        self.rotary_emb = inner.rotary_emb
        self.lm_head = causal_lm.lm_head
        attn = self.layers[0].self_attn
        cfg = causal_lm.config
        self.shape = ModelShape(
            num_layers=len(self.layers),
            hidden_size=cfg.hidden_size,
            num_heads=cfg.num_attention_heads,
            num_kv_heads=cfg.num_key_value_heads,
            head_dim=attn.head_dim,
            vocab_size=cfg.vocab_size,
        )
        gate = getattr(self.layers[0].mlp, "gate_proj", None)
        weight = gate.weight if type(gate) is nn.Linear else None
        #: token rows up to which projections take the transposed product; measured on this machine
        self.skinny_rows, timings = choose_skinny_rows(weight) if weight is not None else (0, {})
        #: what the choice was based on, for result provenance
        self.projection = {"skinny_rows": self.skinny_rows, **timings}

    @property
    def num_layers(self) -> int:
        return self.shape.num_layers

    @property
    def num_parameters(self) -> int:
        """Parameters of the wrapped model (tied embeddings counted once), for result provenance."""
        return sum(param.numel() for param in self.hf.parameters())

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    def new_cache(self, max_len: int) -> KVCache:
        s = self.shape
        return KVCache(s.num_layers, s.num_kv_heads, s.head_dim, max_len, self.dtype, self.device)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Token ids [B, S] -> hidden states [B, S, H]."""
        return self.embed_tokens(ids)

    def rope(self, hidden: torch.Tensor, start: int) -> Rope:
        """cos, sin [B, S, D] for positions start..start+S-1."""
        positions = torch.arange(start, start + hidden.shape[1], device=hidden.device).unsqueeze(0)
        return self.rotary_emb(hidden, positions.expand(hidden.shape[0], -1))

    def layer_forward(
        self, index: int, hidden: torch.Tensor, rope: Rope, start: int = 0, cache: Cache = None
    ) -> torch.Tensor:
        """One decoder layer over hidden [B, S, H] at positions start..start+S-1: its attention sub-layer, then
        its MLP sub-layer, each a residual step (:meth:`attention_block`, :meth:`mlp_block`)."""
        return self.mlp_block(index, self.attention_block(index, hidden, rope, start, cache))

    def attention_block(
        self, index: int, hidden: torch.Tensor, rope: Rope, start: int = 0, cache: Cache = None
    ) -> torch.Tensor:
        """Layer ``index``'s attention sub-layer as a residual step: ``h + Attn(Norm(h))``.

        With a cache, the layer's K/V are written at ``start`` and attention covers the cached prefix;
        without one (training), attention is causal over the S positions only.
        """
        layer = self.layers[index]
        attn = layer.self_attn
        bsz, seq, _ = hidden.shape
        x = layer.input_layernorm(hidden)
        q = linear(attn.q_proj, x, self.skinny_rows).view(bsz, seq, -1, attn.head_dim)
        k = linear(attn.k_proj, x, self.skinny_rows).view(bsz, seq, -1, attn.head_dim)
        v = linear(attn.v_proj, x, self.skinny_rows).view(bsz, seq, -1, attn.head_dim).transpose(1, 2)
        if hasattr(attn, "q_norm"):
            q, k = attn.q_norm(q), attn.k_norm(k)
        cos, sin = rope
        q = apply_rope(q.transpose(1, 2), cos, sin)  # [B, H, S, D]
        k = apply_rope(k.transpose(1, 2), cos, sin)  # [B, H_kv, S, D]
        if cache is not None:
            k, v = cache.write(index, k, v, start)
            mask = causal_mask(seq, start, hidden.device)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=attn.scaling, enable_gqa=True)
        else:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=seq > 1, scale=attn.scaling, enable_gqa=True)
        return hidden + linear(attn.o_proj, out.transpose(1, 2).reshape(bsz, seq, -1), self.skinny_rows)

    def mlp_block(self, index: int, hidden: torch.Tensor) -> torch.Tensor:
        """Layer ``index``'s MLP sub-layer as a residual step: ``h + MLP(Norm(h))`` (position-wise, no cache)."""
        layer = self.layers[index]
        return hidden + mlp_forward(layer.mlp, layer.post_attention_layernorm(hidden), self.skinny_rows)

    def write_kv_only(self, index: int, hidden: torch.Tensor, rope: Rope, start: int, cache: KVCache) -> None:
        """Compute layer ``index``'s K/V from ``hidden`` and cache them, without running attention or MLP.

        This is state propagation for a skipped layer (CALM §3.3.1): the exit state, copied up, gives the
        skipped layer's keys and values through that layer's own projections.
        """
        layer = self.layers[index]
        attn = layer.self_attn
        bsz, seq, _ = hidden.shape
        x = layer.input_layernorm(hidden)
        k = linear(attn.k_proj, x, self.skinny_rows).view(bsz, seq, -1, attn.head_dim)
        v = linear(attn.v_proj, x, self.skinny_rows).view(bsz, seq, -1, attn.head_dim).transpose(1, 2)
        if hasattr(attn, "k_norm"):
            k = attn.k_norm(k)
        k = apply_rope(k.transpose(1, 2), *rope)
        cache.write(index, k, v, start)

    def forward_layers(
        self,
        hidden: torch.Tensor,
        first: int,
        last: int,
        start: int = 0,
        cache: KVCache | None = None,
        rope: Rope | None = None,
    ) -> torch.Tensor:
        """Layers ``first..last-1`` over hidden [B, S, H] at positions ``start..start+S-1``."""
        if rope is None:
            rope = self.rope(hidden, start)
        for index in range(first, last):
            hidden = self.layer_forward(index, hidden, rope, start, cache)
        return hidden

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The shared exit head g: final norm + LM head. hidden [B, S, H] -> logits [B, S, V]."""
        return linear(self.lm_head, self.norm(hidden), self.skinny_rows)

    def logits_subset(self, hidden: torch.Tensor, head_weight: torch.Tensor) -> torch.Tensor:
        """The exit head restricted to a sub-vocabulary: ``head_weight`` is ``lm_head.weight[ids]``."""
        return project(self.norm(hidden), head_weight, skinny_rows=self.skinny_rows)
