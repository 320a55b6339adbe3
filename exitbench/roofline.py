"""How far a decoding time is from what the machine allows: memory bandwidth, bytes read, % of roofline.

Decoding one token at batch 1 multiplies one row by every weight matrix it uses, so its time is bounded below
by the bytes it must read (the weights of the layers it runs, the head, the KV cache it attends over) divided
by the memory bandwidth (the roofline model, Williams, Waterman and Patterson, CACM 2009: at this arithmetic
intensity, well under one flop per byte, the memory roof is the bound). The bench stage measures the bandwidth
with STREAM's triad (McCalpin 1995: ``a = b + s * c``, 3 arrays of bytes moved per element, counted as STREAM
counts them) in torch, with the threads and dtype of the run, and counts each generation's bytes with
:class:`ReadCounter`; a row's roofline fraction is the time those bytes need at that bandwidth over the time
it took (1.0 = at the limit).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MethodType
from typing import Any

import torch

from exitbench.models.cache import KVCache
from exitbench.models.view import EarlyExitModel
from exitbench.timing import median_seconds

Rope = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class Bandwidth:
    """A measured memory bandwidth: STREAM triad over ``mib`` MiB per array."""

    gb_per_s: float
    dtype: str
    mib: int
    threads: int
    device: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "gb_per_s": self.gb_per_s,
            "dtype": self.dtype,
            "mib_per_array": self.mib,
            "threads": self.threads,
            "device": self.device,
            "kernel": "triad a = b + 2 c (torch.add out=)",
        }


def triad_bytes(elements: int, element_size: int) -> int:
    """Bytes STREAM counts for one triad over ``elements``: read b and c, write a (McCalpin 1995)."""
    return 3 * elements * element_size


@torch.inference_mode()
def measure_bandwidth(
    dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu", mib: int = 256, iters: int = 9
) -> Bandwidth:
    """STREAM triad bandwidth in GB/s (1e9 bytes): median of ``iters`` triads over arrays of ``mib`` MiB each,
    far past any cache, in ``dtype`` on ``device`` with torch's current threads."""
    device = torch.device(device)
    elements = mib * 2**20 // torch.tensor([], dtype=dtype).element_size()
    b = torch.ones(elements, dtype=dtype, device=device)
    c = torch.full((elements,), 0.5, dtype=dtype, device=device)
    a = torch.empty_like(b)
    seconds = median_seconds(lambda: torch.add(b, c, alpha=2, out=a), iters, warmup=2, device=device)
    gb_per_s = triad_bytes(elements, a.element_size()) / seconds / 1e9
    return Bandwidth(round(gb_per_s, 2), str(dtype).removeprefix("torch."), mib, torch.get_num_threads(), str(device))


def _nbytes(tensors: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


class ReadCounter:
    """Counts the bytes a decoding method reads from memory through ``models`` (an :class:`EarlyExitModel` and
    any draft model), while active (``with ReadCounter(model) as counter``): each layer forward reads that
    layer's weights once whatever the number of rows (a kernel that reads each weight once, the bound) plus its
    KV cache up to the positions it attends to; each head call reads the head's rows; a K/V-only write reads the
    layer's K and V projections; an embedding reads one row per token. Methods that run outside exitbench's
    forward (transformers' generate) read nothing it can see: their count stays 0.

    The model's own methods are wrapped on the instance and restored on exit; the wrapper costs one Python call
    per layer (well under 0.1% of a step of the embedded model).
    """

    def __init__(self, *models: EarlyExitModel | None) -> None:
        self.models = list(dict.fromkeys(m for m in models if m is not None))
        self.bytes = 0

    def __enter__(self) -> ReadCounter:
        for model in self.models:
            self._install(model)
        return self

    def __exit__(self, *exc: object) -> None:
        for model in self.models:
            for name in ("embed", "layer_forward", "write_kv_only", "logits", "logits_subset"):
                model.__dict__.pop(name, None)

    def _install(self, model: EarlyExitModel) -> None:
        layer_bytes = [_nbytes(layer.parameters()) for layer in model.layers]
        kv_bytes = [
            _nbytes((layer.input_layernorm.weight, layer.self_attn.k_proj.weight, layer.self_attn.v_proj.weight))
            for layer in model.layers
        ]
        shape = model.shape
        element = torch.tensor([], dtype=model.dtype).element_size()
        kv_per_position = 2 * shape.num_kv_heads * shape.head_dim * element  # one layer's K and V of one position
        norm_bytes = _nbytes(model.norm.parameters())
        head_bytes = _nbytes(model.lm_head.parameters()) + norm_bytes
        row_bytes = shape.hidden_size * element
        counter = self
        cls = type(model)

        def embed(self: EarlyExitModel, ids: torch.Tensor) -> torch.Tensor:
            counter.bytes += ids.numel() * row_bytes
            return cls.embed(self, ids)

        def layer_forward(
            self: EarlyExitModel,
            index: int,
            hidden: torch.Tensor,
            rope: Rope,
            start: int = 0,
            cache: KVCache | None = None,
        ) -> torch.Tensor:
            attended = start + hidden.shape[1] if cache is not None else hidden.shape[1]
            counter.bytes += layer_bytes[index] + attended * kv_per_position
            return cls.layer_forward(self, index, hidden, rope, start, cache)

        def write_kv_only(
            self: EarlyExitModel, index: int, hidden: torch.Tensor, rope: Rope, start: int, cache: KVCache
        ) -> None:
            counter.bytes += kv_bytes[index]
            cls.write_kv_only(self, index, hidden, rope, start, cache)

        def logits(self: EarlyExitModel, hidden: torch.Tensor) -> torch.Tensor:
            counter.bytes += head_bytes
            return cls.logits(self, hidden)

        def logits_subset(self: EarlyExitModel, hidden: torch.Tensor, head_weight: torch.Tensor) -> torch.Tensor:
            counter.bytes += head_weight.numel() * head_weight.element_size() + norm_bytes
            return cls.logits_subset(self, hidden, head_weight)

        for fn in (embed, layer_forward, write_kv_only, logits, logits_subset):
            setattr(model, fn.__name__, MethodType(fn, model))


def roofline_fraction(bytes_read: float, seconds: float, bandwidth_gb_per_s: float) -> float | None:
    """Roofline time over measured time: ``(bytes / bandwidth) / seconds`` (1.0 = reading at the measured
    bandwidth the whole time); None when nothing was counted or timed."""
    if bytes_read <= 0 or seconds <= 0 or bandwidth_gb_per_s <= 0:
        return None
    return bytes_read / (bandwidth_gb_per_s * 1e9) / seconds
