"""Depth pruning on the tiny model: the angular distance, the block it picks, decoding without the block."""

from __future__ import annotations

import json

import pytest
import torch

from exitbench.decoding import build_method
from exitbench.decoding.depth_pruning import angular_distances, choose_block, layer_inputs_at_last_token
from exitbench.errors import ExitbenchError
from tests.decoding_helpers import prompts

MAX_NEW = 12


def test_angular_distance_by_hand():
    # x^(0) = x^(1) = e1, x^(2) = e2, x^(3) = -e1: distances 0 and 1/2 (n = 1); 1/2 and 1 (n = 2)
    e1, e2 = torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 1.0]])
    states = [e1, e1, e2, -e1]
    assert angular_distances(states, 1) == pytest.approx([0.0, 0.5, 0.5])
    assert angular_distances(states, 2) == pytest.approx([0.5, 1.0])
    assert angular_distances([e1, 3 * e1], 1) == pytest.approx([0.0])  # scale-free
    assert angular_distances([torch.tensor([[1.0, 1.0]]), e1], 1)[0] == pytest.approx(0.25)  # 45 degrees


def test_layer_inputs_are_the_hidden_states_transformers_reports(tiny_lm, tiny_model):
    sequences = prompts()
    ours = layer_inputs_at_last_token(tiny_model, sequences)
    assert len(ours) == tiny_model.num_layers + 1
    for row, tokens in enumerate(sequences):
        with torch.no_grad():
            states = tiny_lm(input_ids=torch.tensor([tokens]), output_hidden_states=True).hidden_states
        for layer in range(tiny_model.num_layers):  # transformers' last entry is after the final norm
            torch.testing.assert_close(ours[layer][row], states[layer][0, -1], rtol=1e-5, atol=1e-5)


def test_the_block_chosen_is_the_one_of_least_angular_distance(tiny_model):
    first, distances = choose_block(tiny_model, prompts(), 2)
    assert len(distances) == tiny_model.num_layers - 1 and distances[first] == min(distances)
    assert all(0.0 <= d <= 1.0 for d in distances)


def _greedy_without(model, block: range, prompt: list[int], max_new: int) -> list[int]:
    """Reference: recompute the whole sequence through the kept layers at every step (no cache)."""
    tokens = list(prompt)
    for _ in range(max_new):
        with torch.no_grad():
            hidden = model.embed(torch.tensor([tokens]))
            rope = model.rope(hidden, 0)
            for layer in range(model.num_layers):
                if layer not in block:
                    hidden = model.layer_forward(layer, hidden, rope)
            tokens.append(int(model.logits(hidden)[0, -1].argmax()))
    return tokens[len(prompt) :]


@pytest.mark.parametrize(("first", "num"), [(0, 1), (1, 2), (3, 1), (1, 3)])
def test_decoding_skips_exactly_the_block(tiny_model, first, num):
    method = build_method("depth_pruning", tiny_model, {"num_pruned": num, "first_pruned": first})
    for prompt in prompts():
        result = method.generate(prompt, MAX_NEW)
        assert result.tokens == _greedy_without(tiny_model, range(first, first + num), prompt, MAX_NEW)
        assert result.layer_calls["layers_per_forward"] == tiny_model.num_layers - num


def test_calibration_file_chooses_the_block(tiny_model, tmp_path):
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps(prompts()))
    method = build_method("depth_pruning", tiny_model, {"num_pruned": 2, "calibration_file": str(path)})
    first, _ = choose_block(tiny_model, prompts(), 2)
    result = method.generate(prompts()[0], MAX_NEW)
    assert result.layer_calls["first_pruned"] == first
    assert result.tokens == _greedy_without(tiny_model, range(first, first + 2), prompts()[0], MAX_NEW)


