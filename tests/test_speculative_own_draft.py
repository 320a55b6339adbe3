"""Two-model speculative decoding whose draft is a standalone copy of the evaluated model's first E layers
(``draft_layers``): exact, drafting what self-speculation at E drafts, with its extra memory reported."""

from __future__ import annotations

import json

import pytest
import torch

from exitbench.decoding import build_method
from exitbench.decoding.speculative import own_layers_draft
from exitbench.errors import ExitbenchError
from tests.decoding_helpers import greedy_tokens, prompts

MAX_NEW = 20


@pytest.fixture(scope="module")
def greedy_outputs(tiny_model):
    return greedy_tokens(tiny_model, MAX_NEW)


@pytest.mark.parametrize("draft_layers", [1, 2, 3])
@pytest.mark.parametrize("num_speculations", [1, 2, 4])
def test_own_layers_draft_is_exact_and_drafts_what_self_speculation_drafts(
    tiny_model, greedy_outputs, draft_layers, num_speculations
):
    options = {"num_speculations": num_speculations}
    two_model = build_method("speculative", tiny_model, {**options, "draft_layers": draft_layers})
    self_spec = build_method("self_speculative", tiny_model, {**options, "exit_layer": draft_layers})
    for prompt, expected in zip(prompts(), greedy_outputs, strict=True):
        ours, theirs = two_model.generate(prompt, MAX_NEW), self_spec.generate(prompt, MAX_NEW)
        assert ours.tokens == expected
        # the same layers and head propose the same tokens: the acceptance is self-speculation's, round by round
        assert ours.acceptance_histogram == theirs.acceptance_histogram
        assert (ours.num_drafted, ours.num_accepted) == (theirs.num_drafted, theirs.num_accepted)


def test_own_layers_draft_owns_its_weights_and_reports_them(tiny_model):
    draft = own_layers_draft(tiny_model, 2)
    assert draft.num_layers == 2 and tiny_model.num_layers == 4
    assert draft.layers[0].self_attn.q_proj.weight.data_ptr() != tiny_model.layers[0].self_attn.q_proj.weight.data_ptr()
    assert draft.lm_head.weight is draft.embed_tokens.weight  # the tiny model's tied head stays tied in the copy
    assert torch.equal(draft.layers[1].mlp.up_proj.weight, tiny_model.layers[1].mlp.up_proj.weight)
    layer_params = sum(p.numel() for p in tiny_model.layers[0].parameters())
    embed_params = tiny_model.embed_tokens.weight.numel()
    norm_params = tiny_model.norm.weight.numel()
    assert draft.num_parameters == 2 * layer_params + embed_params + norm_params

    memory = build_method("speculative", tiny_model, {"num_speculations": 2, "draft_layers": 2}).extra_memory()
    assert memory["num_parameters"] == draft.num_parameters
    assert memory["bytes"] == 4 * draft.num_parameters  # float32
    assert 0 < memory["fraction_of_model"] < 1
    shape = tiny_model.shape
    assert memory["kv_cache_bytes_per_token"] == 2 * 2 * shape.num_kv_heads * shape.head_dim * 4
    assert "own copy" in memory["what"]


def test_speculative_draft_subvocabulary_stays_exact(tiny_model, greedy_outputs, tmp_path):
    vocab = tmp_path / "vocab.json"
    vocab.write_text(json.dumps(list(range(0, 128, 2))))  # half the vocabulary: many drafts must be rejected
    options = {"num_speculations": 4, "draft_layers": 3, "draft_vocab_file": str(vocab)}
    results = [build_method("speculative", tiny_model, options).generate(p, MAX_NEW) for p in prompts()]
    assert [r.tokens for r in results] == greedy_outputs
    assert any(t % 2 for r in results for t in r.tokens), "the fixture should need tokens outside the sub-vocabulary"


@pytest.mark.parametrize("draft_layers", [4, 9])
def test_draft_layers_outside_the_model_is_one_line_naming_the_option(tiny_model, draft_layers):
    with pytest.raises(ExitbenchError, match=r"draft_layers is .* between 1 and 3") as info:
        build_method("speculative", tiny_model, {"num_speculations": 2, "draft_layers": draft_layers})
    assert "\n" not in str(info.value)


def test_evaluate_summary_and_report_carry_the_drafts_memory(tiny_model, tmp_path):
    from exitbench.config import DataConfig, resolve
    from exitbench.data.prepare import prepare_data
    from exitbench.evaluation import EvalContext, evaluate_model_task
    from exitbench.report.results import memory_text
    from exitbench.stage_plan import needs_prepared_draft
    from tests.test_second_mirror import DOMAINS, CharTokenizer, write_mirror

    data = tmp_path / "data"
    prepare_data(DataConfig(tasks=["topv2"], topv2_domains=DOMAINS), data, write_mirror(tmp_path / "m", "x", 2),
                 progress=False)
    methods = {"autoregressive": {}, "speculative": {"num_speculations": 2, "draft_layers": 2}}
    cfg = resolve({"evaluate": {"models": ["tiny"], "methods": methods, "draft_vocab_size": 0,
                                "tasks": {"topv2": {"num_samples": 3, "max_new_tokens": 8}}}})
    ctx = EvalContext("tiny", tiny_model, CharTokenizer(), None, "tinykey", {"num_parameters": 1})
    summaries = evaluate_model_task(cfg, ctx, "topv2", data, tmp_path / "eval")
    assert "extra_memory" not in summaries["autoregressive"]
    memory = summaries["speculative"]["extra_memory"]
    assert memory["num_parameters"] == own_layers_draft(tiny_model, 2).num_parameters
    assert summaries["speculative"]["correctness"]["num_mismatched"] == 0
    assert "parameters" in memory_text(memory) and "KiB per token" in memory_text(memory)
    # only a speculative label without draft_layers loads the prepared models/draft
    assert not needs_prepared_draft("speculative", methods["speculative"])
    assert needs_prepared_draft("speculative@prepared", {"num_speculations": 2})
    assert not needs_prepared_draft("self_speculative", {"num_speculations": 2})
