"""The calibrate stage on the tiny model with in-memory tasks (no files), and its input checks."""

from __future__ import annotations

import json

import pytest
import torch

from exitbench import calm_calibration
from exitbench.calm_calibration import (
    SPEEDUP_MEASURES,
    CalibrationTask,
    Generation,
    GenerationStore,
    calibrate_model,
    calibration_samples,
    check_thresholds,
    model_dir_or_error,
    model_identity,
    own_greedy_sequences,
    remove_stale_reports,
    run_calibrate_stage,
    speedup,
    textual_risk,
    time_per_token_ms,
    token_mismatch_risk,
)
from exitbench.config import CalibrateConfig, Config
from exitbench.decoding import build_method
from exitbench.decoding.autoregressive import Autoregressive
from exitbench.decoding.base import DecodingMethod
from exitbench.decoding.calm import Calm
from exitbench.errors import ExitbenchError
from exitbench.tasks.registry import build_task


def decode(ids) -> str:
    return " ".join(f"w{i}" for i in ids)


def tiny_task(name: str, num_calibration: int, num_test: int, seed: int = 3) -> CalibrationTask:
    gen = torch.Generator().manual_seed(seed)

    def make(n: int) -> list[list[int]]:
        lengths = torch.randint(4, 12, (n,), generator=gen).tolist()
        return [torch.randint(3, 128, (k,), generator=gen).tolist() for k in lengths]

    return CalibrationTask(
        name=name, calibration=make(num_calibration), test=make(num_test), decode=decode,
        score=lambda index, text: float(len(text) > 0), quality_metric="nonempty",
    )


SETTINGS = CalibrateConfig(
    models=["tiny"], tasks=["a", "b"], measures=["softmax", "state"], kv_strategies=["propagate", "recompute"],
    deltas=[0.3, 0.6], epsilon=0.05, thresholds=[1.0, 0.6, 0.2, 0.0], min_exit_layer=1, exit_every=1,
    num_calibration=8, num_test=3, max_new_tokens=8,
)


