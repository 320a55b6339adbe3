"""Summed cross-entropy through the LM head, fused: the [N, V] logits never exist as a whole.

With a 49k vocabulary, an early exit's cost in training is mostly element-wise work on its logits, not the
head matmul: the float copy, log-softmax forward and backward, the zero-filled NLL gradient and the copy
back (measured on SmolLM2-135M, 2 cores, bf16 autocast: ~0.7 s per exit per 16-row micro-batch, of which
the matmuls are a small part). :func:`head_cross_entropy_sum` computes, chunk by chunk of rows,

    CE_sum = sum_n [logsumexp_v(z_nv) - z_{n,y_n}],  z = h W^T,

and in the same pass the gradient dCE_sum/dz = softmax(z) - onehot(y), from which dh = (dCE/dz) W and
dW = (dCE/dz)^T h; backward only scales them by the incoming gradient. Same maths as
``F.cross_entropy(F.linear(h, W).float(), y, reduction="sum")``; the logits are rounded to the compute
dtype first, as ``F.linear`` under autocast does, so results agree to float rounding.
"""

from __future__ import annotations

import torch
from torch import nn

_CHUNK_ROWS = 256


def _compute_dtype(device: torch.device, dtype: torch.dtype) -> torch.dtype:
    """The dtype ``F.linear`` would compute in here: the autocast dtype when autocast is on."""
    if torch.is_autocast_enabled(device.type):
        return torch.get_autocast_dtype(device.type)
    return dtype


class _HeadCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, chunk_rows: int):
        need_hidden, need_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        grad_hidden = torch.empty_like(hidden) if need_hidden else None
        grad_logit_chunks = []
        for start in range(0, hidden.shape[0], chunk_rows):
            rows = hidden[start : start + chunk_rows]
            targets = labels[start : start + chunk_rows]
            logits = (rows @ weight.t()).float()
            lse = torch.logsumexp(logits, dim=-1)
            total += (lse - logits.gather(1, targets.unsqueeze(1)).squeeze(1)).sum()
            if not (need_hidden or need_weight):
                continue
            probs = logits.sub_(lse.unsqueeze(1)).exp_()  # softmax, in place
            probs[torch.arange(len(targets), device=probs.device), targets] -= 1.0
            grad_logits = probs.to(hidden.dtype)
            if need_hidden:
                grad_hidden[start : start + chunk_rows] = grad_logits @ weight
            if need_weight:
                grad_logit_chunks.append(grad_logits)
        # dW is left to backward: one matmul over all rows, the incoming gradient folded into the small
        # [N, H] factor, so no [V, H]-sized pass is spent on accumulating or scaling it
        grad_logits_all = torch.cat(grad_logit_chunks) if need_weight else None
        ctx.save_for_backward(grad_hidden, grad_logits_all, hidden if need_weight else None)
        return total

    @staticmethod
    def backward(ctx, grad_total: torch.Tensor):
        grad_hidden, grad_logits, hidden = ctx.saved_tensors
        dh = (grad_hidden.float() * grad_total).to(grad_hidden.dtype) if grad_hidden is not None else None
        dw = grad_logits.t() @ (hidden.float() * grad_total).to(hidden.dtype) if grad_logits is not None else None
        return dh, dw, None, None


def head_cross_entropy_sum(
    hidden: torch.Tensor,
    head: nn.Linear,
    labels: torch.Tensor,
    chunk_rows: int = _CHUNK_ROWS,
    vocab: torch.Tensor | None = None,
) -> torch.Tensor:
    """sum_n CE(head(hidden_n), labels_n) for hidden [N, H], labels [N] (no ignored rows), as a float32 scalar.

    ``vocab`` (sorted ids [K]) restricts the softmax to those rows of the head, W[vocab]: ``labels`` then index
    into ``vocab`` (0..K-1). Differentiable in ``hidden`` and ``head.weight`` (only its ``vocab`` rows get a
    gradient); honours an enclosing autocast like ``F.linear``.
    """
    if vocab is None:
        return cross_entropy_sum(hidden, head.weight, labels, head.bias, chunk_rows)
    bias = None if head.bias is None else head.bias.index_select(0, vocab)
    return cross_entropy_sum(hidden, head.weight.index_select(0, vocab), labels, bias, chunk_rows)


def cross_entropy_sum(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    bias: torch.Tensor | None = None,
    chunk_rows: int = _CHUNK_ROWS,
) -> torch.Tensor:
    """sum_n CE(hidden_n W^T + b, labels_n), fused as above; with a bias, the unfused ``F.cross_entropy``."""
    if bias is not None:
        logits = nn.functional.linear(hidden, weight, bias)
        return nn.functional.cross_entropy(logits.float(), labels, reduction="sum")
    if hidden.shape[0] == 0:  # no position to score (e.g. no label in a sub-vocabulary): 0, still in the graph
        return hidden.float().sum()
    dtype = _compute_dtype(hidden.device, hidden.dtype)
    with torch.autocast(hidden.device.type, enabled=False):
        return _HeadCrossEntropy.apply(hidden.to(dtype), weight.to(dtype), labels, chunk_rows)
