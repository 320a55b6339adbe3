"""Layer dropout (LayerSkip §4.1.1): x_{l+1} = x_l + M(p_{l,t}) f_l(x_l), drawn per sample.

Implemented the compute-saving way: the samples dropped at layer l are removed from that layer's batch
(run the layer on the kept rows only, scatter them back), so a dropped sample costs nothing at that layer.
Nothing is dropped at evaluation time: callers pass an all-True mask.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

Rope = tuple[torch.Tensor, torch.Tensor]
LayerFn = Callable[[torch.Tensor, Rope], torch.Tensor]


def keep_mask(rates: Sequence[float], batch: int, generator: torch.Generator) -> torch.Tensor:
    """Bernoulli keep mask [L, batch]: sample b passes through layer l with probability 1 - p_l.

    ``generator`` is the (CPU) generator owned by the trainer; one draw of L x batch uniforms per call.
    """
    uniforms = torch.rand(len(rates), batch, generator=generator)
    probs = torch.tensor(list(rates), dtype=uniforms.dtype).unsqueeze(1)
    return uniforms >= probs


def forward_kept_rows(layer: LayerFn, hidden: torch.Tensor, rope: Rope, keep: torch.Tensor) -> torch.Tensor:
    """x_{l+1} = x_l + M f_l(x_l) with the layer run on the kept rows of hidden [B, S, H] only.

    ``layer`` maps (hidden, rope) to the layer's output (residual included), as
    :meth:`EarlyExitModel.layer_forward` does; ``keep`` [B] bool on any device.
    """
    if bool(keep.all()):
        return layer(hidden, rope)
    if not bool(keep.any()):
        return hidden
    rows = keep.nonzero().squeeze(1).to(hidden.device)
    cos, sin = rope
    kept = layer(hidden.index_select(0, rows), (cos.index_select(0, rows), sin.index_select(0, rows)))
    return hidden.index_copy(0, rows, kept.to(hidden.dtype))
