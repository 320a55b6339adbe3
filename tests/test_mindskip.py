"""MindSkip / Router-Tuning: routed decoding against a cache-free definition, the routers' training (capacity,
resume, frozen model), save/load, and the static control."""

from __future__ import annotations

import pytest
import torch

from exitbench.config import RoutersConfig
from exitbench.decoding import StopRule, build_method
from exitbench.decoding.steps import new_cache_for
from exitbench.errors import ExitbenchError
from exitbench.models.router import DepthRouters, load_routers, routed_forward, routed_layer_indices, save_routers
from exitbench.models.tiny import random_llama
from exitbench.models.view import EarlyExitModel, mlp_forward
from exitbench.training import router_training, schedules
from exitbench.training.corpora import Example, collate
from exitbench.training.frozen import FrozenRun
from exitbench.training.router_training import (
    StraightThrough,
    routed_pass,
    routing_context,
    static_skip_set,
    train_routers,
)
from tests.decoding_helpers import greedy_tokens, prompts
from tests.test_kangaroo import examples

MAX_NEW = 20


def fresh_model(seed: int = 0, num_layers: int = 4) -> EarlyExitModel:
    return EarlyExitModel(random_llama(num_layers=num_layers, seed=seed))


def saved(tmp_path, routers: DepthRouters, static_skip: list[int] | None = None) -> str:
    routers.static_skip = static_skip or []
    path = tmp_path / "tiny" / "routers.pt"
    save_routers(routers, path, {"model": "tiny"})
    return str(path)


def skip_free_reference(model: EarlyExitModel, routers: DepthRouters, prompt: list[int], max_new: int) -> list[int]:
    """Greedy decoding with the routers' choice, by definition: the choice made on the prompt (score of the mean
    normalised layer input, through a sigmoid, against tau), then every step recomputed over the whole sequence
    without a cache, the skipped layers' attention (or whole layer) left out."""
    skipped: set[int] = set()
    tokens: list[int] = []
    with torch.no_grad():
        for step in range(max_new):
            hidden = model.embed(torch.tensor([prompt + tokens]))
            rope = model.rope(hidden, 0)
            for index in range(model.num_layers):
                layer = model.layers[index]
                if step == 0 and index in routers.layers:
                    router = routers.routers[routers.layers.index(index)]
                    score = torch.sigmoid(router(layer.input_layernorm(hidden).mean(dim=1)))
                    if float(score) < routers.threshold:
                        skipped.add(index)
                if index not in skipped:
                    hidden = model.layer_forward(index, hidden, rope)
                elif routers.granularity == "attention":
                    hidden = hidden + mlp_forward(layer.mlp, layer.post_attention_layernorm(hidden))
            tokens.append(int(model.logits(hidden)[0, -1].argmax()))
    return tokens


def test_the_routed_layers_are_the_ones_before_the_last():
    assert routed_layer_indices(8, 4) == [3, 4, 5, 6]
    assert routed_layer_indices(4, 3) == [0, 1, 2]
    for bad in (0, 4):
        with pytest.raises(ExitbenchError, match="num_routed"):
            routed_layer_indices(4, bad)


def test_untrained_routers_run_every_layer_so_the_output_is_greedy(tmp_path):
    model = fresh_model()
    method = build_method("mindskip", model, {"router_file": saved(tmp_path, DepthRouters(model, 3))})
    for prompt, expected in zip(prompts(), greedy_tokens(model, MAX_NEW), strict=True):
        result = method.generate(prompt, MAX_NEW)
        assert result.tokens == expected
        assert result.layer_calls["skipped"] == 0 and result.layer_calls["routed"] == 3


@pytest.mark.parametrize("granularity", ["attention", "layer"])
def test_cached_routed_decoding_equals_the_cache_free_definition(tmp_path, granularity):
    model = fresh_model(num_layers=6)
    routers = DepthRouters(model, 4, granularity)
    with torch.no_grad():  # prompt-dependent choices: some layers on, some off, not the same for every prompt
        for k, router in enumerate(routers.routers):
            router.weight.normal_(0, 0.5, generator=torch.Generator().manual_seed(k))
            router.bias.fill_(0.0)
    method = build_method("mindskip", model, {"router_file": saved(tmp_path, routers)})
    skipped_counts = set()
    for prompt in prompts():
        result = method.generate(prompt, MAX_NEW)
        assert result.tokens == skip_free_reference(model, routers, prompt, MAX_NEW)
        skipped_counts.add(result.layer_calls["skipped"])
    assert skipped_counts != {0}, "the test must route some layer off"


def test_skipping_changes_the_output_so_the_method_is_lossy(tmp_path):
    model = fresh_model()
    routers = DepthRouters(model, 3, "layer", init_bias=-5.0)  # every routed layer off
    method = build_method("mindskip", model, {"router_file": saved(tmp_path, routers)})
    assert not method.exact
    outputs = [method.generate(p, MAX_NEW) for p in prompts()]
    assert all(r.layer_calls["skipped"] == 3 for r in outputs)
    assert [r.tokens for r in outputs] != greedy_tokens(model, MAX_NEW)