def test_bad_settings_are_one_clear_error(tiny_model, tmp_path):
    with pytest.raises(ExitbenchError, match="num_pruned 4 must be below the model's 4 layers"):
        build_method("depth_pruning", tiny_model, {"num_pruned": 4, "first_pruned": 0})
    with pytest.raises(ExitbenchError, match=r"layers 3\.\.4 are not all among the model's 0\.\.3"):
        build_method("depth_pruning", tiny_model, {"num_pruned": 2, "first_pruned": 3}).generate(prompts()[0], 2)
    with pytest.raises(ExitbenchError, match=r"no calibration text .* set first_pruned"):
        build_method("depth_pruning", tiny_model, {"num_pruned": 1}).generate(prompts()[0], 2)
    missing = {"num_pruned": 1, "calibration_file": str(tmp_path / "x.json")}
    with pytest.raises(ExitbenchError, match=r"calibration_file .* not found"):
        build_method("depth_pruning", tiny_model, missing).generate(prompts()[0], 2)


def char_ids(text, add_special_tokens=False):
    """A tokenizer's call with one token per character."""
    return {"input_ids": [ord(char) for char in text]}


def test_task_calibration_is_train_text_only(tmp_path):
    from exitbench.subvocab import write_task_calibration
    from exitbench.tasks.registry import build_task

    task = build_task("topv2")

    tokenizer = char_ids

    assert write_task_calibration(task, tmp_path, tokenizer, 4, tmp_path / "c.json") is None  # no train split
    (tmp_path / "topv2").mkdir()
    rows = [{"domain": "alarm", "utterance": f"u{i}", "semantic_parse": f"[IN:X{i} ]"} for i in range(6)]
    (tmp_path / "topv2" / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    sequences = json.loads(write_task_calibration(task, tmp_path, tokenizer, 4, tmp_path / "c.json").read_text())
    assert len(sequences) == 4 and all(sequences)
    texts = ["".join(map(chr, seq)) for seq in sequences]
    assert all(any(f"[IN:X{i} ]" in text for i in range(6)) for text in texts)


def test_a_task_without_a_train_split_calibrates_on_its_corpus_never_its_test_rows(tmp_path):
    from types import SimpleNamespace

    from exitbench.evaluation import CORPUS_TOKENS, calibration_for
    from exitbench.tasks.registry import build_task

    task = build_task("humaneval")
    ctx = SimpleNamespace(tokenizer=char_ids)
    assert calibration_for(["depth_pruning@4"], ctx, task, tmp_path, tmp_path / "a") is None  # no corpus either
    (tmp_path / "humaneval").mkdir()
    (tmp_path / "humaneval" / "test.jsonl").write_text(json.dumps({"task_id": "HumanEval/0", "prompt": "TEST"}) + "\n")
    (tmp_path / "code").mkdir()
    docs = [{"id": f"mbpp/{i}", "text": f"def f{i}(): return {i}\n" * (1 if i else 200)} for i in range(40)]
    (tmp_path / "code" / "train.jsonl").write_text("".join(json.dumps(doc) + "\n" for doc in docs))
    first = json.loads(calibration_for(["depth_pruning@4"], ctx, task, tmp_path, tmp_path / "a").read_text())
    again = json.loads(calibration_for(["depth_pruning@4"], ctx, task, tmp_path, tmp_path / "b").read_text())
    assert first == again and len(first) == 32 and all(0 < len(seq) <= CORPUS_TOKENS for seq in first)
    texts = ["".join(map(chr, seq)) for seq in first]
    assert all(text.startswith("def f") and "TEST" not in text for text in texts)


def test_evaluate_writes_calibration_text_only_for_methods_that_take_it(tmp_path):
    from types import SimpleNamespace

    from exitbench.evaluation import calibration_for
    from exitbench.tasks.registry import build_task

    (tmp_path / "topv2").mkdir()
    row = {"domain": "alarm", "utterance": "wake me", "semantic_parse": "[IN:CREATE_ALARM ]"}
    (tmp_path / "topv2" / "train.jsonl").write_text(json.dumps(row) + "\n")
    ctx = SimpleNamespace(tokenizer=lambda text, add_special_tokens=False: {"input_ids": [ord(c) for c in text]})
    task = build_task("topv2")
    assert calibration_for(["autoregressive", "self_speculative"], ctx, task, tmp_path, tmp_path / "out") is None
    path = calibration_for(["autoregressive", "depth_pruning@4"], ctx, task, tmp_path, tmp_path / "out")
    assert path == tmp_path / "out" / "calibration.json" and len(json.loads(path.read_text())) == 1
