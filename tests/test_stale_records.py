"""Stored generations are reused only for the same prompt and reference (issue: stale records).

A tiny TOPv2 mirror, the tiny seeded model and a character tokenizer run the real evaluate code path
(:func:`evaluate_model_task`). Changing one prompt regenerates exactly that sample; a second mirror gives
what a run from empty records gives; switching a method's options back reuses the first options' records.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exitbench import evaluation
from exitbench.config import resolve
from exitbench.evaluation import EvalContext, evaluate_model_task
from exitbench.records import RecordFile


class CharTokenizer:
    """Character <-> token id (mod the tiny model's 128 words); what encode_prompt and decoding call."""

    eos_token_id = 2

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [1] + [3 + ord(c) % 120 for c in text]}

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(32 + i % 90) for i in ids if not (skip_special_tokens and i == self.eos_token_id))


def write_mirror(root: Path, utterances: list[str]) -> Path:
    rows = [{"domain": "alarm", "utterance": u, "semantic_parse": f"[IN:X {u} ]"} for u in utterances]
    (root / "topv2").mkdir(parents=True, exist_ok=True)
    (root / "topv2" / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def make_config(methods: dict | None = None):
    methods = methods or {"autoregressive": {}, "self_speculative": {"exit_layer": 2, "num_speculations": 2}}
    raw = {"evaluate": {"models": ["tiny"], "tasks": {"topv2": {"num_samples": 4, "max_new_tokens": 6}},
                        "methods": methods, "draft_vocab_size": 0}}
    return resolve(raw)


@pytest.fixture
def ctx(tiny_model):
    return EvalContext("tiny", tiny_model, CharTokenizer(), None, "tinykey", {"num_parameters": 1})


@pytest.fixture
def count_generations(monkeypatch):
    """Every timed generation (scored, or a reference re-run timed only), as (method class, prompt ids)."""
    made: list[tuple[str, tuple[int, ...]]] = []
    for name in ("_one_sample", "_timed_only"):
        original = getattr(evaluation, name)

        def spy(method, batch, index, original=original):
            made.append((type(method).__name__, tuple(batch.prompt_ids[index])))
            return original(method, batch, index)

        monkeypatch.setattr(evaluation, name, spy)
    return made


def test_changing_one_prompt_regenerates_exactly_that_sample(ctx, tmp_path, count_generations):
    cfg = make_config()
    first = write_mirror(tmp_path / "mirror_a", ["wake me at six", "set alarm", "show alarms", "stop alarm"])
    out = tmp_path / "eval"
    evaluate_model_task(cfg, ctx, "topv2", first, out)
    assert len(count_generations) == 3 * 4  # greedy; then greedy re-timed beside self-speculation, and it
    count_generations.clear()
    evaluate_model_task(cfg, ctx, "topv2", first, out)  # same data: everything reused
    assert count_generations == []
    second = write_mirror(tmp_path / "mirror_b", ["wake me at six", "set alarm", "delete my alarms", "stop alarm"])
    summaries = evaluate_model_task(cfg, ctx, "topv2", second, out)
    changed = tuple(ctx.tokenizer("delete my alarms\n")["input_ids"])
    assert sorted(count_generations) == [("Autoregressive", changed)] * 2 + [("SelfSpeculative", changed)]
    greedy_store = out / "autoregressive" / "tiny" / "topv2" / "autoregressive.jsonl"
    records = [json.loads(line) for line in greedy_store.read_text().splitlines()]
    assert len(records) == 5  # the old sample 2's record stays for when mirror A comes back
    count_generations.clear()
    fresh = evaluate_model_task(cfg, ctx, "topv2", second, tmp_path / "empty")
    assert len(count_generations) == 3 * 4
    for method in ("autoregressive", "self_speculative"):
        assert summaries[method]["quality"] == fresh[method]["quality"]
        assert summaries[method]["correctness"] == fresh[method]["correctness"]


def test_a_changed_reference_is_rescored_not_reused(ctx, tmp_path, count_generations):
    cfg = make_config({"autoregressive": {}})
    mirror = write_mirror(tmp_path / "m", ["a", "b", "c", "d"])
    out = tmp_path / "eval"
    evaluate_model_task(cfg, ctx, "topv2", mirror, out)
    rows = [json.loads(line) for line in (mirror / "topv2" / "test.jsonl").read_text().splitlines()]
    rows[1]["semantic_parse"] = "[IN:MENDED b ]"  # a fixed malformed row: same prompt, other reference
    (mirror / "topv2" / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    count_generations.clear()
    evaluate_model_task(cfg, ctx, "topv2", mirror, out)
    assert len(count_generations) == 1


def test_switching_options_back_reuses_the_first_options_records(ctx, tmp_path, count_generations):
    mirror = write_mirror(tmp_path / "m", ["a", "b", "c", "d"])
    out = tmp_path / "eval"
    spec = {"exit_layer": 2, "num_speculations": 2}
    evaluate_model_task(make_config({"autoregressive": {}, "self_speculative": spec}), ctx, "topv2", mirror, out)
    other = {"exit_layer": 1, "num_speculations": 3}
    count_generations.clear()
    evaluate_model_task(make_config({"autoregressive": {}, "self_speculative": other}), ctx, "topv2", mirror, out)
    # greedy's records are reused; it runs again beside each new generation, as that sample's paired reference
    assert [name for name, _ in count_generations] == ["Autoregressive", "SelfSpeculative"] * 4
    count_generations.clear()
    evaluate_model_task(make_config({"autoregressive": {}, "self_speculative": spec}), ctx, "topv2", mirror, out)
    assert count_generations == []


def test_records_of_the_old_index_keyed_layout_are_never_reused(tmp_path):
    path = tmp_path / "g.jsonl"
    path.write_text('{"key": "k"}\n{"index": 0, "tokens": [5], "scores": {}, "error": null}\n')
    records = RecordFile(path, "k")
    assert records.stored == {}
    assert path.read_text() == ""


def test_a_changed_draft_vocabulary_regenerates_the_drafting_records(ctx, tmp_path, count_generations, monkeypatch):
    """The draft vocabulary file keeps its name when its content changes (another trained set, another size):
    the records' settings hash its content, so the drafting method runs again and greedy's records stay."""
    cfg = make_config()
    mirror = write_mirror(tmp_path / "mirror", ["wake me at six", "set alarm", "show alarms", "stop alarm"])
    out = tmp_path / "eval"
    trained = {"ids": list(range(0, 128, 2))}
    monkeypatch.setattr(EvalContext, "trained_exit_vocab", lambda self, data_dir: trained["ids"])
    evaluate_model_task(cfg, ctx, "topv2", mirror, out)
    vocab_file = out / "self_speculative" / "tiny" / "topv2" / "draft_vocab.json"
    assert json.loads(vocab_file.read_text()) == sorted(set(trained["ids"]) | {ctx.tokenizer.eos_token_id})
    count_generations.clear()
    trained["ids"] = list(range(1, 128, 2))
    evaluate_model_task(cfg, ctx, "topv2", mirror, out)
    assert sorted({name for name, _ in count_generations}) == ["Autoregressive", "SelfSpeculative"]
    assert sum(name == "SelfSpeculative" for name, _ in count_generations) == 4  # greedy: re-timed beside it only
    count_generations.clear()
    evaluate_model_task(cfg, ctx, "topv2", mirror, out)
    assert count_generations == []
