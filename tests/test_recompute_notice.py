"""Before evaluate recomputes stored results, it says so in one line: what changed, how many records, how long.

A fresh clone that trains its own weights (not bit-identical across CPU kernels) cannot reuse the committed
records; the tiny seeded model, saved and then perturbed, plays that clone here.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from exitbench import evaluation
from exitbench.evaluation import EvalContext, evaluate_model_task
from exitbench.identity import model_identity
from exitbench.models.view import EarlyExitModel
from exitbench.recompute_notice import OLDER_SUMMARY, changed_settings
from tests.test_stale_records import CharTokenizer, make_config, write_mirror

PROMPTS = ["wake me at six", "set alarm", "show alarms", "stop alarm"]


def context(model_dir: Path) -> EvalContext:
    model = EarlyExitModel(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval())
    return EvalContext("tiny", model, CharTokenizer(), None, model_identity(model_dir)[:16], {"num_parameters": 1})


def perturb_one_weight(model_dir: Path) -> None:
    """What a clone's own training gives: the same files, a few weights a little different."""
    path = model_dir / "model.safetensors"
    weights = load_file(path)
    name = next(key for key in sorted(weights) if key.endswith("mlp.down_proj.weight"))
    weights[name] = weights[name] + 1e-3
    save_file(weights, path, metadata={"format": "pt"})


def test_perturbed_weights_announce_the_recomputation_in_one_line_before_it_starts(
    tiny_lm, tmp_path, monkeypatch, capsys
):
    model_dir = tmp_path / "tiny"
    tiny_lm.save_pretrained(model_dir, safe_serialization=True)
    cfg = make_config()
    mirror = write_mirror(tmp_path / "mirror", PROMPTS)
    out = tmp_path / "eval"
    evaluate_model_task(cfg, context(model_dir), "topv2", mirror, out)
    assert "recomputed" not in capsys.readouterr().out  # a first run has nothing to announce

    evaluate_model_task(cfg, context(model_dir), "topv2", mirror, out)  # same weights: everything reused
    assert "recomputed" not in capsys.readouterr().out

    perturb_one_weight(model_dir)
    events: list[str] = []
    for name in ("_one_sample", "_timed_only"):
        original = getattr(evaluation, name)
        monkeypatch.setattr(evaluation, name, lambda *a, original=original: events.append("gen") or original(*a))
    announce = evaluation.announce_recompute
    monkeypatch.setattr(evaluation, "announce_recompute", lambda *a: events.append(f"notice {announce(*a)}"))
    evaluate_model_task(cfg, context(model_dir), "topv2", mirror, out)
    lines = [line for line in capsys.readouterr().out.splitlines() if "recomputed" in line]
    assert len(lines) == 2  # one per stage: greedy's, then self-speculation's
    greedy_line, spec_line = lines
    assert greedy_line.startswith("evaluate@autoregressive tiny/topv2: the weights differ")
    assert re.search(r"4 of 4 records \(autoregressive\) will be recomputed, about \d+ s at the stored", greedy_line)
    assert spec_line.startswith("evaluate@self_speculative tiny/topv2: the weights differ")
    assert "(self_speculative)" in spec_line
    assert events.index(f"notice {greedy_line}") == 0  # said before the stage generated anything
    assert events[events.index(f"notice {spec_line}") - 1] == "gen" and events[-1] == "gen"


def test_an_interrupted_run_resumes_without_a_notice(tiny_lm, tmp_path, capsys):
    model_dir = tmp_path / "tiny"
    tiny_lm.save_pretrained(model_dir, safe_serialization=True)
    cfg = make_config({"autoregressive": {}})
    mirror = write_mirror(tmp_path / "mirror", PROMPTS)
    out = tmp_path / "eval"
    evaluate_model_task(cfg, context(model_dir), "topv2", mirror, out)
    store = out / "autoregressive" / "tiny" / "topv2"
    (store / "autoregressive.json").unlink()  # killed before its summary was written
    lines = (store / "autoregressive.jsonl").read_text().splitlines()
    (store / "autoregressive.jsonl").write_text("\n".join(lines[:2]) + "\n")
    capsys.readouterr()
    evaluate_model_task(cfg, context(model_dir), "topv2", mirror, out)
    assert "recomputed" not in capsys.readouterr().out


def test_the_notice_names_each_changed_part_and_says_less_for_older_summaries():
    now = {"model": "b", "code": "c2", "dtype": "float32", "seed": 1}
    assert changed_settings({"settings": {"model": "a", "code": "c2", "dtype": "float32", "seed": 1}}, now) == [
        "the weights"
    ]
    before = {"settings": {"model": "a", "code": "c1", "dtype": "float32", "seed": 1}}
    assert changed_settings(before, now) == ["the weights", "the method's code"]
    assert changed_settings({"settings_key": "0123"}, now) == [OLDER_SUMMARY]  # written before summaries said


def test_summaries_state_the_settings_their_key_hashes(tiny_model, tmp_path):
    ctx = EvalContext("tiny", tiny_model, CharTokenizer(), None, "tinykey", {"num_parameters": 1})
    mirror = write_mirror(tmp_path / "m", PROMPTS)
    summary = evaluate_model_task(make_config({"autoregressive": {}}), ctx, "topv2", mirror, tmp_path / "eval")
    summary = summary["autoregressive"]
    assert summary["settings"]["model"] == "tinykey" and summary["settings"]["method"] == "autoregressive"
    stored = json.loads((tmp_path / "eval/autoregressive/tiny/topv2/autoregressive.json").read_text())
    assert stored["settings"] == summary["settings"]
