"""Roofline accounting: the bytes a generation reads, the machine's bandwidth, the fraction of the roof."""

from __future__ import annotations

import pytest
import torch

from exitbench.decoding import StopRule, build_method
from exitbench.provenance import CPU_FLAGS, cpu_features, provenance
from exitbench.roofline import ReadCounter, measure_bandwidth, roofline_fraction, triad_bytes


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def test_greedy_reads_every_layer_and_the_head_once_per_token_and_its_kv_cache(tiny_model):
    """The count, rebuilt by hand: prefill (p rows) then T - 1 one-row steps, each through all L layers."""
    model = tiny_model
    prompt, new = [5, 9, 17, 3, 8], 6
    with ReadCounter(model) as counter:
        result = build_method("autoregressive", model).generate(prompt, new, StopRule())
    assert result.num_tokens == new  # no stop rule: every token generated
    layers = sum(_nbytes(layer.parameters()) for layer in model.layers)
    head = _nbytes(model.lm_head.parameters()) + _nbytes(model.norm.parameters())
    shape, element = model.shape, 4
    kv_position = 2 * shape.num_kv_heads * shape.head_dim * element * shape.num_layers  # K and V, all layers
    p = len(prompt)
    attended = p + sum(p + k for k in range(1, new))  # prefill attends over p; step k over p + k positions
    embedded = (p + new - 1) * shape.hidden_size * element
    assert counter.bytes == new * (layers + head) + attended * kv_position + embedded


def test_the_counter_restores_the_model_and_counts_nothing_outside(tiny_model):
    with ReadCounter(tiny_model, None) as counter:
        assert "layer_forward" in vars(tiny_model)
    assert not {"embed", "layer_forward", "write_kv_only", "logits", "logits_subset"} & set(vars(tiny_model))
    before = counter.bytes
    build_method("autoregressive", tiny_model).generate([5, 9], 3, StopRule())
    assert counter.bytes == before


def test_early_exit_reads_fewer_bytes_than_greedy_and_tokens_are_unchanged(tiny_model):
    counts, tokens = {}, {}
    for name, options in (("autoregressive", {}), ("early_exit", {"exit_layer": 1})):
        method = build_method(name, tiny_model, options)
        plain = method.generate([5, 9, 17], 5, StopRule()).tokens
        with ReadCounter(tiny_model) as counter:
            tokens[name] = method.generate([5, 9, 17], 5, StopRule()).tokens
        counts[name] = counter.bytes
        assert tokens[name] == plain  # counting changes nothing the method computes
    assert 0 < counts["early_exit"] < counts["autoregressive"] / 2  # 1 of 4 layers (the head is shared)


def test_a_draft_model_is_counted_with_its_target(tiny_model):
    from exitbench.bench import truncated_view

    draft = truncated_view(tiny_model, 2)
    method = build_method("speculative", tiny_model, {"num_speculations": 2}, draft_model=draft)
    with ReadCounter(tiny_model) as target_only:
        method.generate([5, 9, 17], 6, StopRule())
    with ReadCounter(tiny_model, draft) as both:
        method.generate([5, 9, 17], 6, StopRule())
    assert both.bytes > target_only.bytes > 0


def test_roofline_fraction_is_the_roofline_time_over_the_measured_time():
    assert roofline_fraction(2e9, 1.0, 4.0) == pytest.approx(0.5)  # 2 GB at 4 GB/s = 0.5 s, measured 1 s
    assert roofline_fraction(0, 1.0, 4.0) is None and roofline_fraction(1e9, 0.0, 4.0) is None
    assert triad_bytes(1000, 4) == 12_000  # STREAM: b and c read, a written


def test_measured_bandwidth_is_a_positive_rate_with_its_setting():
    measured = measure_bandwidth(torch.float32, "cpu", mib=4, iters=2)
    assert measured.gb_per_s > 0 and measured.dtype == "float32" and measured.mib == 4
    assert measured.to_dict()["threads"] == torch.get_num_threads()


def test_provenance_names_the_cpu_features_that_choose_kernels():
    features = cpu_features()
    assert features["torch_capability"] == torch.backends.cpu.get_cpu_capability()
    assert set(features["flags"]) <= set(CPU_FLAGS)
    assert provenance({"profile": "x"})["cpu_features"] == features