def test_static_routing_skips_the_stored_set_for_every_prompt(tmp_path):
    model = fresh_model()
    routers = DepthRouters(model, 3)  # learned routing would skip nothing
    method = build_method("mindskip", model, {"router_file": saved(tmp_path, routers, [1]), "routing": "static"})
    reference = DepthRouters(model, 3)
    with torch.no_grad():
        reference.routers[1].bias.fill_(-5.0)  # layer 1 off for every prompt
    for prompt in prompts():
        result = method.generate(prompt, MAX_NEW)
        assert result.layer_calls["skipped"] == 1
        assert result.tokens == skip_free_reference(model, reference, prompt, MAX_NEW)
    nothing = build_method("mindskip", model, {"router_file": saved(tmp_path, routers), "routing": "static"})
    assert [nothing.generate(p, MAX_NEW).tokens for p in prompts()] == greedy_tokens(model, MAX_NEW)


def test_eos_stops_routed_decoding(tmp_path):
    model = fresh_model()
    method = build_method("mindskip", model, {"router_file": saved(tmp_path, DepthRouters(model, 2))})
    full = method.generate(prompts()[0], MAX_NEW).tokens
    stop = StopRule(eos_token_ids=frozenset({full[3]}))
    assert method.generate(prompts()[0], MAX_NEW, stop).tokens == full[: full.index(full[3]) + 1]


def test_the_gate_is_hard_forward_and_straight_through_backward():
    x = torch.tensor([-0.2, 0.0, 0.3], requires_grad=True)
    gate = StraightThrough.apply(x)
    assert gate.tolist() == [0.0, 0.0, 1.0]
    (gate * torch.tensor([1.0, 2.0, 3.0])).sum().backward()
    assert x.grad.tolist() == [1.0, 2.0, 3.0]


def test_the_routing_context_is_the_prompt_and_leaves_padding_out():
    rows = [Example(tuple(range(3, 13)), prompt_len=4), Example(tuple(range(3, 9)), prompt_len=0)]
    _, labels = collate(rows, pad_id=0)  # 9 positions: ids are tokens[:-1]
    context = routing_context(labels)
    assert context[0].tolist() == [True] * 4 + [False] * 5, "the prompt's 4 tokens, not its targets"
    assert context[1].tolist() == [True] * 5 + [False] * 4, "no prompt: the targets, padding left out"


def test_training_gates_are_the_decisions_decoding_makes_at_the_prompt():
    """A training batch's gates equal what MindSkip decides at the prompt (routed_forward at the prefill), so the
    routers learn the decisions decoding makes; pooling over the targets would not (the prompts and completions
    below differ, and the routers' scores with them)."""
    model = fresh_model(seed=3, num_layers=6)
    routers = DepthRouters(model, 4)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for router in routers.routers:
            router.weight.copy_(torch.randn(router.weight.shape, generator=gen) * 4.0)
            router.bias.zero_()
    lengths = [(3, 9), (5, 4), (8, 7), (4, 12), (6, 6), (7, 3)]
    rows = [Example(tuple(torch.randint(3, 128, (p + c,), generator=gen).tolist()), prompt_len=p) for p, c in lengths]
    ids, labels = collate(rows, pad_id=0)
    with torch.no_grad():
        _, gates = routed_pass(model, routers, ids, routing_context(labels))
        for row, example in enumerate(rows):
            prompt = torch.tensor([example.tokens[: example.prompt_len]])
            hidden = model.embed(prompt)
            cache = new_cache_for(model, prompt.shape[1], 1)
            _, skipped = routed_forward(model, routers, hidden, model.rope(hidden, 0), 0, cache, None)
            trained = {layer for k, layer in enumerate(routers.layers) if float(gates[row, k]) == 0.0}
            assert trained == skipped, (row, trained, skipped)
    assert 0.0 < float(gates.mean()) < 1.0, "some routed layers skipped and some run: the test decides something"


def make_run(model: EarlyExitModel, steps: int, checkpoint_every: int = 100, target: float = 0.5) -> FrozenRun:
    cfg = RoutersConfig(
        models=["tiny"],
        num_routed=3,
        target_capacity=target,
        capacity_weight=5.0,
        steps=steps,
        batch_size=4,
        seq_len=32,
        lr=5e-2,
        warmup_steps=2,
        checkpoint_every=checkpoint_every,
        held_out=4,
    )
    return FrozenRun(model, DepthRouters(model, 3), cfg, examples(32), examples(4, seed=9), 0, 1234)


