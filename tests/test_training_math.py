"""The training recipe's math: schedules, curricula, loss weights, layer dropout, the objective."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from exitbench.errors import ExitbenchError
from exitbench.training.early_exit_loss import (
    EarlyExitObjective,
    calm_scales,
    exit_scales,
    layerskip_scales,
    normalized_weights,
)
from exitbench.training.layer_dropout import forward_kept_rows, keep_mask
from exitbench.training.schedules import (
    depth_scale,
    dropout_rates,
    enabled_exits,
    gradual_exits,
    lr_factor,
    rotational_exits,
    time_scale,
)

# --- layer-dropout schedules (LayerSkip §4.1.1) ---------------------------------------------------------


def test_depth_scale_end_points_and_monotone():
    layers = 30
    values = [depth_scale(layer, layers) for layer in range(layers)]
    assert values[0] == 0.0
    assert values[-1] == pytest.approx(1.0)
    assert all(a < b for a, b in itertools.pairwise(values))
    assert depth_scale(2, 5) == pytest.approx(math.exp(2 * math.log(2) / 4) - 1)
    assert depth_scale(0, 1) == 0.0


def test_time_scale_end_points():
    assert time_scale(0, 100, "scratch") == 0.0
    assert time_scale(99, 100, "scratch") == pytest.approx(1.0)
    assert time_scale(50, 100, "scratch") == pytest.approx(math.exp(50 * math.log(2) / 99) - 1)
    assert all(time_scale(t, 100, "continual") == 1.0 for t in (0, 50, 99))


def test_dropout_rates_shape_and_formula():
    rates = dropout_rates(10, 100, 8, 0.2, "continual")
    assert len(rates) == 8
    assert rates[0] == 0.0
    assert rates[-1] == pytest.approx(0.2)
    assert rates[3] == pytest.approx(0.2 * depth_scale(3, 8))
    scratch = dropout_rates(0, 100, 8, 0.2, "scratch")
    assert scratch == [0.0] * 8


def test_lr_factor_warmup_then_cosine():
    assert lr_factor(0, 10, 100) == pytest.approx(0.1)
    assert lr_factor(9, 10, 100) == pytest.approx(1.0)
    assert lr_factor(10, 10, 100) == pytest.approx(1.0)
    assert lr_factor(55, 10, 100) == pytest.approx(0.5)
    assert lr_factor(100, 10, 100) == pytest.approx(0.0)
    assert lr_factor(0, 0, 10) == pytest.approx(1.0)


# --- curricula (LayerSkip §4.1.2) ------------------------------------------------------------------------


@pytest.mark.parametrize(("layers", "rotation"), [(4, 2), (30, 8), (7, 3), (5, 1)])
def test_rotational_covers_every_layer_within_r_steps(layers, rotation):
    for start in range(3):
        seen = set()
        for step in range(start, start + rotation):
            exits = rotational_exits(step, layers, rotation)
            assert exits[-1] == layers - 1
            assert len(exits) <= math.ceil(layers / rotation) + 1
            seen.update(exits)
        assert seen == set(range(layers))


def test_rotational_formula():
    assert rotational_exits(0, 30, 8) == [0, 8, 16, 24, 29]
    assert rotational_exits(3, 30, 8) == [5, 13, 21, 29]
    assert rotational_exits(1, 4, 2) == [1, 3]


def test_gradual_endpoints_and_monotone():
    layers, steps = 6, 120
    assert gradual_exits(0, steps, layers) == [layers - 1]
    assert gradual_exits(steps - 1, steps, layers) == list(range(layers))
    assert gradual_exits(steps // 2, steps, layers) == list(range(layers))
    # one more layer every T/(2L) = 10 steps
    assert gradual_exits(9, steps, layers) == [5]
    assert gradual_exits(10, steps, layers) == [4, 5]
    counts = [len(gradual_exits(t, steps, layers)) for t in range(steps)]
    assert counts == sorted(counts)


def test_enabled_exits_none_is_every_layer():
    assert enabled_exits("none", 5, 10, 4, 8) == [0, 1, 2, 3]
    assert enabled_exits("rotational", 1, 10, 4, 2) == [1, 3]
    assert enabled_exits("gradual", 0, 10, 4, 2) == [3]


# --- loss weights (LayerSkip §4.2, CALM §3.4) -----------------------------------------------------------


def test_layerskip_scales_by_hand_for_four_layers():
    # e(l) = e_scale * sum_{i<=l} i for l < 3; e(3) = 3 + e_scale * (0 + 1 + 2)
    assert layerskip_scales(4, 1.0) == pytest.approx([0.0, 1.0, 3.0, 6.0])
    assert layerskip_scales(4, 2.0) == pytest.approx([0.0, 2.0, 6.0, 9.0])
    assert layerskip_scales(4, 0.0) == pytest.approx([0.0, 0.0, 0.0, 3.0])


def test_calm_scales_by_hand_for_four_layers():
    assert calm_scales(4) == pytest.approx([0.1, 0.2, 0.3, 0.4])
    assert sum(calm_scales(30)) == pytest.approx(1.0)
    assert exit_scales("calm", 4, 5.0) == calm_scales(4)
    assert exit_scales("layerskip", 4, 1.0) == layerskip_scales(4, 1.0)


@pytest.mark.parametrize("recipe", ["layerskip", "calm"])
@pytest.mark.parametrize("curriculum", ["rotational", "gradual", "none"])
def test_normalized_weights_sum_to_one(recipe, curriculum):
    layers = 30
    scales = exit_scales(recipe, layers, 1.0)
    for step in range(0, 300, 7):
        weights = normalized_weights(scales, enabled_exits(curriculum, step, 300, layers, 8))
        assert sum(weights.values()) == pytest.approx(1.0)
        assert all(value > 0 for value in weights.values())


def test_normalized_weights_by_hand():
    weights = normalized_weights([0.0, 1.0, 3.0, 6.0], [0, 2, 3])
    assert weights == pytest.approx({2: 3 / 9, 3: 6 / 9})  # e(0) = 0: exit 0 gets no head evaluation
    with pytest.raises(ExitbenchError):
        normalized_weights([0.0, 1.0], [0])


# --- layer dropout ----------------------------------------------------------------------------------------


def _rope(batch: int, seq: int = 3, dim: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    cos = torch.arange(batch, dtype=torch.float32).view(batch, 1, 1).expand(batch, seq, dim)
    return cos, torch.zeros(batch, seq, dim)


def _plus_row_layer(hidden, rope):
    """Mock layer x + f(x) with f = 1 + (the row's own cos value): checks rope rows follow hidden rows."""
    cos, _ = rope
    assert cos.shape[0] == hidden.shape[0]
    return hidden + 1.0 + cos[:, :, :1]


def test_keep_mask_extremes_and_seeding():
    generator = torch.Generator().manual_seed(0)
    mask = keep_mask([0.0, 1.0, 0.5], 1000, generator)
    assert mask.shape == (3, 1000)
    assert bool(mask[0].all())
    assert not bool(mask[1].any())
    assert 400 < int(mask[2].sum()) < 600
    again = keep_mask([0.0, 1.0, 0.5], 1000, torch.Generator().manual_seed(0))
    assert torch.equal(mask, again)


def test_dropout_p0_is_the_layer_and_p1_is_the_identity():
    hidden = torch.randn(4, 3, 2)
    rope = _rope(4)
    full = forward_kept_rows(_plus_row_layer, hidden, rope, torch.ones(4, dtype=torch.bool))
    assert torch.equal(full, _plus_row_layer(hidden, rope))
    skipped = forward_kept_rows(_plus_row_layer, hidden, rope, torch.zeros(4, dtype=torch.bool))
    assert torch.equal(skipped, hidden)
    identity = forward_kept_rows(lambda h, r: h, hidden, rope, torch.tensor([True, False, True, False]))
    assert torch.equal(identity, hidden)


def test_dropout_runs_kept_rows_only_and_scatters_back():
    hidden = torch.randn(4, 3, 2, requires_grad=True)
    rope = _rope(4)
    calls = []

    def layer(h, r):
        calls.append(h.shape[0])
        return _plus_row_layer(h, r)

    keep = torch.tensor([False, True, False, True])
    out = forward_kept_rows(layer, hidden, rope, keep)
    assert calls == [2]  # the dropped rows never reach the layer
    reference = _plus_row_layer(hidden, rope)
    assert torch.equal(out[keep], reference[keep])
    assert torch.equal(out[~keep], hidden[~keep])
    out.sum().backward()
    assert torch.equal(hidden.grad, torch.ones_like(hidden))


def test_dropout_on_a_real_layer_matches_the_full_batch(tiny_model):
    ids = torch.randint(0, 128, (5, 7), generator=torch.Generator().manual_seed(1))
    hidden = tiny_model.embed(ids)
    rope = tiny_model.rope(hidden, 0)
    keep = torch.tensor([True, False, False, True, True])
    with torch.no_grad():
        out = forward_kept_rows(lambda h, r: tiny_model.layer_forward(1, h, r), hidden, rope, keep)
        full = tiny_model.layer_forward(1, hidden, rope)
    torch.testing.assert_close(out[keep], full[keep], rtol=1e-5, atol=1e-5)
    assert torch.equal(out[~keep], hidden[~keep])


# --- the objective -----------------------------------------------------------------------------------------


def _batch():
    generator = torch.Generator().manual_seed(3)
    ids = torch.randint(3, 128, (3, 9), generator=generator)
    labels = torch.randint(3, 128, (3, 9), generator=generator)
    labels[0, :4] = -100
    labels[2, 6:] = -100
    return ids, labels, int((labels != -100).sum())


def test_objective_last_exit_equals_the_hf_model_loss(tiny_lm):
    ids, labels, num_tokens = _batch()
    objective = EarlyExitObjective(tiny_lm)
    keep = torch.ones(4, 3, dtype=torch.bool)
    with torch.no_grad():
        loss, sums = objective(ids, labels, keep, {3: 1.0}, num_tokens)
        logits = tiny_lm(input_ids=ids).logits
    expected = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100)
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-5)
    assert sums.shape == (1,)


def test_objective_is_the_weighted_sum_of_exit_losses(tiny_lm, tiny_model):
    ids, labels, num_tokens = _batch()
    weights = normalized_weights(layerskip_scales(4, 1.0), [0, 1, 2, 3])
    objective = EarlyExitObjective(tiny_lm)
    with torch.no_grad():
        loss, sums = objective(ids, labels, torch.ones(4, 3, dtype=torch.bool), weights, num_tokens)
        hidden = tiny_model.embed(ids)
        expected = torch.zeros(())
        for layer in range(4):
            hidden = tiny_model.forward_layers(hidden, layer, layer + 1)
            ce = F.cross_entropy(tiny_model.logits(hidden).reshape(-1, 128), labels.reshape(-1), ignore_index=-100)
            expected += weights.get(layer, 0.0) * ce
    assert sorted(weights) == [1, 2, 3] and sums.shape == (3,)
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-5)
