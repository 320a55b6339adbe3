"""Peers inside transformers timed against transformers' own greedy decoding, the kernel-isolating greedy
(F.linear projections), and methods restricted to some models (evaluate.method_models)."""

from __future__ import annotations

import pytest
import torch

from exitbench.config import resolve
from exitbench.decoding import build_method
from exitbench.errors import ExitbenchError
from exitbench.evaluation import EvalContext, evaluate_model_task
from exitbench.models.view import project
from exitbench.stage_plan import runs_on
from tests.test_second_mirror import CharTokenizer, prepared

PROMPTS = [[5, 9, 14, 3, 9, 14], [7, 7, 21, 40, 2, 19, 33, 8]]


def test_hf_greedy_and_linear_greedy_equal_greedy(tiny_model):
    reference = [build_method("autoregressive", tiny_model).generate(p, 16).tokens for p in PROMPTS]
    for name, options in [("hf_greedy", {}), ("autoregressive", {"projection": "linear"})]:
        method = build_method(name, tiny_model, options)
        assert [method.generate(p, 16).tokens for p in PROMPTS] == reference
    assert build_method("hf_greedy", tiny_model).framework == "transformers"
    assert build_method("autoregressive", tiny_model).framework == "exitbench"


def test_linear_projection_option_bypasses_the_transposed_form_and_restores_it(tiny_model, monkeypatch):
    from exitbench.models import view

    forms: list[int] = []

    def spy(x, weight, bias=None, skinny_rows=0):
        forms.append(skinny_rows)
        return project(x, weight, bias, skinny_rows)

    monkeypatch.setattr(view, "project", spy)
    monkeypatch.setattr(tiny_model, "skinny_rows", 4)  # as on a machine where W @ x.T was measured faster
    build_method("autoregressive", tiny_model, {"projection": "linear"}).generate(PROMPTS[0], 4)
    assert forms and set(forms) == {0}
    assert tiny_model.skinny_rows == 4
    forms.clear()
    build_method("autoregressive", tiny_model).generate(PROMPTS[0], 4)
    assert set(forms) == {4}


def test_a_transformers_peer_gets_its_speedup_against_its_own_greedy(tiny_model, tmp_path):
    methods = {"autoregressive": {}, "hf_greedy": {}, "hf_prompt_lookup": {"ngram_size": 2, "num_speculations": 3},
               "prompt_lookup": {"ngram_size": 2, "num_speculations": 3}}
    tasks = {"topv2": {"num_samples": 6, "timing_samples": 4, "max_new_tokens": 6}}
    cfg = resolve({"evaluate": {"models": ["tiny"], "methods": methods, "draft_vocab_size": 0, "tasks": tasks}})
    ctx = EvalContext("tiny", tiny_model, CharTokenizer(), None, "tinykey", {"num_parameters": 1})
    data, _ = prepared(tmp_path, "only", rows_per_domain=4)
    summaries = evaluate_model_task(cfg, ctx, "topv2", data, tmp_path / "eval")
    peer = summaries["hf_prompt_lookup"]
    ratio = peer["speed"]["speedup_vs_framework_greedy"]
    assert ratio is not None and ratio > 0 and peer["framework_greedy"] == "hf_greedy"
    interval = peer["intervals"]["speedup_vs_framework_greedy"]
    assert interval["low"] <= ratio <= interval["high"] and interval["n"] == 4
    for name in ("autoregressive", "prompt_lookup", "hf_greedy"):  # exitbench's own methods, and the baseline
        assert "speedup_vs_framework_greedy" not in summaries[name]["speed"]
    for summary in summaries.values():
        assert summary["correctness"].get("num_mismatched", 0) == 0


def test_method_models_restricts_a_method_to_some_models():
    raw = {
        "evaluate": {
            "models": ["base", "layerskip"],
            "methods": {"autoregressive": {}, "hf_greedy": {}, "prompt_lookup": {}},
            "method_models": {"hf_greedy": ["layerskip"]},
        }
    }
    cfg = resolve(raw)
    assert runs_on(cfg, "hf_greedy", "layerskip", "topv2") and not runs_on(cfg, "hf_greedy", "base", "topv2")
    assert runs_on(cfg, "prompt_lookup", "base", "topv2")


@pytest.mark.parametrize(
    ("method_models", "message"),
    [
        ({"hf_gredy": ["layerskip"]}, "evaluate.method_models: 'hf_gredy' is not in evaluate.methods"),
        ({"hf_greedy": ["calm"]}, "evaluate.method_models.hf_greedy: unknown model 'calm'; in evaluate.models"),
    ],
)
def test_method_models_bad_names_are_one_line_errors(method_models, message):
    from exitbench.config import check_references
    from exitbench.decoding import REGISTRY, parse_options
    from exitbench.tasks.registry import TASKS

    raw = {
        "train": {"variants": {"layerskip": {}, "calm": {"recipe": "calm", "p_max": 0.0}}},
        "evaluate": {
            "models": ["base", "layerskip"],
            "methods": {"autoregressive": {}, "hf_greedy": {}},
            "method_models": method_models,
        },
    }
    with pytest.raises(ExitbenchError, match=message):
        check_references(resolve(raw), "params.yaml", list(TASKS), list(REGISTRY), parse_options)


def test_linear_and_transposed_projections_agree():
    weight = torch.randn(12, 8, generator=torch.Generator().manual_seed(0))
    x = torch.randn(1, 2, 8, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(project(x, weight, skinny_rows=4), project(x, weight, skinny_rows=0))
