"""Kangaroo: the adapter's cached forward, its training (loss, agreement, resume), and exactness against greedy."""

from __future__ import annotations

import pytest
import torch

from exitbench.config import AdaptersConfig
from exitbench.decoding import StopRule, build_method
from exitbench.errors import ExitbenchError
from exitbench.models.adapter import KangarooAdapter, load_adapter, save_adapter
from exitbench.models.tiny import random_llama
from exitbench.models.view import EarlyExitModel
from exitbench.training import schedules
from exitbench.training.adapter_training import distillation_loss, train_adapter
from exitbench.training.corpora import Example
from exitbench.training.frozen import FrozenRun
from tests.decoding_helpers import greedy_tokens, prompts

MAX_NEW = 24


def fresh_model(seed: int = 0) -> EarlyExitModel:
    return EarlyExitModel(random_llama(seed=seed))


def examples(count: int, length: int = 24, seed: int = 5) -> list[Example]:
    """Seeded token sequences cycling one of four fixed motifs from a seeded offset (text a one-layer attention
    adapter can learn; held-out rows, another seed, share the motifs)."""
    motifs = torch.randint(3, 128, (4, 6), generator=torch.Generator().manual_seed(0)).tolist()
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(count):
        motif, offset = motifs[int(torch.randint(4, (1,), generator=gen))], int(torch.randint(6, (1,), generator=gen))
        rows.append(Example(tuple((motif * (length // 6 + 2))[offset : offset + length]), prompt_len=0))
    return rows


def make_run(model: EarlyExitModel, steps: int, checkpoint_every: int = 100) -> FrozenRun:
    cfg = AdaptersConfig(
        models=["tiny"],
        exit_layer=1,
        steps=steps,
        batch_size=4,
        seq_len=32,
        lr=1e-2,
        warmup_steps=2,
        checkpoint_every=checkpoint_every,
        held_out=4,
    )
    return FrozenRun(model, KangarooAdapter(model, 1), cfg, examples(32), examples(4, seed=9), 0, 1234)


def test_cached_forward_equals_the_whole_sequence_at_once():
    model = fresh_model()
    adapter = KangarooAdapter(model, 2)
    states = torch.randn(1, 9, model.shape.hidden_size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        whole = adapter(states, model.rope(states, 0))
        cache = adapter.new_cache(model, 16)
        first = adapter(states[:, :5], model.rope(states[:, :5], 0), 0, cache)
        rest = [adapter(states[:, i : i + 1], model.rope(states[:, i : i + 1], i), i, cache) for i in range(5, 9)]
    torch.testing.assert_close(torch.cat([first, *rest], dim=1), whole, rtol=1e-5, atol=1e-5)


def test_distillation_loss_is_the_kl_divergence_from_the_full_distribution():
    gen = torch.Generator().manual_seed(0)
    draft, target = torch.randn(1, 3, 7, generator=gen), torch.randn(1, 3, 7, generator=gen)
    mask = torch.tensor([[True, False, True]])
    expected = torch.stack(
        [
            torch.nn.functional.kl_div(
                torch.log_softmax(draft[0, i], -1),
                torch.log_softmax(target[0, i], -1),
                reduction="sum",
                log_target=True,
            )
            for i in (0, 2)
        ]
    ).mean()
    torch.testing.assert_close(distillation_loss(draft, target, mask), expected)
    assert float(distillation_loss(target, target, mask)) == pytest.approx(0.0, abs=1e-6)


def test_training_lowers_the_loss_and_raises_agreement(tmp_path):
    run = make_run(fresh_model(), steps=30)
    report = train_adapter(run, tmp_path / "ckpt", progress=False)
    losses = report["losses"]
    assert len(losses) == 30
    assert sum(losses[-5:]) / 5 < 0.8 * sum(losses[:5]) / 5, losses
    kl = report["kl"]  # on held-out text
    assert kl["adapter_trained"] < 0.8 * kl["adapter_untrained"], kl
    assert set(report["agreement"]) == {"early_exit", "adapter_untrained", "adapter_trained"}
    assert report["held_out_positions"] == 4 * 23
    assert not list((tmp_path / "ckpt").glob("checkpoint*")), "a finished run leaves no checkpoint"
    for param in run.model.hf.parameters():
        assert param.grad is None and param.requires_grad, "the model is frozen while training, then left as it was"


def test_a_killed_run_resumes_to_the_same_adapter(tmp_path, monkeypatch):
    whole = make_run(fresh_model(), steps=6, checkpoint_every=2)
    expected = train_adapter(whole, tmp_path / "a", progress=False)

    real = schedules.lr_factor

    def killed_at_step_5(step: int, warmup: int, total: int) -> float:
        if step == 5:
            raise KeyboardInterrupt
        return real(step, warmup, total)

    resumed = make_run(fresh_model(), steps=6, checkpoint_every=2)
    monkeypatch.setattr(schedules, "lr_factor", killed_at_step_5)
    with pytest.raises(KeyboardInterrupt):
        train_adapter(resumed, tmp_path / "b", progress=False)
    monkeypatch.setattr(schedules, "lr_factor", real)
    again = make_run(fresh_model(), steps=6, checkpoint_every=2)  # a new process: nothing kept but the checkpoint
    report = train_adapter(again, tmp_path / "b", progress=False)
    assert report["losses"] == expected["losses"]
    for key, value in whole.module.state_dict().items():
        torch.testing.assert_close(again.module.state_dict()[key], value, rtol=0, atol=0)


def test_save_and_load_round_trip_and_clear_errors(tmp_path):
    model = fresh_model()
    adapter = KangarooAdapter(model, 2)
    with torch.no_grad():
        adapter.attn.q_proj.weight.mul_(1.5)
    path = tmp_path / "tiny" / "kangaroo.pt"
    save_adapter(adapter, path, {"model": "tiny"})
    loaded = load_adapter(model, path)
    assert loaded.exit_layer == 2
    torch.testing.assert_close(loaded.attn.q_proj.weight, adapter.attn.q_proj.weight)
    with pytest.raises(ExitbenchError, match="train_adapters"):
        load_adapter(model, tmp_path / "missing.pt")
    other = EarlyExitModel(random_llama(hidden_size=32, num_layers=4, seed=1))
    with pytest.raises(ExitbenchError, match="another model"):
        load_adapter(other, path)
    with pytest.raises(ExitbenchError, match="exit_layer"):
        KangarooAdapter(model, model.num_layers)


@pytest.mark.parametrize("floor", [0.0, 0.6])
@pytest.mark.parametrize("d", [1, 4])
def test_exact_with_a_trained_adapter(tmp_path, tiny_model, floor, d):
    run = make_run(fresh_model(), steps=20)  # the fixture's weights (seed 0)
    train_adapter(run, tmp_path / "ckpt", progress=False)
    path = tmp_path / "kangaroo.pt"
    save_adapter(run.module, path, {})
    options = {"num_speculations": d, "min_confidence": floor, "adapter_file": str(path)}
    method = build_method("kangaroo", tiny_model, options)
    with torch.inference_mode():
        got = [method.generate(p, MAX_NEW).tokens for p in prompts()]
    assert got == greedy_tokens(tiny_model, MAX_NEW)


def test_exact_under_a_stop_rule_and_drafts_are_counted(tiny_model):
    reference = build_method("autoregressive", tiny_model)
    method = build_method("kangaroo", tiny_model, {"exit_layer": 2, "num_speculations": 3, "min_confidence": 0.0})
    with torch.inference_mode():
        for prompt in prompts():
            free = reference.generate(prompt, MAX_NEW).tokens
            stop = StopRule(eos_token_ids=frozenset({free[5]}))
            result = method.generate(prompt, MAX_NEW, stop)
            assert result.tokens == reference.generate(prompt, MAX_NEW, stop).tokens
            assert result.num_drafted > 0 and result.layer_calls["verify_forwards"] == result.num_rounds


def test_option_errors_are_one_line(tiny_model, tmp_path):
    with pytest.raises(ExitbenchError, match="adapter_file"):
        build_method("kangaroo", tiny_model, {"num_speculations": 2})
    path = tmp_path / "kangaroo.pt"
    save_adapter(KangarooAdapter(tiny_model, 1), path, {})
    with pytest.raises(ExitbenchError, match="trained at layer 1"):
        build_method("kangaroo", tiny_model, {"num_speculations": 2, "adapter_file": str(path), "exit_layer": 2})


def test_the_stage_without_adapters_still_writes_every_output(tmp_path):
    """A profile that trains no adapter (the cpu profile): every DVC output of train_adapters exists, none empty."""
    import json

    from exitbench.config import Config, stage_view
    from pipelines.train_adapters import main

    config = tmp_path / "train_adapters.json"
    config.write_text(json.dumps(stage_view(Config(profile="cpu"), "train_adapters")))
    out, checkpoints, reports = tmp_path / "adapters", tmp_path / "ckpt", tmp_path / "reports"
    main(
        [
            "--config",
            str(config),
            "--models-dir",
            str(tmp_path / "models"),
            "--data",
            str(tmp_path / "data"),
            "--out",
            str(out),
            "--checkpoints",
            str(checkpoints),
            "--reports",
            str(reports),
            "--no-progress",
        ]
    )
    assert checkpoints.is_dir() and reports.is_dir()
    assert json.loads((out / "adapters.json").read_text()) == {"adapters": {}}