def counting_calls(monkeypatch) -> dict[str, int]:
    """Count prefills, decodes from a shared prefill (per method) and generations with their own prefill."""
    calls: dict[str, int] = {}

    def counted(name: str, function):
        def wrapper(*args, **kwargs):
            calls[name] = calls.get(name, 0) + 1
            return function(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(calm_calibration, "prefill_prompt", counted("prefill", calm_calibration.prefill_prompt))
    monkeypatch.setattr(DecodingMethod, "generate", counted("generate", DecodingMethod.generate))
    for cls in (Autoregressive, Calm):
        monkeypatch.setattr(cls, "generate_from_prefill", counted(cls.name, cls.generate_from_prefill))
    return calls


@pytest.fixture(scope="module")
def report_and_calls(tiny_model):
    with pytest.MonkeyPatch.context() as monkeypatch:
        calls = counting_calls(monkeypatch)
        tasks = [tiny_task("a", 8, 3, seed=3), tiny_task("b", 8, 3, seed=4)]
        report = calibrate_model(tiny_model, tasks, SETTINGS)
    return report, calls


def test_report_structure(report_and_calls):
    report, _ = report_and_calls
    assert set(report) == {"num_layers", "risk", "risk_definition", "speedup_measures", "results", "curves",
                           "greedy_time_per_token_ms", "prefill_time_ms", "generations"}
    assert report["speedup_measures"] == SPEEDUP_MEASURES and "prefill excluded" in SPEEDUP_MEASURES
    assert report["num_layers"] == 4 and report["risk"] == "textual"
    results, curves = report["results"], report["curves"]
    assert len(results) == 2 * 2 * 2 * 2  # tasks x measures x kv_strategies x deltas
    assert len(curves) == 2 * 2 * 2
    keys = {
        "task", "measure", "kv_strategy", "delta", "epsilon", "threshold", "threshold_index", "certified", "pvalue",
        "best_possible_pvalue", "min_num_calibration",
        "calibration_mean_risk", "test_risk", "risk_ok", "avg_exit_layer", "speedup_vs_greedy", "quality",
        "time_per_token_ms", "greedy_time_per_token_ms", "num_calibration", "num_test",
    }
    for row in results:
        assert set(row) == keys
        assert row["threshold"] in [*SETTINGS.thresholds, 1.0]
        assert 0.0 <= row["test_risk"] <= 1.0 and row["risk_ok"] == (row["test_risk"] <= row["delta"])
        assert row["speedup_vs_greedy"] > 0 and 1.0 <= row["avg_exit_layer"] <= 4.0
        assert row["quality"] == {"metric": "nonempty", "calm": 1.0, "greedy": 1.0}
        if row["certified"]:
            assert row["best_possible_pvalue"] <= row["pvalue"] <= SETTINGS.epsilon
            assert SETTINGS.thresholds[row["threshold_index"]] == row["threshold"]
        else:
            assert row["threshold"] == 1.0 and row["pvalue"] is None and row["test_risk"] == 0.0
    for curve in curves:
        assert curve["thresholds"] == SETTINGS.thresholds
        for key in ("calibration_mean_risk", "avg_exit_layer", "speedup_vs_greedy", "time_per_token_ms"):
            assert len(curve[key]) == len(SETTINGS.thresholds)
        assert set(curve["pvalues"]) == {"0.3", "0.6"}
        assert curve["calibration_mean_risk"][0] == 0.0  # lambda = 1 is the full model
        assert curve["avg_exit_layer"][0] == 4.0
        assert curve["avg_exit_layer"][-1] < 4.0  # threshold 0 exits early
    assert set(report["greedy_time_per_token_ms"]) == {"a", "b"} == set(report["prefill_time_ms"])
    assert all(ms > 0 for splits in report["prefill_time_ms"].values() for ms in splits.values())
    assert report["generations"]["reused"] == 0


def test_a_larger_delta_never_picks_a_more_conservative_threshold(report_and_calls):
    report, _ = report_and_calls
    by_setting: dict[tuple, dict[float, float]] = {}
    for row in report["results"]:
        by_setting.setdefault((row["task"], row["measure"], row["kv_strategy"]), {})[row["delta"]] = row["threshold"]
    assert all(chosen[0.6] <= chosen[0.3] for chosen in by_setting.values())
    assert any(row["certified"] for row in report["results"]), "nothing was certified: the check exercised nothing"


def test_each_generation_is_made_once_from_one_prefill_per_prompt(report_and_calls):
    report, calls = report_and_calls
    tasks, settings, warmup = 2, 2 * 2, 1  # settings: measures x kv_strategies
    assert calls["prefill"] == tasks * (8 + 3)  # one shared prefill per prompt
    assert "generate" not in calls  # no generation ran a prefill of its own
    # greedy: once per calibration and test example (+ an untimed warm-up per task)
    assert calls["autoregressive"] == tasks * (8 + 3 + warmup)
    # calm: once per (calibration example, setting, threshold); on test once per distinct chosen threshold
    chosen = {(r["task"], r["measure"], r["kv_strategy"], r["threshold"]) for r in report["results"]}
    expected = tasks * (settings * warmup + 8 * settings * len(SETTINGS.thresholds)) + 3 * len(chosen)
    assert calls["calm"] == expected
    assert report["generations"]["made"] == calls["autoregressive"] + calls["calm"] - tasks * (1 + settings)


def test_timing_is_per_decoded_token_without_prefill():
    def gen(tokens: int, decode_s: float) -> Generation:
        return Generation(list(range(tokens)), "", decode_s, prefill_time_s=5.0)

    greedy, calm = [gen(5, 0.4), gen(3, 0.2)], [gen(5, 0.1), gen(1, 0.0)]
    assert time_per_token_ms(greedy) == pytest.approx(1000 * 0.6 / 6)  # 4 + 2 decoded tokens
    assert time_per_token_ms(calm) == pytest.approx(1000 * 0.1 / 4)
    assert speedup(greedy, calm) == pytest.approx(4.0)
    assert time_per_token_ms([gen(1, 0.0)]) is None and speedup(greedy, [gen(1, 0.0)]) is None


# ------------------------------------------------------------------------------------------ resuming

SMALL = SETTINGS.model_copy(update={"measures": ["softmax"], "thresholds": [1.0, 0.2, 0.0], "deltas": [0.5],
                                    "num_calibration": 4, "num_test": 2})
TIMINGS = {"speedup_vs_greedy", "time_per_token_ms", "greedy_time_per_token_ms"}


def without_timings(report: dict) -> dict:
    """The report minus everything measured in seconds (which a fresh generation measures anew)."""
    drop = lambda row: {k: v for k, v in row.items() if k not in TIMINGS}  # noqa: E731
    return {"results": [drop(r) for r in report["results"]], "curves": [drop(c) for c in report["curves"]]}


class Killed(Exception):
    pass


def test_a_rerun_reuses_every_stored_generation(tiny_model, tmp_path):
    path = tmp_path / "tiny" / "generations.jsonl"
    first = calibrate_model(tiny_model, [tiny_task("a", 4, 2)], SMALL, store=GenerationStore(path, {"model": "x"}))
    made = first["generations"]["made"]
    assert made == len(path.read_text().splitlines()) > 0 and first["generations"]["reused"] == 0
    again = calibrate_model(tiny_model, [tiny_task("a", 4, 2)], SMALL, store=GenerationStore(path, {"model": "x"}))
    assert again["generations"] == {"made": 0, "reused": made}
    same = lambda report: {k: v for k, v in report.items() if k != "generations"}  # noqa: E731
    assert same(again) == same(first)  # timings included: they are stored
    # Another model (context) or budget shares nothing.
    other = calibrate_model(tiny_model, [tiny_task("a", 4, 2)], SMALL, store=GenerationStore(path, {"model": "y"}))
    assert other["generations"] == {"made": made, "reused": 0}
    longer = SMALL.model_copy(update={"max_new_tokens": 9})
    assert calibrate_model(tiny_model, [tiny_task("a", 4, 2)], longer,
                           store=GenerationStore(path, {"model": "x"}))["generations"]["reused"] == 0


def test_a_changed_prompt_regenerates_only_that_prompt(tiny_model, tmp_path):
    """The calibrate store is keyed by the prompt's token ids, not its index: another mirror's row 1 is made
    anew (greedy and every calm setting), the unchanged rows are reused."""
    path = tmp_path / "tiny" / "generations.jsonl"
    task = tiny_task("a", 4, 2)
    first = calibrate_model(tiny_model, [task], SMALL, store=GenerationStore(path, {"model": "x"}))
    per_prompt = 1 + len(SMALL.measures) * len(SMALL.kv_strategies) * len(SMALL.thresholds)  # greedy + calm
    task.calibration[1] = [7, 8, 9, 10, 11]
    again = calibrate_model(tiny_model, [task], SMALL, store=GenerationStore(path, {"model": "x"}))
    assert again["generations"]["made"] == per_prompt
    assert again["generations"]["reused"] == first["generations"]["made"] - per_prompt


def test_a_killed_run_resumes_where_it_stopped(tiny_model, tmp_path, monkeypatch):
    reference = calibrate_model(tiny_model, [tiny_task("a", 4, 2)], SMALL)
    total = reference["generations"]["made"]
    path = tmp_path / "generations.jsonl"
    put = GenerationStore.put

    def dies_after(limit: int):
        def put_then_maybe_die(self, key, fields, generation):
            put(self, key, fields, generation)
            if self.made == limit:
                raise Killed
        return put_then_maybe_die

    monkeypatch.setattr(GenerationStore, "put", dies_after(7))
    with pytest.raises(Killed):
        calibrate_model(tiny_model, [tiny_task("a", 4, 2)], SMALL, store=GenerationStore(path))
    with path.open("a") as handle:
        handle.write('{"key": "torn", "generation": {"tok')  # killed in the middle of a line
    monkeypatch.setattr(GenerationStore, "put", put)
    resumed = calibrate_model(tiny_model, [tiny_task("a", 4, 2)], SMALL, store=GenerationStore(path))
    assert resumed["generations"] == {"made": total - 7, "reused": 7}
    assert without_timings(resumed) == without_timings(reference)
    lines = path.read_text().splitlines()
    assert len(lines) == total and all(json.loads(line)["key"] != "torn" for line in lines)
    assert json.loads(lines[0])["fields"]["task"] == "a" and "decode_time_s" in json.loads(lines[0])["generation"]


def test_model_identity_names_weights_and_config(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"weights")
    before = model_identity(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"retrained")
    assert model_identity(tmp_path) != before
    (tmp_path / "model_info.json").write_text('{"saved_sha256": "abc"}')  # records the weights' hash itself
    with_info = model_identity(tmp_path)
    (tmp_path / "config.json").write_text('{"changed": true}')
    assert model_identity(tmp_path) == with_info != before
    (tmp_path / "model_info.json").write_text('{"saved_sha256": "def"}')
    assert model_identity(tmp_path) != with_info


def test_token_risk_option(tiny_model):
    settings = SETTINGS.model_copy(update={"risk": "risk", "measures": ["softmax"], "kv_strategies": ["propagate"],
                                           "num_calibration": 2, "num_test": 1, "deltas": [0.5]})
    report = calibrate_model(tiny_model, [tiny_task("a", 2, 1)], settings)
    assert report["risk_definition"].startswith("fraction of token positions")
    assert len(report["results"]) == 1


def test_risk_functions():
    assert textual_risk("the cat sat", "the cat sat") == 0.0
    assert textual_risk("the cat sat", "a dog ran") == 1.0
    assert textual_risk("the cat sat", "the cat") == pytest.approx(1 - 0.8)  # LCS 2: P 2/3, R 1, F 0.8
    assert token_mismatch_risk([1, 2, 3], [1, 2, 3]) == 0.0
    assert token_mismatch_risk([1, 2, 3], [1, 5, 3, 4]) == pytest.approx(0.5)
    assert token_mismatch_risk([], []) == 0.0


def test_malformed_inputs_are_one_line_errors(tiny_model):
    good = tiny_task("a", 2, 1)
    empty = CalibrationTask(name="bad", calibration=[], test=good.test, decode=decode)
    with pytest.raises(ExitbenchError, match="task 'bad' has no calibration prompts"):
        calibrate_model(tiny_model, [empty], SETTINGS)
    junk = CalibrationTask(name="bad", calibration=[["x"]], test=good.test, decode=decode)
    with pytest.raises(ExitbenchError, match="not a non-empty list of token ids"):
        calibrate_model(tiny_model, [junk], SETTINGS)
    with pytest.raises(ExitbenchError, match="strictly decrease"):
        calibrate_model(tiny_model, [good], SETTINGS.model_copy(update={"thresholds": [0.5, 0.9]}))
    with pytest.raises(ExitbenchError, match=r"within \[0, 1\]"):
        check_thresholds([2.0, 0.5])
    with pytest.raises(ExitbenchError, match="needs a trained classifier file"):
        calibrate_model(tiny_model, [good], SETTINGS.model_copy(update={"measures": ["classifier"]}))
    with pytest.raises(ExitbenchError, match="no tasks"):
        calibrate_model(tiny_model, [], SETTINGS)


@pytest.mark.parametrize("min_exit_layer", [4, 40])
def test_min_exit_layer_past_the_model_is_an_error_before_any_generation(tiny_model, min_exit_layer):
    settings = SETTINGS.model_copy(update={"min_exit_layer": min_exit_layer})
    with pytest.raises(ExitbenchError) as info:
        calibrate_model(tiny_model, [tiny_task("a", 2, 1)], settings)
    assert str(info.value) == (
        f"calibrate.min_exit_layer: exit layer {min_exit_layer} is outside 1..3 for this 4-layer model; "
        "set calibrate.min_exit_layer within 1..3"
    )


# --------------------------------------------------------------------------------- splits and files


def topv2_rows(n: int, tag: str) -> list[dict]:
    return [{"domain": "alarm", "utterance": f"{tag} {i}", "semantic_parse": f"[IN:X {i} ]"} for i in range(n)]


def cnndm_rows(n: int) -> list[dict]:
    return [{"id": f"r{i}", "article": f"article {i}", "highlights": f"summary {i}"} for i in range(n)]


def test_calibration_and_test_rows_are_disjoint():
    topv2 = build_task("topv2")
    cal, test = calibration_samples(topv2, {"eval": topv2_rows(5, "eval"), "test": topv2_rows(5, "test")}, 3, 2)
    assert len(cal) == 3 and all(s.prompt.startswith("eval ") for s in cal)
    assert [s.prompt for s in test] == [s.prompt for s in build_task("topv2").samples(topv2_rows(5, "test"), 2)]

    cnndm = build_task("cnndm")
    rows = cnndm_rows(40)
    shots = [{"id": f"s{i}", "article": f"shot {i}", "highlights": f"s {i}"} for i in range(20)]
    cal, test = calibration_samples(cnndm, {"test": rows, "shots": shots}, 4, 3)
    evaluated = build_task("cnndm")
    evaluated.set_context({"shots": shots})
    assert [s.prompt for s in evaluated.samples(rows, 3)] == [s.prompt for s in test]  # evaluate's first rows
    assert len(cal) == 4 and not {s.sample_id for s in cal} & {s.sample_id for s in test}
    with pytest.raises(ExitbenchError, match="needs 10 rows of test"):
        calibration_samples(build_task("cnndm"), {"test": cnndm_rows(9), "shots": shots}, 5, 5)


def test_missing_model_names_the_stage_that_makes_it(tmp_path):
    with pytest.raises(ExitbenchError, match="dvc repro prepare_model"):
        model_dir_or_error(tmp_path, "base")
    with pytest.raises(ExitbenchError, match="dvc repro train"):
        model_dir_or_error(tmp_path, "layerskip")
    cfg = Config(profile="cpu", calibrate=CalibrateConfig(models=["base"]))
    with pytest.raises(ExitbenchError, match="model 'base' not found"):
        run_calibrate_stage(
            cfg, tmp_path / "models", tmp_path / "data", tmp_path / "out", tmp_path / "clf", tmp_path / "gen"
        )


def test_reports_of_models_no_longer_calibrated_are_removed(tmp_path):
    for name in ("base", "layerskip", "calm"):
        (tmp_path / f"{name}.json").write_text("{}")
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "generations.jsonl").write_text("")
    assert remove_stale_reports(tmp_path, ["layerskip"]) == [tmp_path / "base.json", tmp_path / "calm.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base", "layerskip.json"]  # generations are kept


def test_classifier_sequences_are_the_models_own_greedy_outputs(tiny_model):
    prompts = tiny_task("a", 3, 1).calibration
    sequences = own_greedy_sequences(tiny_model, prompts, 6)
    greedy = build_method("autoregressive", tiny_model)
    for prompt, sequence in zip(prompts, sequences, strict=True):
        assert sequence == prompt + greedy.generate(prompt, 6).tokens
