"""Sharded evaluation (issue 18.3): ranks generate their slice of the samples, rank 0 merges, and the summaries
equal one process's. The ranks run one after another in this process (the barrier is a no-op here; under
torchrun it is a gloo barrier, pipelines/evaluate.py), so the test is about the slicing and the merge."""

from __future__ import annotations

import json
from pathlib import Path

from exitbench.config import DataConfig, resolve
from exitbench.data.prepare import prepare_data
from exitbench.evaluation import EvalContext, evaluate_model_task
from exitbench.records import Shard
from tests.test_second_mirror import DOMAINS, CharTokenizer, comparable, write_mirror

METHODS = {"autoregressive": {}, "self_speculative": {"exit_layer": 2, "num_speculations": 2},
           "early_exit": {"exit_layer": 2}}


def test_two_shards_merge_into_the_single_process_summary(tiny_model, tmp_path):
    cfg = resolve({"evaluate": {"models": ["tiny"], "methods": METHODS, "draft_vocab_size": 0,
                                "tasks": {"topv2": {"num_samples": 6, "timing_samples": 5, "max_new_tokens": 6}}}})
    ctx = EvalContext("tiny", tiny_model, CharTokenizer(), None, "tinykey", {"num_parameters": 1})
    data = tmp_path / "data"
    prepare_data(DataConfig(tasks=["topv2"], topv2_domains=DOMAINS), data, write_mirror(tmp_path / "m", "x", 4),
                 progress=False)
    whole = evaluate_model_task(cfg, ctx, "topv2", data, tmp_path / "one")

    out = tmp_path / "sharded"
    met: list[int] = []
    assert evaluate_model_task(cfg, ctx, "topv2", data, out, Shard(1, 2, barrier=lambda: met.append(1))) == {}
    def where(method: str, root: Path = out) -> Path:
        return root / method / "tiny" / "topv2"

    part = where("autoregressive") / "autoregressive.rank1-of-2.jsonl"
    indices = sorted(json.loads(line)["index"] for line in part.read_text().splitlines())
    assert indices == [1, 3, 5] and not (where("autoregressive") / "autoregressive.json").exists()
    timed = where("self_speculative") / "self_speculative.rank1-of-2.jsonl"
    assert sorted(json.loads(line)["index"] for line in timed.read_text().splitlines()) == [1, 3]  # 5 timing samples

    merged = evaluate_model_task(cfg, ctx, "topv2", data, out, Shard(0, 2, barrier=lambda: met.append(0)))
    assert met == [1] * len(METHODS) + [0] * len(METHODS)  # one barrier per method stage
    assert not list(out.glob("*/tiny/topv2/*.rank*"))  # merged into <method>.jsonl
    for method in METHODS:
        assert comparable(merged[method]) == comparable(whole[method])
        mine = [r["tokens"] for r in map(json.loads, (where(method) / f"{method}.jsonl").read_text().splitlines())]
        theirs = [r["tokens"] for r in map(json.loads, (where(method, tmp_path / "one") / f"{method}.jsonl")
                                           .read_text().splitlines())]
        assert sorted(map(tuple, mine)) == sorted(map(tuple, theirs))
    assert merged["self_speculative"]["correctness"]["num_compared"] == 5
