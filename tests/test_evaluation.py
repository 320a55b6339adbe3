"""The evaluate harness on the tiny model: resumable records, exactness vs greedy, failed samples."""

from __future__ import annotations

import json

import pytest
import torch

from exitbench.decoding import StopRule, build_method
from exitbench.evaluation import run_method, run_methods
from exitbench.prompts import TaskBatch, first_divergence
from exitbench.records import RecordFile
from exitbench.summaries import summarize
from exitbench.tasks.base import Sample, Task


class CharTokenizer:
    """Token i <-> one character: enough to decode and score on the tiny 128-token model."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(32 + i % 90) for i in ids)


class CountingTask(Task):
    name = "counting"
    primary_metric = "length"

    def make_sample(self, index, row):
        return Sample(str(index), row["prompt"], "", row)

    def score(self, sample, completion):
        if sample.row.get("explode"):
            raise RuntimeError("scorer crashed")
        return {"length": float(len(completion))}


def make_batch(num: int = 3, explode_at: int | None = None) -> TaskBatch:
    gen = torch.Generator().manual_seed(3)
    rows = [{"prompt": f"p{i}", "explode": i == explode_at} for i in range(num)]
    task = CountingTask()
    samples = task.samples(rows, num)
    ids = [torch.randint(3, 128, (6 + i,), generator=gen).tolist() for i in range(num)]
    return TaskBatch(task, samples, ids, StopRule(), 12, CharTokenizer())


def test_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2


def test_self_speculative_is_exact_and_summarised(tiny_model, tmp_path):
    batch = make_batch()
    greedy = run_method(build_method("autoregressive", tiny_model), batch, RecordFile(tmp_path / "g.jsonl", "k"), "g")
    method = build_method("self_speculative", tiny_model, {"exit_layer": 2, "num_speculations": 2})
    records = run_method(method, batch, RecordFile(tmp_path / "s.jsonl", "k"), "s")
    summary = summarize(batch.task, method, batch.samples, records, greedy)
    assert summary["correctness"]["num_mismatched"] == 0
    assert summary["correctness"]["exact_claimed"] is True
    assert summary["speed"]["speedup_vs_greedy"] > 0
    assert 0 <= summary["speed"]["acceptance_rate"] <= 1
    assert summary["quality"]["length"] > 0


def test_inexact_method_reports_mismatches(tiny_model, tmp_path):
    batch = make_batch()
    greedy = run_method(build_method("autoregressive", tiny_model), batch, RecordFile(tmp_path / "g.jsonl", "k"), "g")
    method = build_method("early_exit", tiny_model, {"exit_layer": 1})
    records = run_method(method, batch, RecordFile(tmp_path / "e.jsonl", "k"), "e")
    summary = summarize(batch.task, method, batch.samples, records, greedy)
    assert summary["correctness"]["num_mismatched"] > 0
    assert summary["correctness"]["first_divergence_min"] is not None


def test_a_crashing_sample_is_recorded_not_fatal(tiny_model, tmp_path):
    batch = make_batch(explode_at=1)
    method = build_method("autoregressive", tiny_model)
    records = run_method(method, batch, RecordFile(tmp_path / "g.jsonl", "k"), "g")
    summary = summarize(batch.task, method, batch.samples, records, None)
    assert summary["num_failed"] == 1
    assert "scorer crashed" in summary["errors"][0]


def test_records_resume_and_reset_on_new_settings(tiny_model, tmp_path):
    path = tmp_path / "g.jsonl"
    batch = make_batch()
    method = build_method("autoregressive", tiny_model)
    run_method(method, batch, RecordFile(path, "key1"), "g")
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:-1]) + '\n{"index": 2, "tok')  # a kill mid-write: torn last line
    calls = []
    original = method.generate

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    method.generate = counting  # type: ignore[method-assign]
    resumed = RecordFile(path, "key1")
    assert [resumed.get(key) is not None for key in batch.sample_keys] == [True, True, False]
    run_method(method, batch, resumed, "g")
    assert len(calls) == 2  # one warm-up + the one missing sample
    assert [json.loads(line).get("index") for line in path.read_text().splitlines()] == [0, 1, 2]
    other = RecordFile(path, "key2")
    assert all(other.get(key) is None for key in batch.sample_keys)
    assert len(other.stored) == 3  # key1's records stay in the file


def test_methods_are_interleaved_per_sample_and_resume_independently(tiny_model, tmp_path):
    batch = make_batch(num=3)
    calls: list[tuple[str, int]] = []

    def spy(label, method):
        original = method.generate

        def generate(prompt, max_new_tokens, stop):
            calls.append((label, batch.prompt_ids.index(list(prompt)), max_new_tokens))
            return original(prompt, max_new_tokens, stop)

        method.generate = generate  # type: ignore[method-assign]
        return method

    greedy = spy("g", build_method("autoregressive", tiny_model))
    spec = spy("s", build_method("self_speculative", tiny_model, {"exit_layer": 2, "num_speculations": 2}))
    spec_records = RecordFile(tmp_path / "s.jsonl", "k")
    run_method(spec, batch, spec_records, "s")  # the speculative method has every sample already
    calls.clear()
    runs = {"g": (greedy, RecordFile(tmp_path / "g.jsonl", "k")), "s": (spec, spec_records)}
    done = run_methods(runs, batch, "both")
    timed = [(label, index) for label, index, new in calls if new == batch.max_new_tokens]
    assert timed == [("g", 0), ("g", 1), ("g", 2)]  # nothing re-run for "s"; one warm-up for "g" only
    assert len(calls) == 4
    for path in ("g", "s"):
        (tmp_path / f"{path}.jsonl").unlink()
    calls.clear()
    runs = {name: (method, RecordFile(tmp_path / f"{name}.jsonl", "k")) for name, (method, _) in runs.items()}
    done = run_methods(runs, batch, "both")
    timed = [(label, index) for label, index, new in calls if new == batch.max_new_tokens]
    assert timed == [("g", 0), ("s", 0), ("g", 1), ("s", 1), ("g", 2), ("s", 2)]
    assert [r["tokens"] for r in done["g"]] == [r["tokens"] for r in done["s"]]


@pytest.mark.parametrize("name", ["cnndm", "humaneval", "mbpp", "topv2"])
def test_registered_tasks_build_prompts(name):
    from exitbench.tasks.registry import build_task

    task = build_task(name)
    rows = {
        "cnndm": [{"id": str(i), "article": f"Article {i}.", "highlights": f"h{i}\nx"} for i in range(25)],
        "humaneval": [
            {
                "task_id": "H/0",
                "prompt": "def f():\n",
                "canonical_solution": "    return 1\n",
                "test": "def check(f):\n    assert f() == 1\n",
                "entry_point": "f",
            }
        ],
        "mbpp": [
            {
                "task_id": 11,
                "text": "Return 1.",
                "code": "def f():\n    return 1",
                "test_list": ["assert f() == 1"],
                "test_setup_code": "",
                "challenge_test_list": [],
            }
        ],
        "topv2": [{"domain": "alarm", "utterance": "wake me at 7", "semantic_parse": "[IN:CREATE_ALARM ]"}],
    }[name]
    shots = [{"id": f"s{i}", "article": f"Shot {i}.", "highlights": f"s{i}"} for i in range(3)]
    task.set_context({"mbpp": {"prompt": [dict(rows[0], task_id=2)]}, "cnndm": {"shots": shots}}.get(name, {}))
    samples = task.samples(rows, 1)
    assert samples[0].prompt
    if name == "cnndm":
        article = samples[0].row["article"]
        assert samples[0].prompt.endswith(f"Article: {article}\nSummary:")
        assert samples[0].prompt.startswith("Article: Shot ")  # the one-shot example comes from the shots split
    if name == "humaneval":
        assert task.score(samples[0], "\n    return 1\n")["pass@1"] == 1.0
        assert task.score(samples[0], "\n    return 2\n")["pass@1"] == 0.0
    if name == "topv2":
        assert task.score(samples[0], " [IN:CREATE_ALARM ] ")["exact_match"] == 1.0
        assert task.aggregate(samples, [{"exact_match": 1.0}])["per_domain"] == {"alarm": 1.0}


def test_task_draft_vocab_counts_the_train_split_only(tmp_path):
    from exitbench.subvocab import write_task_draft_vocab
    from exitbench.tasks.registry import build_task

    task = build_task("topv2")

    def tokenizer(text, add_special_tokens=False):
        return {"input_ids": [ord(char) for char in text]}

    assert write_task_draft_vocab(task, tmp_path, tokenizer, 4, [0], tmp_path / "v.json") is None  # no train split
    (tmp_path / "topv2").mkdir()
    row = {"domain": "alarm", "utterance": "aaa", "semantic_parse": "[IN:X ]"}
    (tmp_path / "topv2" / "train.jsonl").write_text(json.dumps(row) + "\n")
    path = write_task_draft_vocab(task, tmp_path, tokenizer, 1, [0], tmp_path / "v.json")
    assert json.loads(path.read_text()) == [0, ord("a")]  # the most frequent token, plus the stop token


def test_record_keys_name_the_weights_and_the_decoding_code(tmp_path):
    from exitbench.evaluation import _model_key
    from exitbench.identity import decoding_code_identity

    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"one")
    before = _model_key(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"two")  # retrained in the same folder: another model
    assert _model_key(tmp_path) != before
    code = decoding_code_identity()
    assert len(code) == 64 and code == decoding_code_identity()


def _evaluate_pipeline():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "pipelines" / "evaluate.py"
    spec = importlib.util.spec_from_file_location("evaluate_cli", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("exit_layer", [4, 40])
def test_exit_layer_past_the_model_fails_before_any_model_is_loaded(tmp_path, exit_layer):
    from exitbench.config import EvaluateConfig
    from exitbench.errors import ExitbenchError
    from exitbench.models.tiny import random_llama

    random_llama(seed=0).config.save_pretrained(tmp_path / "tiny")  # config only: loading weights would fail
    methods = {"autoregressive": {}, "self_speculative": {"exit_layer": 2, "num_speculations": 2},
               "early_exit": {"exit_layer": exit_layer}}
    evaluate = EvaluateConfig(models=["tiny"], methods=methods)
    with pytest.raises(ExitbenchError) as info:
        _evaluate_pipeline().check_method_exit_layers(evaluate, tmp_path)
    assert str(info.value) == (
        f"evaluate.methods.early_exit.exit_layer: exit layer {exit_layer} is outside 1..3 for this 4-layer model; "
        "set evaluate.methods.early_exit.exit_layer within 1..3"
    )
    calm = EvaluateConfig(models=["tiny"], methods={"calm": {"threshold": 0.5, "min_exit_layer": exit_layer}})
    with pytest.raises(ExitbenchError, match=r"^evaluate\.methods\.calm\.min_exit_layer: exit layer"):
        _evaluate_pipeline().check_method_exit_layers(calm, tmp_path)
    fits = EvaluateConfig(models=["tiny", "absent"], methods={"early_exit": {"exit_layer": 3}})
    _evaluate_pipeline().check_method_exit_layers(fits, tmp_path)  # an absent model is left to evaluate_all
