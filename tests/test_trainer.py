"""The training loop on the tiny model: learning, checkpoint/resume, outputs, corpora, DDP equality, CLI."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from exitbench.config import BaseConfig, Config, TrainConfig, TrainVariant
from exitbench.errors import ExitbenchError
from exitbench.exit_vocab import model_exit_vocabulary, trained_exit_vocabulary
from exitbench.models.load import load_causal_lm
from exitbench.models.tiny import random_llama
from exitbench.training import distributed as dist_utils
from exitbench.training import trainer
from exitbench.training.corpora import DataOrder, Example, build_corpus, collate, pack
from exitbench.training.trainer import TrainPaths, micro_batches, train
from tests.torchrun_helpers import run_torchrun

ROOT = Path(__file__).resolve().parents[1]

# A tiny, highly repetitive TOPv2-style set: a few utterances and their parses.
ROWS = [
    {"domain": "alarm", "utterance": "wake me at 7", "semantic_parse": "[IN:CREATE_ALARM [SL:TIME 7 ] ]"},
    {"domain": "alarm", "utterance": "alarm for 8", "semantic_parse": "[IN:CREATE_ALARM [SL:TIME 8 ] ]"},
    {"domain": "weather", "utterance": "rain today?", "semantic_parse": "[IN:GET_WEATHER [SL:DATE today ] ]"},
    {"domain": "timer", "utterance": "timer 5 min", "semantic_parse": "[IN:CREATE_TIMER [SL:TIME 5 min ] ]"},
]


def char_tokenizer() -> PreTrainedTokenizerFast:
    """Character-level tokenizer over printable ASCII + newline; ids 0-3 = pad, bos, eos, unk (vocab 100)."""
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3}
    for char in [chr(code) for code in range(32, 127)] + ["\n"]:
        vocab[char] = len(vocab)
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>"
    )


def make_workspace(root: Path) -> dict[str, Path]:
    """A tiny base model (random weights, character tokenizer) and a TOPv2 train split under ``root``."""
    base = root / "models" / "base"
    random_llama(seed=0).save_pretrained(base)
    char_tokenizer().save_pretrained(base)
    data = root / "data"
    (data / "topv2").mkdir(parents=True)
    lines = [json.dumps(ROWS[i % len(ROWS)]) for i in range(32)]
    (data / "topv2" / "train.jsonl").write_text("\n".join(lines) + "\n")
    return {"root": root, "base": base, "data": data}


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> dict[str, Path]:
    return make_workspace(tmp_path_factory.mktemp("train"))


def paths_for(workspace: dict[str, Path], name: str) -> TrainPaths:
    root = workspace["root"]
    return TrainPaths(
        base_model=workspace["base"],
        data=workspace["data"],
        out=root / "models" / name,
        checkpoints=root / "checkpoints" / name,
        report=root / "results" / f"{name}.json",
    )


def variant(**overrides) -> TrainVariant:
    values = {
        "steps": 6,
        "batch_size": 4,
        "seq_len": 64,
        "lr": 3e-3,
        "warmup_steps": 1,
        "p_max": 0.3,
        "rotation": 2,
        "autocast_bf16": False,
        "checkpoint_every": 2,
        "timing_steps": 0,
    }
    return TrainVariant(**{**values, **overrides})


BASE = BaseConfig(seed=7)


# --- corpora -----------------------------------------------------------------------------------------------


def test_collate_masks_prompt_and_padding():
    batch = [Example((5, 6, 7, 8, 2), prompt_len=2), Example((9, 10, 2), prompt_len=0)]
    ids, labels = collate(batch, pad_id=0)
    assert ids.tolist() == [[5, 6, 7, 8], [9, 10, 0, 0]]
    assert labels.tolist() == [[-100, 7, 8, 2], [10, 2, -100, -100]]
    assert [example.loss_tokens for example in batch] == [3, 2]


def test_pack_targets_every_token_once():
    tokenizer = char_tokenizer()
    blocks = pack(["abcdefghij", "klmno"], tokenizer, seq_len=4, limit=0)
    stream = tokenizer("abcdefghij", add_special_tokens=False)["input_ids"] + [2]
    stream += tokenizer("klmno", add_special_tokens=False)["input_ids"] + [2]
    assert len(blocks) == (len(stream) - 1) // 4
    assert all(len(block.tokens) == 5 for block in blocks)
    targets = [token for block in blocks for token in block.tokens[1:]]
    assert targets == stream[1 : 1 + 4 * len(blocks)]
    assert len(pack(["abcdefghij", "klmno"], tokenizer, seq_len=4, limit=2)) == 2


def test_topv2_corpus_and_mixture_are_deterministic(workspace):
    tokenizer = char_tokenizer()
    corpus = build_corpus(["topv2"], workspace["data"], tokenizer, 64, 0, seed=1)
    assert len(corpus.examples) == 32
    example = corpus.examples[0]
    text = tokenizer.decode(example.tokens[: example.prompt_len])
    assert text.endswith("\n") and example.tokens[-1] == tokenizer.eos_token_id
    assert corpus.counts["topv2"]["skipped_too_long"] == 0
    mixed = build_corpus(["topv2", "stdlib_code", "docs_text"], workspace["data"], tokenizer, 64, 20, seed=1)
    assert len(mixed.examples) == 20
    pair = build_corpus(["docs_text", "topv2"], workspace["data"], tokenizer, 64, 20, seed=1)
    again = build_corpus(["docs_text", "topv2"], workspace["data"], tokenizer, 64, 20, seed=1)
    assert pair.examples == again.examples and pair.counts == again.counts
    assert set(mixed.counts) == {"topv2", "stdlib_code", "docs_text"}
    assert mixed.totals()["loss_tokens"] < mixed.totals()["tokens"]
    short = build_corpus(["topv2"], workspace["data"], tokenizer, 46, 0, seed=1)
    assert short.counts["topv2"]["skipped_too_long"] > 0
    assert short.counts["topv2"]["skipped_too_long"] + len(short.examples) == 32


def test_data_order_visits_every_example_once_per_epoch():
    order = DataOrder(10, 4, seed=3)
    first_epoch = [i for step in range(5) for i in order.step_indices(step)]
    assert sorted(first_epoch[:10]) == list(range(10))
    assert sorted(first_epoch[10:20]) == list(range(10))
    assert first_epoch[:10] != first_epoch[10:20]


# --- training ----------------------------------------------------------------------------------------------


def test_training_lowers_the_loss_and_writes_outputs(workspace):
    paths = paths_for(workspace, "learn")
    report = train(
        variant(steps=12, p_max=0.2, curriculum="none", timing_steps=1, lr=5e-3),
        BASE,
        paths,
        name="learn",
        progress=False,
    )
    losses = [entry["loss"] for entry in report["history"]]
    assert len(losses) == 12
    assert sum(losses[-3:]) / 3 < 0.7 * sum(losses[:3]) / 3
    saved = json.loads(paths.report.read_text())
    assert saved["steps"] == 12 and set(saved["final_exit_losses"]) == {"0", "1", "2", "3"}
    assert sum(saved["loss_weight_share"].values()) == pytest.approx(1.0)
    assert saved["loss_weight_share"]["0"] == 0.0  # e(0) = 0 in LayerSkip
    assert saved["tokens"]["corpus"]["loss_tokens"] > 0 and saved["step_time_ratio"]["ratio"] > 0
    reloaded = load_causal_lm(paths.out)
    assert torch.equal(
        reloaded.model.layers[0].mlp.up_proj.weight, load_causal_lm(paths.out).model.layers[0].mlp.up_proj.weight
    )
    assert not torch.equal(
        reloaded.model.layers[0].mlp.up_proj.weight,
        load_causal_lm(workspace["base"]).model.layers[0].mlp.up_proj.weight,
    )
    assert (paths.out / "tokenizer.json").exists()
    assert not list(paths.out.parent.glob(".learn.*"))


def test_freeze_embeddings_keeps_embedding_and_head_and_trains_the_rest(workspace):
    paths = paths_for(workspace, "frozen")
    report = train(variant(steps=3, freeze_embeddings=True), BASE, paths, progress=False)
    base, trained = load_causal_lm(workspace["base"]), load_causal_lm(paths.out)
    assert torch.equal(trained.get_input_embeddings().weight, base.get_input_embeddings().weight)
    assert torch.equal(trained.get_output_embeddings().weight, base.get_output_embeddings().weight)
    q_proj = [model.model.layers[1].self_attn.q_proj.weight for model in (trained, base)]
    assert not torch.equal(*q_proj)
    frozen = {id(p): p for p in (base.get_input_embeddings().weight, base.get_output_embeddings().weight)}
    total = sum(p.numel() for p in base.parameters())
    assert report["trainable_parameters"] == total - sum(p.numel() for p in frozen.values())


def test_micro_batches_sort_by_length_and_cover_every_row_once():
    lengths = [5, 9, 2, 7, 9, 1]
    chunks = micro_batches(range(6), lengths, 4)
    assert chunks == [[5, 2, 0, 3], [1, 4]]
    assert micro_batches(range(2, 6), lengths, 2) == [[5, 2], [3, 4]]  # a rank's shard keeps its rows


def test_gradient_accumulation_matches_one_batch(workspace):
    one = train(variant(steps=3, batch_size=4, p_max=0.0), BASE, paths_for(workspace, "accum1"), progress=False)
    two = train(
        variant(steps=3, batch_size=2, grad_accum=2, p_max=0.0), BASE, paths_for(workspace, "accum2"), progress=False
    )
    for a, b in zip(one["history"], two["history"], strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)


def _state(path: Path) -> dict[str, torch.Tensor]:
    return load_causal_lm(path).state_dict()


def test_resume_after_a_kill_gives_the_same_weights(workspace):
    config = variant(steps=6, checkpoint_every=2, recipe="layerskip", curriculum="rotational")
    straight = paths_for(workspace, "straight")
    full = train(config, BASE, straight, progress=False)
    resumed = paths_for(workspace, "resumed")
    assert train(config, BASE, resumed, max_steps_this_run=3, progress=False) is None  # "killed" after step 3
    assert not resumed.out.exists()
    second = train(config, BASE, resumed, progress=False)  # resumes from the step-2 checkpoint
    assert second["resumed_from_step"] == 2
    assert [e["loss"] for e in second["history"]] == [e["loss"] for e in full["history"]]
    expected, got = _state(straight.out), _state(resumed.out)
    assert all(torch.equal(expected[key], got[key]) for key in expected)
    for finished in (straight, resumed):  # a finished run's checkpoints are deleted: only the model is kept
        assert finished.checkpoints.is_dir() and not any(finished.checkpoints.iterdir())


def test_truncated_newest_checkpoint_resumes_from_the_previous(workspace, caplog):
    config = variant(steps=6, checkpoint_every=2)
    paths = paths_for(workspace, "truncated")
    assert train(config, BASE, paths, max_steps_this_run=5, progress=False) is None  # checkpoints at 2 and 4
    newest = paths.checkpoints / "checkpoint.pt"
    newest.write_bytes(newest.read_bytes()[:1000])  # a write cut short by a full disk
    with caplog.at_level("WARNING", logger="exitbench.training.trainer"):
        assert train(config, BASE, paths, max_steps_this_run=3, progress=False) is None  # from 2, saves at 4
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "checkpoint.pt" in warnings[0] and "resuming from checkpoint.prev.pt" in warnings[0]
    assert (paths.checkpoints / "checkpoint.prev.pt").exists()  # the last two good ones are kept again
    assert train(config, BASE, paths, progress=False)["resumed_from_step"] == 4
    assert not any(paths.checkpoints.iterdir())  # the unreadable one is gone with the rest once finished


def test_at_most_two_checkpoints_are_on_disk(workspace, monkeypatch):
    config = variant(steps=6, checkpoint_every=1)
    paths = paths_for(workspace, "two")
    seen: list[int] = []
    original = trainer.torch.save

    def counting_save(payload, handle):
        seen.append(len(list(paths.checkpoints.glob("checkpoint*"))))  # includes the temporary being written
        original(payload, handle)

    monkeypatch.setattr(trainer.torch, "save", counting_save)
    assert train(config, BASE, paths, max_steps_this_run=5, progress=False) is None
    assert len(seen) == 5 and max(seen) == 2


def test_no_readable_checkpoint_is_one_line(workspace):
    paths = paths_for(workspace, "corrupt")
    paths.checkpoints.mkdir(parents=True)
    (paths.checkpoints / "checkpoint.pt").write_bytes(b"")
    (paths.checkpoints / "checkpoint.prev.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ExitbenchError) as info:
        train(variant(steps=2), BASE, paths, progress=False)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{paths.checkpoints}: no checkpoint can be read (checkpoint.pt: EOFError; ")
    assert message.endswith(f"delete {paths.checkpoints} to train from step 0")


def test_calm_recipe_and_gradual_curriculum_run(workspace):
    report = train(
        variant(steps=4, recipe="calm", curriculum="gradual", p_max=0.0, autocast_bf16=True),
        BASE,
        paths_for(workspace, "calm"),
        progress=False,
    )
    shares = report["loss_weight_share"]
    assert shares["3"] > shares["0"] and sum(shares.values()) == pytest.approx(1.0)
    assert report["history"][0]["exits"].keys() == {"3"}


def test_training_with_an_exit_vocabulary_reports_its_size_and_coverage(workspace):
    report = train(
        variant(steps=3, curriculum="none", exit_vocab_size=12, timing_steps=1),
        BASE,
        paths_for(workspace, "subvocab"),
        progress=False,
    )
    exit_vocab = report["exit_vocab"]
    assert exit_vocab["size"] in (12, 13)  # + the stop token when it is not among the 12
    assert 0.3 < exit_vocab["target_coverage"] < 1.0
    assert report["step_time_ratio"]["ratio"] > 0 and len(report["final_exit_losses"]) == 4
    plain = train(
        variant(steps=3, curriculum="none", timing_steps=0), BASE, paths_for(workspace, "fullvocab"), progress=False
    )
    assert plain["exit_vocab"] is None
    # the last layer's loss is the same objective with or without the set: equal at the first step
    assert report["history"][0]["exits"]["3"] == pytest.approx(plain["history"][0]["exits"]["3"], rel=1e-6)
    assert report["history"][0]["exits"]["1"] < plain["history"][0]["exits"]["1"]


def test_the_exits_set_rebuilt_from_the_training_report_is_the_one_trained(workspace, monkeypatch):
    """Evaluation drafts a sub-vocabulary model over its exits' set, rebuilt from the training report
    (exitbench/exit_vocab.py): it must be the set the trainer used, and prepared data that changed since stops it."""
    used: list[list[int]] = []
    original = trainer.EarlyExitObjective.set_exit_vocab

    def spy(self, token_ids):
        used.append(list(token_ids) if token_ids is not None else None)
        return original(self, token_ids)

    monkeypatch.setattr(trainer.EarlyExitObjective, "set_exit_vocab", spy)
    paths = paths_for(workspace, "subvocab_rebuilt")
    train(variant(steps=2, curriculum="none", exit_vocab_size=9, timing_steps=0), BASE, paths, progress=False)
    tokenizer = char_tokenizer()
    assert used and trained_exit_vocabulary(paths.report, workspace["data"], tokenizer) == used[0]
    reports = paths.report.parent  # the stages' form: a model's report found by name in the reports folder
    assert model_exit_vocabulary(reports, paths.report.stem, workspace["data"], tokenizer) == used[0]
    assert model_exit_vocabulary(reports, "base", workspace["data"], tokenizer) is None  # not trained here
    assert model_exit_vocabulary(None, paths.report.stem, workspace["data"], tokenizer) is None
    full = paths_for(workspace, "fullvocab_rebuilt")
    train(variant(steps=2, curriculum="none", timing_steps=0), BASE, full, progress=False)
    assert trained_exit_vocabulary(full.report, workspace["data"], tokenizer) is None
    changed = workspace["root"] / "changed_data"
    (changed / "topv2").mkdir(parents=True)
    rows = [{**row, "semantic_parse": row["semantic_parse"].lower()} for row in ROWS]
    (changed / "topv2" / "train.jsonl").write_text("".join(json.dumps(rows[i % 4]) + "\n" for i in range(32)))
    with pytest.raises(ExitbenchError, match="prepared data changed since training"):
        trained_exit_vocabulary(paths.report, changed, tokenizer)


def _write_config(path: Path, config: TrainVariant) -> None:
    full = Config(profile="cpu", base=BASE, train=TrainConfig(variants={"v": config}))
    path.write_text(full.model_dump_json())


def _load_pipeline():
    spec = importlib.util.spec_from_file_location("train_pipeline", ROOT / "pipelines" / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cli_unknown_variant_is_one_line(workspace, capsys):
    config_path = workspace["root"] / "cli.json"
    _write_config(config_path, variant())
    pipeline = _load_pipeline()
    with pytest.raises(SystemExit) as exit_info:
        pipeline.run_stage(lambda: pipeline.main(["--config", str(config_path), "--variant", "nope"]))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.strip() == "error: unknown variant 'nope'; known: v"


def test_clean_shutdown_lets_gloo_drain_before_the_group_goes(monkeypatch):
    """The teardown race (exitbench/training/distributed.py, ``shutdown``): after the last barrier the main thread
    must wait without the GIL before the group can be freed; after an error nothing collective runs."""
    calls: list[str] = []
    monkeypatch.setattr(dist_utils.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist_utils.dist, "barrier", lambda: calls.append("barrier"))
    monkeypatch.setattr(dist_utils.dist, "destroy_process_group", lambda: calls.append("destroy"))
    monkeypatch.setattr(dist_utils.time, "sleep", lambda seconds: calls.append(f"sleep {seconds}"))
    two_ranks = dist_utils.DistContext(rank=0, world_size=2)
    dist_utils.shutdown(two_ranks)
    assert calls == ["barrier", f"sleep {dist_utils._DRAIN_S}", "destroy"] and dist_utils._DRAIN_S >= 0.1
    calls.clear()
    dist_utils.shutdown(two_ranks, clean=False)
    dist_utils.shutdown(dist_utils.DistContext())
    assert calls == []


@pytest.mark.slow
def test_ddp_two_processes_match_one(workspace):
    config = variant(steps=4, batch_size=2, grad_accum=2, p_max=0.0, distributed="ddp", timing_steps=1)
    single = train(config, BASE, paths_for(workspace, "single"), progress=False)
    config_path = workspace["root"] / "ddp.json"
    _write_config(config_path, config)
    paths = paths_for(workspace, "ddp")
    run_torchrun(
        ROOT / "pipelines" / "train.py",
        [
            "--config", str(config_path), "--variant", "v", "--base-model", str(paths.base_model),
            "--data", str(paths.data), "--out", str(paths.out), "--checkpoints", str(paths.checkpoints),
            "--report", str(paths.report), "--no-progress",
        ],
    )  # fmt: skip
    report = json.loads(paths.report.read_text())
    assert report["world_size"] == 2 and report["step_time_ratio"]["ratio"] > 0  # rank 0 timed after DDP
    for one, two in zip(single["history"], report["history"], strict=True):
        assert two["loss"] == pytest.approx(one["loss"], abs=1e-5)
        assert two["exits"].keys() == one["exits"].keys()
        for key in one["exits"]:
            assert two["exits"][key] == pytest.approx(one["exits"][key], abs=1e-5)
