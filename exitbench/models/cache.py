"""A preallocated key/value cache with one length per layer, written and cropped in place.

Early exit and self-speculation leave layers with different amounts of cached context (a draft writes
only layers 0..E-1), so each layer keeps its own length. Cropping is a length change, never a copy.
"""

from __future__ import annotations

import torch


class KVCache:
    """Keys and values for ``num_layers`` layers: tensors ``[L, B, H_kv, T_max, D]`` grown by doubling."""

    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        max_len: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
        batch_size: int = 1,
    ) -> None:
        shape = (num_layers, batch_size, num_kv_heads, max(max_len, 1), head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.lengths = [0] * num_layers

    def clone(self) -> KVCache:
        """A private copy: same capacity, tensors and per-layer lengths."""
        layers, batch, kv_heads, _, head_dim = self.keys.shape
        copy = KVCache(layers, kv_heads, head_dim, 1, self.keys.dtype, self.keys.device, batch)
        copy.keys, copy.values = self.keys.clone(), self.values.clone()
        copy.lengths = list(self.lengths)
        return copy

    @property
    def capacity(self) -> int:
        return self.keys.shape[3]

    def _grow(self, needed: int) -> None:
        new_cap = max(needed, 2 * self.capacity)
        pad = new_cap - self.capacity
        shape = (*self.keys.shape[:3], pad, self.keys.shape[4])
        self.keys = torch.cat([self.keys, self.keys.new_zeros(shape)], dim=3)
        self.values = torch.cat([self.values, self.values.new_zeros(shape)], dim=3)

    def write(
        self, layer: int, keys: torch.Tensor, values: torch.Tensor, start: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store ``keys``/``values`` ``[B, H_kv, S, D]`` at positions ``start..start+S`` of ``layer``.

        Returns views of the layer's cache up to the new end, for attention. Writing at ``start`` also
        truncates anything the layer held beyond it (the layer's length becomes ``start + S``).
        """
        if start > self.lengths[layer]:
            raise ValueError(f"layer {layer}: write at {start} leaves a hole (cached {self.lengths[layer]})")
        end = start + keys.shape[2]
        if end > self.capacity:
            self._grow(end)
        self.keys[layer, :, :, start:end] = keys
        self.values[layer, :, :, start:end] = values
        self.lengths[layer] = end
        return self.keys[layer, :, :, :end], self.values[layer, :, :, :end]

    def crop(self, length: int, layers: range | None = None) -> None:
        """Forget positions ``>= length`` in ``layers`` (all layers by default)."""
        for layer in layers if layers is not None else range(len(self.lengths)):
            self.lengths[layer] = min(self.lengths[layer], length)

    def layer_view(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The cached keys and values of ``layer``, ``[B, H_kv, len, D]``."""
        end = self.lengths[layer]
        return self.keys[layer, :, :, :end], self.values[layer, :, :, :end]
