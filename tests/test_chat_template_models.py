"""evaluate.chat_template_models: the named models' prompts go through their chat template, the others' do not;
the summary says which (issue 15: each model is evaluated with the prompt format that gives it its best score)."""

from __future__ import annotations

import pytest

from exitbench import config
from exitbench.data.prepare import prepare_data
from exitbench.decoding import REGISTRY, parse_options
from exitbench.errors import ExitbenchError
from exitbench.evaluation import EvalContext, evaluate_model_task
from exitbench.prompts import uses_chat_template
from exitbench.tasks.registry import TASKS
from tests.test_second_mirror import DOMAINS, CharTokenizer, generated, write_mirror  # noqa: F401


class ChatTokenizer(CharTokenizer):
    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=False):
        return "<|user|>" + messages[-1]["content"] + "<|assistant|>"


def test_only_the_named_models_prompts_use_the_chat_template(tiny_model, tmp_path, generated):  # noqa: F811
    data = tmp_path / "data"
    prepare_data(config.DataConfig(tasks=["topv2"], topv2_domains=DOMAINS), data, write_mirror(tmp_path / "m", "x", 1),
                 progress=False)
    raw = {"evaluate": {"models": ["base", "tiny"], "methods": {"autoregressive": {}}, "draft_vocab_size": 0,
                        "chat_template_models": {"base": ["topv2"]},
                        "tasks": {"topv2": {"num_samples": 2, "max_new_tokens": 3}}}}
    cfg = config.resolve(raw)
    assert uses_chat_template(cfg, "base", "topv2") and not uses_chat_template(cfg, "base", "cnndm")
    assert not uses_chat_template(cfg, "tiny", "topv2")
    ids, prompts = {}, {}
    for name in ("base", "tiny"):
        generated.clear()
        ctx = EvalContext(name, tiny_model, ChatTokenizer(), None, "tinykey", {"num_parameters": 1})
        summary = evaluate_model_task(cfg, ctx, "topv2", data, tmp_path / "eval")["autoregressive"]
        assert summary["chat_template"] is (name == "base")
        ids[name], prompts[name] = summary["sample_ids"], set(generated)
    assert ids["base"] == ids["tiny"]  # the same samples, only the prompt format differs
    marker = tuple(ChatTokenizer()("<|user|>")["input_ids"][1:])
    assert all(p[1:1 + len(marker)] == marker for p in prompts["base"])
    assert not any(p[1:1 + len(marker)] == marker for p in prompts["tiny"])


def test_a_model_not_evaluated_cannot_be_named():
    cfg = config.resolve({"evaluate": {"models": ["base"], "chat_template_models": {"plain": ["topv2"]}},
                          "train": {"variants": {"plain": {"recipe": "plain", "p_max": 0.0}}},
                          "calibrate": {"models": []}, "probe": {"models": ["base"]}, "bench": {"models": ["base"]},
                          "throughput": {"model": "base"}})
    with pytest.raises(ExitbenchError, match=r"evaluate\.chat_template_models: unknown model 'plain'"):
        config.check_references(cfg, "params.yaml", tasks=TASKS, methods=REGISTRY, parse_options=parse_options)


def test_a_task_not_evaluated_cannot_be_named():
    cfg = config.resolve({"evaluate": {"models": ["base"], "chat_template_models": {"base": ["xsum"]}},
                          "train": {"variants": {}}, "calibrate": {"models": []}, "probe": {"models": ["base"]},
                          "bench": {"models": ["base"]}, "throughput": {"model": "base"}})
    with pytest.raises(ExitbenchError, match=r"evaluate\.chat_template_models\.base: unknown task 'xsum'"):
        config.check_references(cfg, "params.yaml", tasks=TASKS, methods=REGISTRY, parse_options=parse_options)
