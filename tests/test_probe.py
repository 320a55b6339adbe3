"""The readability probe on the tiny random Llama: exact final-layer values, shapes, ranges, the stage CLI."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from exitbench.errors import ExitbenchError
from exitbench.probe import (
    METRICS,
    PROBE_TEXTS,
    load_topv2_pairs,
    probe_layers,
    probe_many,
    probe_prompt_target,
)

VOCAB = 128


@pytest.fixture(scope="module")
def token_ids() -> torch.Tensor:
    generator = torch.Generator().manual_seed(7)
    return torch.randint(0, VOCAB, (40,), generator=generator)


def test_last_layer_agrees_with_itself(tiny_model, token_ids):
    result = probe_layers(tiny_model, token_ids)
    assert set(result) == set(METRICS)
    assert all(len(values) == tiny_model.num_layers for values in result.values())
    assert result["top1_agreement"][-1] == 1.0
    assert result["median_rank"][-1] == 0.0


def test_values_in_range(tiny_model, token_ids):
    result = probe_layers(tiny_model, token_ids.unsqueeze(0))
    assert all(0.0 <= value <= 1.0 for value in result["top1_agreement"])
    assert all(0.0 <= value <= VOCAB - 1 for value in result["median_rank"])
    assert all(1.0 / VOCAB - 1e-9 <= value <= 1.0 for value in result["confidence"])
    assert result["top1_agreement"][0] < 1.0  # a random model's first layer does not read out like its last


def test_matches_a_direct_computation(tiny_model, token_ids):
    ids = token_ids.unsqueeze(0)
    layer = 2
    with torch.no_grad():
        final = tiny_model.logits(tiny_model.forward_layers(tiny_model.embed(ids), 0, tiny_model.num_layers))[0]
        early = tiny_model.logits(tiny_model.forward_layers(tiny_model.embed(ids), 0, layer))[0]
    top = final.argmax(-1)
    ranks = (early > early.gather(-1, top[:, None])).sum(-1).double()
    result = probe_layers(tiny_model, ids)
    assert result["top1_agreement"][layer - 1] == pytest.approx((early.argmax(-1) == top).double().mean().item())
    assert result["median_rank"][layer - 1] == pytest.approx(ranks.quantile(0.5).item())
    assert result["confidence"][layer - 1] == pytest.approx(torch.softmax(early, -1).amax(-1).mean().item(), rel=1e-5)


def test_truncates_to_max_tokens(tiny_model, token_ids):
    assert probe_layers(tiny_model, token_ids, max_tokens=8) == probe_layers(tiny_model, token_ids[:8])


def test_pooling_several_sequences(tiny_model, token_ids):
    pooled = probe_many(tiny_model, [token_ids[:20], token_ids[20:]])
    assert pooled["top1_agreement"][-1] == 1.0 and len(pooled["confidence"]) == tiny_model.num_layers


def test_bad_input_is_a_clear_error(tiny_model):
    with pytest.raises(ExitbenchError, match="empty"):
        probe_layers(tiny_model, torch.zeros(0, dtype=torch.long))
    with pytest.raises(ExitbenchError, match="one sequence"):
        probe_layers(tiny_model, torch.zeros(2, 5, dtype=torch.long))


def test_probe_texts_are_what_they_claim():
    assert set(PROBE_TEXTS) == {"english", "code", "numbers"}
    assert 120 <= len(PROBE_TEXTS["english"].split()) <= 200
    compile(PROBE_TEXTS["code"], "<probe>", "exec")
    assert PROBE_TEXTS["numbers"].startswith("1, 2, 3, ") and PROBE_TEXTS["numbers"].endswith("59, 60")


def _write_topv2(path: Path, rows: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [
        json.dumps({"domain": "alarm", "utterance": f"set an alarm for {i} am", "semantic_parse": f"[IN:ALARM {i} ]"})
        for i in range(rows)
    ]
    path.write_text("\n".join(lines) + "\n")


def test_topv2_prompts(tmp_path):
    path = tmp_path / "topv2" / "eval.jsonl"
    _write_topv2(path, 5)
    pairs = load_topv2_pairs(path, 3)
    assert pairs == [(f"set an alarm for {i} am\n", f"[IN:ALARM {i} ]") for i in range(3)]
    with pytest.raises(ExitbenchError, match="prepare_data"):
        load_topv2_pairs(tmp_path / "absent.jsonl", 3)
    path.write_text('{"utterance": "x"}\n')
    with pytest.raises(ExitbenchError, match="semantic_parse"):
        load_topv2_pairs(path, 3)


def _byte_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    vocab = {char: index for index, char in enumerate(bytes_to_unicode().values())}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=backend)


def test_stage_cli(tmp_path):
    from exitbench.models.tiny import random_llama

    model_dir = tmp_path / "models" / "tiny"
    random_llama(vocab_size=256).save_pretrained(model_dir)
    _byte_tokenizer().save_pretrained(model_dir)
    _write_topv2(tmp_path / "data" / "topv2" / "eval.jsonl", 4)
    config = tmp_path / "probe_layers.json"
    probe = {"max_tokens": 24, "topv2_rows": 2, "models": ["tiny"]}
    config.write_text(json.dumps({"profile": "cpu", "base": {"threads": 1}, "probe": probe}))
    spec = importlib.util.spec_from_file_location(
        "probe_layers_cli", Path(__file__).resolve().parents[1] / "pipelines" / "probe_layers.py"
    )
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)
    out = tmp_path / "results" / "probe" / "tiny.json"
    cli.main([
        "--config", str(config), "--model-dir", str(model_dir), "--name", "tiny",
        "--data", str(tmp_path / "data"), "--out", str(out),
    ])
    report = json.loads(out.read_text())
    assert report["model"] == "tiny" and report["num_layers"] == 4 and report["layers"] == [1, 2, 3, 4]
    assert set(report["texts"]) == {"english", "code", "numbers", "topv2", "topv2_target"}
    assert report["texts"]["topv2"]["num_texts"] == 2
    assert 0 < report["texts"]["topv2_target"]["num_tokens"] < report["texts"]["topv2"]["num_tokens"]
    assert all(entry["num_tokens"] <= 24 * entry["num_texts"] for entry in report["texts"].values())
    for entry in report["texts"].values():
        assert entry["top1_agreement"][-1] == 1.0 and entry["median_rank"][-1] == 0.0
    assert {"git_commit", "torch", "transformers", "date"} <= set(report["provenance"])
    assert [path.name for path in out.parent.iterdir()] == ["tiny.json"]
    other = tmp_path / "results" / "probe" / "other.json"  # a model probe.models leaves out: a stub, no model load
    cli.main(["--config", str(config), "--model-dir", str(tmp_path / "none"), "--name", "other", "--out", str(other)])
    assert json.loads(other.read_text()) == {"model": "other", "skipped": "'other' is not in probe.models (tiny)"}


def test_target_positions_are_the_ones_predicting_the_target():
    """topv2_target pools exactly the positions len(prompt)-1 .. S-2 of prompt + target + EOS."""
    from exitbench.models.tiny import random_llama
    from exitbench.models.view import EarlyExitModel

    tiny_model = EarlyExitModel(random_llama(vocab_size=256))
    tokenizer = _byte_tokenizer()
    tokenizer.eos_token = "!"
    pairs = [("ab\n", "xyz"), ("hello\n", "q")]
    result = probe_prompt_target(tiny_model, tokenizer, pairs, "task", max_tokens=64)
    assert result["task"]["num_tokens"] == (3 + 3 + 1) + (6 + 1 + 1)
    assert result["task_target"]["num_tokens"] == (3 + 1) + (1 + 1)
    ids = torch.tensor(tokenizer("ab\nxyz!")["input_ids"])
    expected = probe_many(tiny_model, [ids])["top1_agreement"]
    single = probe_prompt_target(tiny_model, tokenizer, pairs[:1], "task", max_tokens=64)
    assert single["task"]["top1_agreement"] == pytest.approx(expected)
    with pytest.raises(ExitbenchError, match="max_tokens"):
        probe_prompt_target(tiny_model, tokenizer, pairs, "task", max_tokens=3)
