"""Training data for every task family, and the control variant: disjoint from everything evaluated.

The disjointness tests run on fixtures always and, where the offline mirror is present (EXITBENCH_DATA_MIRROR
or ../shared/data), on the real datasets too.
"""

from __future__ import annotations

import ast
import gzip
import json
import os
from pathlib import Path

import pytest

from exitbench.config import DataConfig, TrainConfig, TrainVariant, check_controls, load
from exitbench.data import code_corpus
from exitbench.data.code_corpus import build_code_corpus, completion_document, evaluated_solutions, find_overlaps
from exitbench.data.loaders import cnndm_roles
from exitbench.errors import ExitbenchError
from exitbench.tasks.cnndm import CnnDm
from exitbench.training.corpora import build_corpus, mixture_counts, news_examples
from exitbench.training.early_exit_loss import exit_scales, normalized_weights
from tests.test_trainer import char_tokenizer

REPO = Path(__file__).resolve().parents[1]


def _real_mirror() -> Path | None:
    for candidate in (os.environ.get("EXITBENCH_DATA_MIRROR"), str(REPO.parent / "shared" / "data")):
        if candidate and (Path(candidate) / "mbpp" / "mbpp.jsonl").exists():
            return Path(candidate)
    return None


MIRROR = _real_mirror()
needs_mirror = pytest.mark.skipif(MIRROR is None, reason="the offline data mirror is not on this machine")


# --- CNN/DM roles -------------------------------------------------------------------------------------------


def test_cnndm_roles_are_disjoint_sized_and_independent_of_order():
    ids = [f"article-{i}" for i in range(100)]
    roles = cnndm_roles(ids, shots=5, train=30)
    assert sorted(roles) == sorted(ids)
    counts = {role: sum(r == role for r in roles.values()) for role in ("shots", "train", "test")}
    assert counts == {"shots": 5, "train": 30, "test": 65}
    assert cnndm_roles(list(reversed(ids)), shots=5, train=30) == roles
    assert cnndm_roles(ids[:50], shots=5, train=30) != {k: v for k, v in roles.items() if k in ids[:50]}


@needs_mirror
def test_real_cnndm_training_articles_are_never_evaluated_or_shown(tmp_path):
    from exitbench.data.prepare import prepare_data

    prepare_data(DataConfig(tasks=["cnndm"], code_wheels=[]), tmp_path, MIRROR, progress=False)
    rows = {role: _read(tmp_path / "cnndm" / f"{role}.jsonl") for role in ("shots", "train", "test")}
    ids = {role: {row["id"] for row in role_rows} for role, role_rows in rows.items()}
    assert len(ids["shots"]) == 20 and len(ids["train"]) == 200 and len(ids["test"]) == 280
    assert not ids["train"] & (ids["test"] | ids["shots"]) and not ids["shots"] & ids["test"]
    # what evaluate and calibrate draw from is the test role; the one-shot examples come from the shots role
    task = CnnDm()
    task.set_context({"shots": rows["shots"]})
    for sample in task.samples(rows["test"], 40):
        assert sample.sample_id in ids["test"]
        assert any(row["article"][:200] in sample.prompt for row in rows["shots"])
        assert not any(row["article"][:200] in sample.prompt for row in rows["train"])


def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# --- the code corpus ----------------------------------------------------------------------------------------


def test_completion_document_is_humaneval_shaped_python():
    row = {"task_id": 600, "text": "Write a function to add two numbers.", "test_list": ["assert add(1, 2) == 3"],
           "code": "import math\ndef helper(x):\n    return x\ndef add(a, b):\n    total = a + b\n    return total"}
    text = completion_document(row)
    tree = ast.parse(text)
    add = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "add")
    assert ast.get_docstring(add) == "Write a function to add two numbers.\n>>> assert add(1, 2) == 3"
    assert text.startswith("import math\ndef helper(x):")
    assert completion_document({**row, "code": "def add(a, b): return a + b"}) is None  # no body to complete


def test_a_wheel_holding_an_evaluated_solution_stops_prepare(monkeypatch):
    humaneval = [{"task_id": "HumanEval/7", "prompt": "def twice(x):\n    \"\"\"Double it.\"\"\"\n",
                  "canonical_solution": "    return 2 * x\n"}]
    leaked = {"id": "pkg-1.0/pkg/util.py", "origin": "pkg==1.0",
              "text": "import os\n\ndef twice(x):\n    \"\"\"Double it.\"\"\"\n    return 2 * x\n"}
    monkeypatch.setattr(code_corpus, "wheel_documents", lambda spec, cache=None: ([leaked], {"spec": spec}))
    with pytest.raises(ExitbenchError, match=r"pkg-1.0/pkg/util.py contains humaneval/HumanEval/7.*drop pkg==1.0"):
        build_code_corpus([], ["pkg==1.0"], humaneval, [])


def test_an_mbpp_training_problem_repeating_a_test_solution_is_left_out():
    test = [{"task_id": 11, "code": "def f(a):\n    return sorted(a)[::-1]"}]
    train = [{"task_id": 600, "text": "Sort descending.", "test_list": ["assert f([1, 2]) == [2, 1]"],
              "code": "def f(a):\n    return sorted(a)[::-1]"},
             {"task_id": 601, "text": "Add one.", "test_list": ["assert g(1) == 2"],
              "code": "def g(x):\n    return x + 1"}]
    corpus = build_code_corpus(train, [], [], test)
    assert corpus.excluded_overlaps == ["mbpp/600"]
    assert [doc["id"] for doc in corpus.documents] == ["mbpp/601"]