def test_training_brings_capacity_to_the_target_and_leaves_the_model_as_it_was(tmp_path):
    run = make_run(fresh_model(), steps=40, target=0.34)
    before = {key: value.clone() for key, value in run.model.hf.state_dict().items()}
    report = train_routers(run, tmp_path / "ckpt", progress=False)
    assert report["capacities"][0] == 1.0, "untrained routers run every routed layer"
    assert report["routing_context"] == "prompt", "the report says what the routers decide from"
    assert report["routed"]["capacity"] < 1.0, report["routed"]
    assert sum(report["capacities"][-10:]) / 10 <= 0.6, report["capacities"]
    skipped = report["routed"]["skipped_by_layer"]
    assert set(skipped) == {"0", "1", "2"}
    control = report["static_control"]
    assert control["skip"] == run.module.static_skip and len(control["skip"]) == round(sum(skipped.values()))
    assert 0 <= control["agreement"] <= 1 and control["kl"] >= 0
    assert not list((tmp_path / "ckpt").glob("checkpoint*")), "a finished run leaves no checkpoint"
    for key, value in run.model.hf.state_dict().items():
        torch.testing.assert_close(value, before[key], rtol=0, atol=0)
    for param in run.model.hf.parameters():
        assert param.grad is None and param.requires_grad, "the model is frozen while training, then left as it was"


def test_the_static_control_takes_the_layers_skipped_most_often():
    held = router_training.HeldOutRouting(0.5, 1.0, 0.5, 10, {3: 0.9, 4: 0.1, 5: 0.6, 6: 0.4})
    assert static_skip_set(held) == [3, 5]  # 2 layers skipped on average: the two most often skipped


def test_a_killed_run_resumes_to_the_same_routers(tmp_path, monkeypatch):
    whole = make_run(fresh_model(), steps=6, checkpoint_every=2)
    expected = train_routers(whole, tmp_path / "a", progress=False)
    real = schedules.lr_factor

    def killed_at_step_5(step: int, warmup: int, total: int) -> float:
        if step == 5:
            raise KeyboardInterrupt
        return real(step, warmup, total)

    monkeypatch.setattr(schedules, "lr_factor", killed_at_step_5)
    with pytest.raises(KeyboardInterrupt):
        train_routers(make_run(fresh_model(), steps=6, checkpoint_every=2), tmp_path / "b", progress=False)
    monkeypatch.setattr(schedules, "lr_factor", real)
    again = make_run(fresh_model(), steps=6, checkpoint_every=2)
    report = train_routers(again, tmp_path / "b", progress=False)
    assert report["losses"] == expected["losses"] and report["capacities"] == expected["capacities"]
    for key, value in whole.module.state_dict().items():
        torch.testing.assert_close(again.module.state_dict()[key], value, rtol=0, atol=0)


def test_save_and_load_round_trip_and_clear_errors(tmp_path):
    model = fresh_model()
    routers = DepthRouters(model, 2, "layer", threshold=0.4)
    with torch.no_grad():
        routers.routers[0].weight.fill_(0.25)
    path = saved(tmp_path, routers, [2])
    loaded = load_routers(model, path)
    assert (loaded.layers, loaded.granularity, loaded.threshold, loaded.static_skip) == ([1, 2], "layer", 0.4, [2])
    torch.testing.assert_close(loaded.routers[0].weight, routers.routers[0].weight)
    with pytest.raises(ExitbenchError, match="not found"):
        load_routers(model, tmp_path / "none.pt")
    wider = EarlyExitModel(random_llama(hidden_size=32, num_heads=2, num_kv_heads=1))
    with pytest.raises(ExitbenchError, match="another model"):
        load_routers(wider, path)
    with pytest.raises(ExitbenchError, match="more than"):
        load_routers(EarlyExitModel(random_llama(num_layers=2)), saved(tmp_path, DepthRouters(model, 3)))
    payload = torch.load(path, weights_only=True)
    payload["format"] = 99
    torch.save(payload, path)
    with pytest.raises(ExitbenchError, match="format 99"):
        load_routers(model, path)
    with pytest.raises(ExitbenchError, match="router_file"):
        build_method("mindskip", model, {})


def test_the_stage_without_routers_still_writes_every_output(tmp_path):
    """A profile that trains no routers (the cpu profile): every DVC output of train_routers exists, none empty."""
    import json

    from exitbench.config import Config, stage_view
    from pipelines.train_routers import main

    config = tmp_path / "train_routers.json"
    config.write_text(json.dumps(stage_view(Config(profile="cpu"), "train_routers")))
    out, checkpoints, reports = tmp_path / "routers", tmp_path / "ckpt", tmp_path / "reports"
    main(["--config", str(config), "--models-dir", str(tmp_path / "models"), "--data", str(tmp_path / "data"),
          "--out", str(out), "--checkpoints", str(checkpoints), "--reports", str(reports)])  # fmt: skip
    assert json.loads((out / "routers.json").read_text()) == {"routers": {}}
    assert checkpoints.is_dir() and reports.is_dir()


def test_configure_names_the_models_a_method_has_no_routers_for():
    from exitbench.config import resolve
    from tests.test_config import configure_stage

    methods = {"autoregressive": {}, "mindskip": {}}
    cfg = resolve({"evaluate": {"models": ["base", "layerskip"], "methods": methods}, "routers": {"models": ["base"]}})
    with pytest.raises(ExitbenchError, match=r"mindskip runs on layerskip, which routers\.models \(base\) trains no"):
        configure_stage().check_trained_files(cfg)
    configure_stage().check_trained_files(resolve({**cfg.model_dump(), "routers": {"models": ["base", "layerskip"]}}))
