"""Exits scored over a sub-vocabulary (``exit_vocab_size``): the loss, the objective and the trainer."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from exitbench import config
from exitbench.errors import ExitbenchError
from exitbench.training import trainer
from exitbench.training.corpora import Example, collate
from exitbench.training.early_exit_loss import EarlyExitObjective, layerskip_scales, normalized_weights
from exitbench.training.fused_head_loss import head_cross_entropy_sum

VOCAB = 128  # the tiny model's


def _rows(rows: int = 23, hidden: int = 16, vocab: int = 40):
    generator = torch.Generator().manual_seed(5)
    head = nn.Linear(hidden, vocab, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.randn(vocab, hidden, generator=generator))
    x = torch.randn(rows, hidden, generator=generator, requires_grad=True)
    return head, x, generator


@pytest.mark.parametrize("chunk_rows", [4, 256])
def test_sub_vocabulary_loss_is_cross_entropy_over_the_selected_rows(chunk_rows):
    head, x, generator = _rows()
    subset = torch.tensor([1, 4, 9, 10, 22, 39])
    labels = torch.randint(0, len(subset), (x.shape[0],), generator=generator)  # positions in the subset
    fused = head_cross_entropy_sum(x, head, labels, chunk_rows=chunk_rows, vocab=subset)
    fused.backward()
    grads = x.grad.clone(), head.weight.grad.clone()
    x.grad, head.weight.grad = None, None
    reference = F.cross_entropy(x @ head.weight[subset].t(), labels, reduction="sum")
    reference.backward()
    torch.testing.assert_close(fused, reference, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(grads[0], x.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(grads[1], head.weight.grad, rtol=1e-4, atol=1e-5)
    outside = torch.ones(head.weight.shape[0], dtype=torch.bool)
    outside[subset] = False
    assert torch.count_nonzero(grads[1][outside]) == 0 and torch.count_nonzero(grads[1][subset]) > 0


def test_no_position_to_score_is_zero_and_still_differentiable():
    head, x, _ = _rows()
    value = head_cross_entropy_sum(x[:0], head, torch.zeros(0, dtype=torch.long), vocab=torch.tensor([1, 2]))
    value.backward()
    assert value.item() == 0.0 and x.grad is not None and torch.count_nonzero(x.grad) == 0


def _batch():
    generator = torch.Generator().manual_seed(3)
    ids = torch.randint(3, VOCAB, (3, 9), generator=generator)
    labels = torch.randint(3, 40, (3, 9), generator=generator)  # ids 3..39: half of them inside SUBSET
    labels[0, :4] = -100
    labels[2, 6:] = -100
    return ids, labels, int((labels != -100).sum())


SUBSET = list(range(2, 40, 2))  # even ids 2..38


def test_exits_are_scored_over_the_set_and_the_last_layer_over_everything(tiny_lm, tiny_model):
    ids, labels, num_tokens = _batch()
    weights = normalized_weights(layerskip_scales(4, 1.0), [0, 1, 2, 3])
    objective = EarlyExitObjective(tiny_lm)
    objective.set_exit_vocab(SUBSET)
    keep = torch.ones(4, 3, dtype=torch.bool)
    position = {token: i for i, token in enumerate(SUBSET)}
    with torch.no_grad():
        loss, sums = objective(ids, labels, keep, weights, num_tokens)
        hidden = tiny_model.embed(ids)
        expected_sums, expected_loss = [], torch.zeros(())
        for layer in range(4):
            hidden = tiny_model.forward_layers(hidden, layer, layer + 1)
            logits = tiny_model.logits(hidden).reshape(-1, VOCAB)
            flat = labels.reshape(-1)
            if layer == 3:
                ce = F.cross_entropy(logits, flat, ignore_index=-100, reduction="sum")
            else:
                rows = torch.tensor([int(y) in position for y in flat])
                sub_labels = torch.tensor([position[int(y)] for y in flat[rows]])
                ce = F.cross_entropy(logits[rows][:, SUBSET], sub_labels, reduction="sum")
            if layer in weights:
                expected_sums.append(ce)
                expected_loss += weights[layer] * ce / num_tokens
    torch.testing.assert_close(sums, torch.stack(expected_sums), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(loss, expected_loss, rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        _, full = objective(ids, labels, keep, weights, num_tokens, full_vocab=True)
        objective.set_exit_vocab(None)
        _, plain = objective(ids, labels, keep, weights, num_tokens)
    torch.testing.assert_close(full, plain)
    assert torch.equal(full[-1], plain[-1]) and not torch.allclose(full[:-1], sums[:-1])


def test_an_exit_vocabulary_outside_the_head_is_one_clear_error(tiny_lm):
    objective = EarlyExitObjective(tiny_lm)
    with pytest.raises(ExitbenchError, match=r"token ids must lie in 0\.\.127, got 5\.\.128"):
        objective.set_exit_vocab([5, 128])
    assert objective.exit_vocab is None


def test_exit_vocabulary_ranks_target_tokens_and_keeps_the_stop_token():
    examples = [Example((7, 5, 5, 6, 2), prompt_len=2), Example((9, 6, 6, 2), prompt_len=0)]
    _, labels = collate(examples, pad_id=0)
    assert sorted(trainer.target_tokens(examples[0])) == sorted(int(y) for y in labels[0] if y != -100)
    # targets: (5, 6, 2) and (6, 6, 2): 6 x3, 2 x2, 5 x1
    assert trainer.exit_vocabulary(examples, 1) == [6]
    assert trainer.exit_vocabulary(examples, 2) == [2, 6]
    assert trainer.exit_vocabulary(examples, 1, always=[2, None]) == [2, 6]
    assert trainer.exit_vocab_coverage(examples, [6]) == pytest.approx(3 / 6)


def test_a_control_may_differ_in_exit_vocab_size():
    cfg = config.Config(
        profile="cpu",
        train=config.TrainConfig(
            variants={
                "layerskip": config.TrainVariant(exit_vocab_size=2048),
                "plain": config.TrainVariant(recipe="plain", p_max=0.0, control_of="layerskip"),
            }
        ),
    )
    config.check_controls(cfg, "params.yaml")


@pytest.mark.parametrize("subset", [None, SUBSET])
def test_self_distilled_exits_learn_the_last_layers_top1(tiny_lm, tiny_model, subset):
    """exit_targets = last_layer: each exit but the last is scored against the last layer's argmax token at
    every labelled position (within the set, if one is given); the last layer still learns the labels."""
    ids, labels, num_tokens = _batch()
    weights = normalized_weights(layerskip_scales(4, 1.0), [0, 1, 2, 3])
    objective = EarlyExitObjective(tiny_lm)
    objective.set_exit_vocab(subset)
    objective.exit_targets = "last_layer"
    keep = torch.ones(4, 3, dtype=torch.bool)
    flat = labels.reshape(-1)
    labelled = flat != -100
    with torch.no_grad():
        loss, sums = objective(ids, labels, keep, weights, num_tokens)
        states, hidden = [], tiny_model.embed(ids)
        for layer in range(4):
            hidden = tiny_model.forward_layers(hidden, layer, layer + 1)
            states.append(tiny_model.logits(hidden).reshape(-1, VOCAB)[labelled])
        teacher = states[-1].argmax(dim=-1)
        expected = []
        for layer, logits in enumerate(states):
            if layer == 3:
                expected.append(F.cross_entropy(logits, flat[labelled], reduction="sum"))
            elif subset is None:
                expected.append(F.cross_entropy(logits, teacher, reduction="sum"))
            else:
                position = {token: i for i, token in enumerate(subset)}
                rows = torch.tensor([int(t) in position for t in teacher])
                targets = torch.tensor([position[int(t)] for t in teacher[rows]], dtype=torch.long)
                expected.append(F.cross_entropy(logits[rows][:, subset], targets, reduction="sum"))
    expected = torch.stack([expected[layer] for layer in sorted(weights)])  # layer 0's scale is 0
    torch.testing.assert_close(sums, expected, rtol=1e-4, atol=1e-4)
    scale = torch.tensor([weights[layer] for layer in sorted(weights)])
    torch.testing.assert_close(loss, (scale * expected).sum() / num_tokens, rtol=1e-5, atol=1e-5)
    objective.exit_targets = "labels"
    with torch.no_grad():
        _, from_labels = objective(ids, labels, keep, weights, num_tokens)
    assert torch.equal(from_labels[-1], sums[-1]) and not torch.allclose(from_labels[:-1], sums[:-1])


def test_self_distillation_runs_the_last_layer_even_when_only_early_exits_carry_a_loss(tiny_lm):
    ids, labels, num_tokens = _batch()
    objective = EarlyExitObjective(tiny_lm)
    objective.exit_targets = "last_layer"
    keep = torch.ones(4, 3, dtype=torch.bool)
    calls = []
    forwards = objective.layer_forwards
    objective.layer_forwards = [lambda h, r, f=f, i=i: (calls.append(i), f(h, r))[1] for i, f in enumerate(forwards)]
    loss, sums = objective(ids, labels, keep, {1: 1.0}, num_tokens)
    loss.backward()
    assert calls == [0, 1, 2, 3] and sums.shape == (1,) and torch.isfinite(loss)


def test_a_control_may_differ_in_exit_targets():
    cfg = config.Config(
        profile="cpu",
        train=config.TrainConfig(
            variants={
                "layerskip": config.TrainVariant(exit_targets="last_layer"),
                "plain": config.TrainVariant(recipe="plain", p_max=0.0, control_of="layerskip"),
            }
        ),
    )
    config.check_controls(cfg, "params.yaml")