def test_unpinned_wheel_is_one_clear_error():
    with pytest.raises(ExitbenchError, match=r"'networkx>=3' is not pinned; write it as name==version"):
        code_corpus.parse_pin("networkx>=3")


@needs_mirror
# Third-party sources in the code wheels hold strings such as "\\." that Python parses with a warning.
@pytest.mark.filterwarnings("ignore:invalid escape sequence")
def test_real_code_corpus_holds_no_evaluated_problem():
    rows = _read(MIRROR / "mbpp" / "mbpp.jsonl")
    with gzip.open(MIRROR / "humaneval" / "HumanEval.jsonl.gz", "rt") as handle:
        humaneval = [json.loads(line) for line in handle if line.strip()]
    train = [r for r in rows if 511 <= r["task_id"] <= 974]
    test = [r for r in rows if 11 <= r["task_id"] <= 510]
    wheels = DataConfig().code_wheels
    corpus = build_code_corpus(train, wheels, humaneval, test)
    assert len(corpus.documents) > 400 and {w["spec"] for w in corpus.wheels} == set(wheels)
    assert not find_overlaps(corpus.documents, evaluated_solutions(humaneval, test))
    assert not {doc["id"] for doc in corpus.documents} & {f"mbpp/{r['task_id']}" for r in test}


# --- mixtures -----------------------------------------------------------------------------------------------


def test_mixture_counts_follow_the_weights_and_add_up():
    assert mixture_counts({"topv2": 0.7, "code": 0.2, "news": 0.1}, 240) == {"topv2": 168, "code": 48, "news": 24}
    assert sum(mixture_counts({"a": 1, "b": 1, "c": 1}, 10).values()) == 10
    with pytest.raises(ExitbenchError, match="weights must be positive"):
        mixture_counts({"topv2": 0.0}, 10)


def _news_data(tmp_path: Path) -> Path:
    rows = [{"id": f"n{i}", "article": f"Story {i}. " + "Words here. " * 40, "highlights": f"Point {i}.\nMore {i}."}
            for i in range(3)]
    (tmp_path / "cnndm").mkdir(parents=True)
    (tmp_path / "cnndm" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "topv2").mkdir()
    topv2 = {"id": "alarm-train-1", "domain": "alarm", "utterance": "wake me", "semantic_parse": "[IN:X ]"}
    (tmp_path / "topv2" / "train.jsonl").write_text(json.dumps(topv2) + "\n")
    return tmp_path


def test_news_examples_use_the_one_shot_format_with_the_loss_on_the_summary(tmp_path):
    tokenizer = char_tokenizer()
    examples, skipped = news_examples(_news_data(tmp_path), tokenizer, seq_len=96, limit=0, seed=1)
    assert len(examples) == 3 and skipped == 0
    for example in examples:
        assert len(example.tokens) <= 97
        prompt = tokenizer.decode(example.tokens[: example.prompt_len])
        target = tokenizer.decode(example.tokens[example.prompt_len :])
        assert prompt.startswith("Article: Story ") and prompt.endswith("\nSummary:")
        assert target.startswith(" Point ") and target.endswith(".\n\n") and "\n" not in target.strip()


def test_weighted_mixture_cycles_a_small_corpus(tmp_path):
    tokenizer = char_tokenizer()
    corpus = build_corpus({"topv2": 1.0, "news": 1.0}, _news_data(tmp_path), tokenizer, 96, 8, seed=1)
    assert len(corpus.examples) == 8
    assert corpus.counts["news"]["examples"] == 4 and corpus.counts["news"]["unique_examples"] == 3
    assert corpus.counts["topv2"]["unique_examples"] == 1


# --- the plain control ---------------------------------------------------------------------------------------


def test_plain_recipe_trains_the_last_layer_only():
    scales = exit_scales("plain", 6, 1.0)
    assert normalized_weights(scales, [1, 3, 5]) == {5: 1.0}
    assert normalized_weights(exit_scales("layerskip", 6, 1.0), [1, 3, 5]).keys() == {1, 3, 5}


def test_plain_control_must_match_the_variant_it_controls():
    finetune = {"steps": 10, "lr": 1e-4, "corpus": {"topv2": 0.7, "code": 0.3}}
    params = load(REPO / "params.yaml")
    check_controls(params, "params.yaml")  # the shipped plain is layerskip's control
    assert params.train.variants["plain"].control_of == "layerskip"
    good = params.model_copy(update={"train": TrainConfig(variants={
        "layerskip": TrainVariant(**finetune, p_max=0.2),
        "plain": TrainVariant(**finetune, recipe="plain", p_max=0.0, control_of="layerskip"),
    })})
    check_controls(good, "params.yaml")
    bad = good.model_copy(update={"train": TrainConfig(variants={
        "layerskip": TrainVariant(**finetune, p_max=0.2),
        "plain": TrainVariant(**{**finetune, "steps": 9}, recipe="plain", p_max=0.0, control_of="layerskip"),
    })})
    with pytest.raises(ExitbenchError, match=r"train.variants.plain is the control of layerskip but differs in steps"):
        check_controls(bad, "params.yaml")
    with pytest.raises(ValueError, match="recipe plain trains without layer dropout; set p_max: 0"):
        TrainConfig(variants={"plain": TrainVariant(recipe="plain", p_max=0.1)})
