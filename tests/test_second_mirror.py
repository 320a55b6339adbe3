"""A second data mirror with the same layout but other rows is evaluated on its own rows (issue 16.4).

Two tiny TOPv2 mirrors go through the real ``prepare_data`` into separate data directories, then through the
real evaluate path (:func:`evaluate_model_task`, tiny seeded model, character tokenizer) into one results
directory. The second run's sample ids and prompts are the second mirror's, every one of its samples is
generated afresh (no record of the first mirror is reused, even where a row id recurs), and its summaries
are what a run from empty records gives.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exitbench import evaluation
from exitbench.config import DataConfig, resolve
from exitbench.data.prepare import prepare_data
from exitbench.evaluation import EvalContext, evaluate_model_task
from exitbench.tasks.registry import build_task

DOMAINS = ["alarm", "weather"]
HEADER = "domain\tutterance\tsemantic_parse"
METHODS = {"autoregressive": {}, "self_speculative": {"exit_layer": 2, "num_speculations": 2}}
NUM_SAMPLES = 4


class CharTokenizer:
    """Character <-> token id (mod the tiny model's 128 words)."""

    eos_token_id = 2

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [1] + [3 + ord(c) % 120 for c in text]}

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(32 + i % 90) for i in ids if not (skip_special_tokens and i == self.eos_token_id))


def write_mirror(root: Path, tag: str, rows_per_domain: int) -> Path:
    """``topv2/{domain}_{split}.tsv`` for every domain and split, utterances tagged with ``tag``."""
    (root / "topv2").mkdir(parents=True)
    for domain in DOMAINS:
        for split in ("train", "eval", "test"):
            lines = [HEADER] + [
                f"{domain}\t{tag} {domain} {split} {n}\t[IN:GET_{domain.upper()} {tag} {n} ]"
                for n in range(1, rows_per_domain + 1)
            ]
            (root / "topv2" / f"{domain}_{split}.tsv").write_text("".join(line + "\n" for line in lines))
    return root


def prepared(tmp_path: Path, tag: str, rows_per_domain: int) -> tuple[Path, dict[str, dict]]:
    """The prepared data directory of a new mirror, and its test rows by sample id."""
    mirror = write_mirror(tmp_path / f"mirror_{tag}", tag, rows_per_domain)
    data = tmp_path / f"data_{tag}"
    prepare_data(DataConfig(tasks=["topv2"], topv2_domains=DOMAINS), data, mirror, progress=False)
    rows = [json.loads(line) for line in (data / "topv2" / "test.jsonl").read_text().splitlines()]
    task = build_task("topv2")
    return data, {task.row_id(row): row for row in rows}


@pytest.fixture
def generated(monkeypatch):
    """Every timed generation's prompt token ids."""
    made: list[tuple[int, ...]] = []
    original = evaluation._one_sample

    def spy(method, batch, index):
        made.append(tuple(batch.prompt_ids[index]))
        return original(method, batch, index)

    monkeypatch.setattr(evaluation, "_one_sample", spy)
    return made


def comparable(summary: dict) -> dict:
    return {key: summary[key] for key in ("num_samples", "quality", "correctness", "sample_ids", "sample")}


def test_a_second_mirror_is_evaluated_on_its_own_rows(tiny_model, tmp_path, generated):
    cfg = resolve({"evaluate": {"models": ["tiny"], "methods": METHODS, "draft_vocab_size": 0,
                                "tasks": {"topv2": {"num_samples": NUM_SAMPLES, "max_new_tokens": 6}}}})  # fmt: skip
    ctx = EvalContext("tiny", tiny_model, CharTokenizer(), None, "tinykey", {"num_parameters": 1})
    out = tmp_path / "eval"
    data_a, rows_a = prepared(tmp_path, "first", rows_per_domain=2)
    data_b, rows_b = prepared(tmp_path, "second", rows_per_domain=5)
    first = evaluate_model_task(cfg, ctx, "topv2", data_a, out)
    assert set(first["autoregressive"]["sample_ids"]) == set(rows_a)  # all four rows of the first mirror

    generated.clear()
    second = evaluate_model_task(cfg, ctx, "topv2", data_b, out)
    ids = second["autoregressive"]["sample_ids"]
    assert len(ids) == NUM_SAMPLES and set(ids) <= set(rows_b)
    assert ids != first["autoregressive"]["sample_ids"]
    assert set(ids) & set(rows_a)  # an id that recurs ("weather-test-1") with other content: not reused either
    assert second["autoregressive"]["sample"]["strata"] == {"alarm": 2, "weather": 2}
    prompts = {tuple(ctx.tokenizer(rows_b[i]["utterance"] + "\n")["input_ids"]) for i in ids}
    assert set(generated) == prompts  # the second mirror's utterances, each generated afresh
    assert len(generated) == len(METHODS) * NUM_SAMPLES  # no record of the first mirror reused
    written = json.loads((out / "autoregressive" / "tiny" / "topv2" / "autoregressive.json").read_text())
    assert written["sample_ids"] == ids

    generated.clear()
    fresh = evaluate_model_task(cfg, ctx, "topv2", data_b, tmp_path / "empty")
    for method in METHODS:
        assert comparable(second[method]) == comparable(fresh[method])
