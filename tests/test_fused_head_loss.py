"""The fused head + cross-entropy equals F.cross_entropy(F.linear(...)) in value and gradients."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from exitbench.training.fused_head_loss import head_cross_entropy_sum


def _case(rows: int = 37, hidden: int = 16, vocab: int = 50):
    generator = torch.Generator().manual_seed(11)
    head = nn.Linear(hidden, vocab, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.randn(vocab, hidden, generator=generator))
    x = torch.randn(rows, hidden, generator=generator, requires_grad=True)
    labels = torch.randint(0, vocab, (rows,), generator=generator)
    return head, x, labels


@pytest.mark.parametrize("chunk_rows", [1, 8, 256])
def test_value_and_gradients_equal_the_unfused_loss(chunk_rows):
    head, x, labels = _case()
    fused = head_cross_entropy_sum(x, head, labels, chunk_rows=chunk_rows)
    (2.5 * fused).backward()
    grads = x.grad.clone(), head.weight.grad.clone()
    x.grad, head.weight.grad = None, None
    reference = F.cross_entropy(head(x), labels, reduction="sum")
    (2.5 * reference).backward()
    torch.testing.assert_close(fused, reference, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(grads[0], x.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(grads[1], head.weight.grad, rtol=1e-4, atol=1e-5)


def test_frozen_head_gets_no_gradient_and_no_grad_mode_works():
    head, x, labels = _case()
    head.weight.requires_grad_(False)
    head_cross_entropy_sum(x, head, labels, chunk_rows=5).backward()
    assert head.weight.grad is None and x.grad is not None
    with torch.no_grad():
        value = head_cross_entropy_sum(x, head, labels)
    torch.testing.assert_close(value, F.cross_entropy(head(x), labels, reduction="sum"), rtol=1e-5, atol=1e-4)


def test_under_bf16_autocast_it_matches_autocast_linear():
    head, x, labels = _case(rows=20)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fused = head_cross_entropy_sum(x, head, labels, chunk_rows=7)
        fused.backward()
        grad = x.grad.clone()
        x.grad = None
        reference = F.cross_entropy(head(x).float(), labels, reduction="sum")
        reference.backward()
    assert fused.dtype == torch.float32
    torch.testing.assert_close(fused, reference, rtol=1e-3, atol=1e-2)
    torch.testing.assert_close(grad, x.grad, rtol=2e-2, atol=2e-2)


def test_a_head_with_bias_falls_back_to_the_unfused_loss():
    _, x, labels = _case()
    head = nn.Linear(16, 50, bias=True)
    torch.testing.assert_close(
        head_cross_entropy_sum(x, head, labels), F.cross_entropy(head(x), labels, reduction="sum")
    )
