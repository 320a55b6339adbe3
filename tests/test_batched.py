"""Batched decoding: every row of a ragged batch equals the batch-1 method on its prompt, token for token."""

from __future__ import annotations

import pytest
import torch

from exitbench.batched import batched_method
from exitbench.batched.cache import BatchKVCache
from exitbench.batched.forward import position_mask
from exitbench.decoding import StopRule, build_method
from exitbench.errors import ExitbenchError

NUM_LAYERS = 4
MAX_NEW = 20


def ragged_prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(11)
    return [torch.randint(3, 128, (n,), generator=gen).tolist() for n in (5, 12, 17, 3)]


def batch1(tiny_model, label: str, options: dict, stop: StopRule | None = None) -> list[list[int]]:
    method = build_method(label, tiny_model, options)
    return [method.generate(p, MAX_NEW, stop).tokens for p in ragged_prompts()]


CASES = [
    ("autoregressive", {}),
    ("early_exit", {"exit_layer": 2}),
    ("self_speculative", {"exit_layer": 1, "num_speculations": 3}),
    ("self_speculative", {"exit_layer": 2, "num_speculations": 1}),
    ("self_speculative", {"exit_layer": 3, "num_speculations": 4}),
    ("calm", {"threshold": 0.3, "min_exit_layer": 1, "exit_every": 1}),
    ("calm", {"threshold": 0.9, "min_exit_layer": 2, "exit_every": 1}),
]


@pytest.mark.parametrize(("label", "options"), CASES)
def test_batched_rows_equal_batch_1(tiny_model, label, options):
    expected = batch1(tiny_model, label, options)
    method = batched_method(label, tiny_model, options)
    assert method(ragged_prompts(), MAX_NEW).tokens == expected  # one ragged batch of 4
    assert method(ragged_prompts()[:2], MAX_NEW).tokens == expected[:2]
    assert [method([p], MAX_NEW).tokens[0] for p in ragged_prompts()] == expected  # B = 1


def test_exact_batched_methods_equal_greedy(tiny_model):
    greedy = batch1(tiny_model, "autoregressive", {})
    spec = batched_method("self_speculative", tiny_model, {"exit_layer": 1, "num_speculations": 4})
    result = spec(ragged_prompts(), MAX_NEW)
    assert result.tokens == greedy
    drafted = [row["drafted"] for row in result.rows]
    accepted = [row["accepted"] for row in result.rows]
    assert all(0 <= a <= d for a, d in zip(accepted, drafted, strict=True)) and sum(drafted) > 0
    assert result.work["rejected_draft_positions"] == sum(drafted) - sum(accepted) > 0
    assert result.work["padded_prefill_positions"] == sum(17 - n for n in (5, 12, 17, 3))


def test_rows_finish_at_their_own_stop_and_leave_the_batch(tiny_model):
    greedy = batch1(tiny_model, "autoregressive", {})
    eos = greedy[1][4]  # a token row 1 writes early: that row stops there, the others may run on
    stop = StopRule(frozenset({eos}))
    for label, options in CASES:
        expected = batch1(tiny_model, label, options, stop)
        assert batched_method(label, tiny_model, options)(ragged_prompts(), MAX_NEW, stop).tokens == expected, label
    lengths = {len(t) for t in batch1(tiny_model, "autoregressive", {}, stop)}
    assert len(lengths) > 1, "the stop token must end rows at different lengths"


def test_batched_calm_runs_the_deepest_row_and_counts_the_carried_layers(tiny_model):
    options = {"threshold": 0.3, "min_exit_layer": 1, "exit_every": 1}
    result = batched_method("calm", tiny_model, options)(ragged_prompts(), MAX_NEW)
    exits = [row["exit_layers"] for row in result.rows]
    assert any(layer < NUM_LAYERS for row in exits for layer in row[1:]), "no token exited early: weak test"
    assert len({layer for row in exits for layer in row[1:]}) > 1, "rows must exit at different layers"
    # the batch ran each step to its deepest live row's exit, so it ran at least every row's own depth
    assert all(depth <= NUM_LAYERS for depth in result.step_depths)
    assert max(result.step_depths) >= max(layer for row in exits for layer in row[1:])
    assert result.work["carried_token_layers"] > 0


def test_cache_writes_each_row_at_its_own_positions():
    cache = BatchKVCache(num_layers=1, batch_size=2, num_kv_heads=1, head_dim=2, capacity=2, dtype=torch.float32)
    keys = torch.arange(8, dtype=torch.float32).view(2, 1, 2, 2)
    positions = torch.tensor([[0, 1], [3, 4]])
    k, _ = cache.write(0, keys, keys, positions)
    assert k.shape == (2, 1, 5, 2) and cache.capacity >= 5
    assert k[0, 0, :2].tolist() == keys[0, 0].tolist() and k[1, 0, 3:5].tolist() == keys[1, 0].tolist()
    cache.keep([1])
    assert cache.batch_size == 1 and cache.keys[0, 0, 0, 3:5].tolist() == keys[1, 0].tolist()
    mask = position_mask(torch.tensor([[1], [3]]), 5)
    assert mask.shape == (2, 1, 1, 5)
    assert mask[0, 0, 0].tolist() == [True, True, False, False, False]
    assert mask[1, 0, 0].tolist() == [True, True, True, True, False]


def test_methods_without_a_batched_form_say_so(tiny_model):
    with pytest.raises(ExitbenchError, match="no batched form; batched methods: autoregressive"):
        batched_method("prompt_lookup", tiny_model, {"ngram_size": 3, "num_speculations": 4})
    calm = batched_method("calm", tiny_model, {"threshold": 0.5, "kv_strategy": "recompute"})
    with pytest.raises(ExitbenchError, match="kv_strategy 'recompute' has no batched form"):
        calm(ragged_prompts(), 4)
    with pytest.raises(ExitbenchError, match=r"exit_layer 9 is outside 1\.\.4"):
        batched_method("early_exit@9", tiny_model, {"exit_layer": 9})
