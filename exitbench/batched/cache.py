"""A key/value cache for a batch of sequences that advance by different numbers of tokens.

Row ``b``'s position ``p`` of layer ``l`` lives at ``[l, b, :, p]``, whatever the other rows hold. There
are no per-row lengths: a query at position ``p`` attends to its row's keys ``0..p`` (the mask of
:func:`exitbench.batched.forward.position_mask`), and every decoding step writes a position before any
query at or after it reads it. So what lies beyond a row's committed text (a shorter prompt's padding,
drafts a verification rejected) is never read before it is overwritten, and rows need no cropping.
"""

from __future__ import annotations

import torch


class BatchKVCache:
    """Keys and values ``[L, B, H_kv, T, D]``, written at per-row positions, grown by doubling."""

    def __init__(
        self, num_layers: int, batch_size: int, num_kv_heads: int, head_dim: int, capacity: int,
        dtype: torch.dtype, device: torch.device | str = "cpu",
    ) -> None:
        shape = (num_layers, batch_size, num_kv_heads, max(capacity, 1), head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)

    @property
    def batch_size(self) -> int:
        return self.keys.shape[1]

    @property
    def capacity(self) -> int:
        return self.keys.shape[3]

    def _grow(self, needed: int) -> None:
        shape = (*self.keys.shape[:3], max(needed, 2 * self.capacity) - self.capacity, self.keys.shape[4])
        self.keys = torch.cat([self.keys, self.keys.new_zeros(shape)], dim=3)
        self.values = torch.cat([self.values, self.values.new_zeros(shape)], dim=3)

    def write(
        self, layer: int, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store ``keys``/``values`` ``[B, H_kv, S, D]`` of row ``b`` at ``positions[b]`` (``[B, S]``).

        Returns the layer's keys and values ``[B, H_kv, T, D]`` up to the furthest position written
        (``T = positions.max() + 1``), for attention under :func:`~exitbench.batched.forward.position_mask`.
        """
        end = int(positions.max()) + 1
        if end > self.capacity:
            self._grow(end)
        rows = torch.arange(keys.shape[0], device=keys.device).unsqueeze(1).expand_as(positions)
        # advanced indices in dims 0 and 2 -> the indexed view is [B, S, H_kv, D]
        self.keys[layer][rows, :, positions] = keys.transpose(1, 2)
        self.values[layer][rows, :, positions] = values.transpose(1, 2)
        return self.keys[layer, :, :, :end], self.values[layer, :, :, :end]

    def keep(self, rows: torch.Tensor | list[int]) -> None:
        """Keep only ``rows`` (indices into the current batch), in that order: finished rows leave the batch."""
        index = torch.as_tensor(rows, dtype=torch.long, device=self.keys.device)
        self.keys = self.keys.index_select(1, index)
        self.values = self.values.index_select(1, index)
