"""A method's stage times greedy again in its own rounds (evaluation.run_methods ``reference_decode``) and pairs
its speed-ups with those runs, never with greedy's stored times from another stage's process."""

from __future__ import annotations

import json

from exitbench.config import DataConfig, resolve
from exitbench.data.prepare import prepare_data
from exitbench.evaluation import EvalContext, evaluate_model_task
from tests.test_second_mirror import DOMAINS, CharTokenizer, write_mirror

SLOWER = 50.0  # the stored greedy times are made this much slower: an earlier run on a busier machine


def config(methods: dict):
    return resolve({"evaluate": {"models": ["tiny"], "methods": methods, "draft_vocab_size": 0,
                                 "tasks": {"topv2": {"num_samples": 4, "max_new_tokens": 8}}}})


def test_an_added_method_is_paired_with_a_fresh_greedy_run(tiny_model, tmp_path):
    data = tmp_path / "data"
    prepare_data(DataConfig(tasks=["topv2"], topv2_domains=DOMAINS), data, write_mirror(tmp_path / "m", "x", 2),
                 progress=False)
    ctx = EvalContext("tiny", tiny_model, CharTokenizer(), None, "tinykey", {"num_parameters": 1})
    out = tmp_path / "eval"
    first = evaluate_model_task(config({"autoregressive": {}}), ctx, "topv2", data, out)
    stored = out / "autoregressive" / "tiny" / "topv2" / "autoregressive.jsonl"
    records = [json.loads(line) for line in stored.read_text().splitlines()]
    for record in records:
        record["decode"]["wall_time_s"] *= SLOWER
    stored.write_text("".join(json.dumps(record) + "\n" for record in records))

    methods = {"autoregressive": {}, "early_exit": {"exit_layer": 3}}
    second = evaluate_model_task(config(methods), ctx, "topv2", data, out)
    assert stored.read_text().count("\n") == len(records)  # greedy's stored records were reused, not regenerated
    assert second["autoregressive"]["quality"] == first["autoregressive"]["quality"]
    added_store = out / "early_exit" / "tiny" / "topv2" / "early_exit.jsonl"
    added = [json.loads(line) for line in added_store.read_text().splitlines()]
    assert len(added) == 4 and all(r["reference_decode"]["num_tokens"] > 0 for r in added)
    speedup = second["early_exit"]["speed"]["speedup_vs_greedy"]
    interval = second["early_exit"]["intervals"]["speedup_vs_greedy"]
    # 3 of 4 layers: about 4/3 faster than a fresh greedy run; against the stored times it would be ~SLOWER x that
    assert 0.5 < speedup < 5 and interval["high"] < 5, (speedup, interval)


def test_reference_samples_and_method_samples_bound_the_rounds(tiny_model, tmp_path):
    """``reference_samples`` re-times greedy on a prefix of the timing sample only (speed-ups pair over it, the
    rest still checks exactness); ``method_samples`` holds a method to a prefix of the quality sample."""
    data = tmp_path / "data"
    prepare_data(DataConfig(tasks=["topv2"], topv2_domains=DOMAINS), data, write_mirror(tmp_path / "m", "x", 3),
                 progress=False)
    ctx = EvalContext("tiny", tiny_model, CharTokenizer(), None, "tinykey", {"num_parameters": 1})
    methods = {"autoregressive": {}, "early_exit": {"exit_layer": 3},
               "self_speculative": {"exit_layer": 2, "num_speculations": 1}}
    cfg = resolve({"evaluate": {"models": ["tiny"], "methods": methods, "draft_vocab_size": 0,
                                "method_samples": {"early_exit": 3},
                                "tasks": {"topv2": {"num_samples": 6, "timing_samples": 4, "reference_samples": 2,
                                                    "max_new_tokens": 8}}}})
    out = tmp_path / "eval"
    summaries = evaluate_model_task(cfg, ctx, "topv2", data, out)
    for label, runs, paired in (("self_speculative", 4, 2), ("early_exit", 3, 2)):
        store = out / label / "tiny" / "topv2" / f"{label}.jsonl"
        records = [json.loads(line) for line in store.read_text().splitlines()]
        assert len(records) == runs
        assert [r["reference_decode"] is not None for r in records] == [True] * paired + [False] * (runs - paired)
        assert summaries[label]["num_samples"] == runs and summaries[label]["speed"]["num_timed"] == paired
    assert summaries["self_speculative"]["correctness"]["num_compared"] == 4
    assert summaries["autoregressive"]["num_samples"] == 6


def test_greedy_cannot_be_held_to_fewer_samples():
    import pytest

    from exitbench.config import check_references
    from exitbench.decoding import REGISTRY, parse_options
    from exitbench.errors import ExitbenchError
    from exitbench.tasks.registry import TASKS

    for held, message in (("autoregressive", "method_samples: 'autoregressive'"),
                          ("nope", "'nope' is not in evaluate.methods")):
        cfg = resolve({"train": {"variants": {"layerskip": {}, "calm": {"recipe": "calm", "p_max": 0.0}}},
                       "evaluate": {"method_samples": {held: 3}}})
        with pytest.raises(ExitbenchError, match=message):
            check_references(cfg, "params.yaml", list(TASKS), list(REGISTRY), parse_options)
