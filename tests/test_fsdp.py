"""FSDP (``distributed: fsdp``) on the tiny model, 2 gloo processes under torchrun vs 1 process.

The gradients of one step equal single-process ones (layer dropout with a layer no row of a rank keeps and
a layer no row keeps at all); training equals single-process training; a killed run resumes exactly, from a
checkpoint in the single-process format. Full runs go through ``pipelines/train.py``; the killed run and
the gradient step run this file as the torchrun script (``rank_main``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from torch.distributed.tensor import DTensor

from exitbench.config import TrainVariant, load_stage
from exitbench.models.load import load_causal_lm
from exitbench.training import distributed as dist_utils
from exitbench.training import trainer
from exitbench.training.corpora import DataOrder, build_corpus
from exitbench.training.distributed import DistContext
from exitbench.training.early_exit_loss import normalized_weights
from exitbench.training.layer_dropout import keep_mask
from exitbench.training.schedules import dropout_rates
from exitbench.training.trainer import TrainPaths, micro_batches, train
from tests.test_trainer import (
    BASE,
    ROOT,
    _load_pipeline,
    _write_config,
    char_tokenizer,
    make_workspace,
    paths_for,
    variant,
)
from tests.torchrun_helpers import run_torchrun

WORLD = 2
# 2 processes vs 1 add the same terms in another order: losses agree to float rounding (measured ~2e-7).
# AdamW's first steps normalise each gradient entry, so near-zero entries carry that rounding into a few
# weights: max 1.7e-5 here, and DDP vs 1 process shows the same (2.1e-5 on this config).
LOSS_TOLERANCE = 1e-5
WEIGHT_TOLERANCE = 1e-4
GRADIENT_TOLERANCE = 1e-5  # relative to the parameter's largest gradient entry (measured 2.2e-7)
STATE_TOLERANCE = 1e-4  # checkpointed weights and AdamW moments, relative to the largest entry (measured 2e-6)
# Global batch 8 = 2 ranks x 2 micro-batches x 2 rows (FSDP's reduce-scatter skipped on the first).
FSDP = {"steps": 4, "batch_size": 2, "grad_accum": 4, "distributed": "fsdp", "checkpoint_every": 2}
# p_max high enough that some layer gets no row of a rank's micro-batch (FSDP runs it on one row with weight
# 0) and some layer no row of a whole step (no rank runs it); test_fsdp_two_processes_match_one checks both.
P_MAX = 0.9
# keep [layer, row] of the gradient step: rank 0 has rows 0-3, rank 1 rows 4-7. Layer 0 keeps every row,
# layer 1 only rank 0's rows, layer 2 only row 5 (one micro-batch of rank 1), layer 3 none.
KEEP = torch.tensor([[1] * 8, [1] * 4 + [0] * 4, [0] * 5 + [1] + [0] * 2, [0] * 8], dtype=torch.bool)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> dict[str, Path]:
    return make_workspace(tmp_path_factory.mktemp("fsdp"))


def torchrun(script: Path, args: list[str]) -> None:
    run_torchrun(script, args, world=WORLD, PYTHONPATH=str(ROOT))


def cli_args(config_path: Path, paths: TrainPaths) -> list[str]:
    return [
        "--config", str(config_path), "--variant", "v", "--base-model", str(paths.base_model),
        "--data", str(paths.data), "--out", str(paths.out), "--checkpoints", str(paths.checkpoints),
        "--report", str(paths.report), "--no-progress",
    ]  # fmt: skip


def fsdp_train(workspace: dict[str, Path], config: TrainVariant, name: str, max_steps: int = 0) -> dict | None:
    """``config`` trained by 2 processes; the report, or None when stopped after ``max_steps`` steps."""
    config_path = workspace["root"] / f"{name}.json"
    _write_config(config_path, config)
    paths = paths_for(workspace, name)
    if max_steps:
        torchrun(Path(__file__), ["stop", str(max_steps), *cli_args(config_path, paths)])
        return None
    torchrun(ROOT / "pipelines" / "train.py", cli_args(config_path, paths))
    return json.loads(paths.report.read_text())


def max_weight_difference(first: Path, second: Path) -> float:
    a, b = load_causal_lm(first).state_dict(), load_causal_lm(second).state_dict()
    assert a.keys() == b.keys()
    return max(float((a[key] - b[key]).abs().max()) for key in a)


def dropout_cases(workspace: dict[str, Path], config: TrainVariant) -> tuple[int, int]:
    """(layers run on one row with weight 0, layers no row of a step keeps) over ``config``'s steps on 2 ranks.

    Replays the trainer's draws: the same data order and one keep mask per step from the seeded generator.
    """
    rows = config.batch_size * config.grad_accum
    size = config.steps * rows
    corpus = build_corpus(config.corpus, workspace["data"], char_tokenizer(), config.seq_len, size, BASE.seed)
    order, generator = DataOrder(len(corpus.examples), rows, BASE.seed), torch.Generator().manual_seed(BASE.seed)
    forced = skipped = 0
    for step in range(config.steps):
        keep = keep_mask(dropout_rates(step, config.steps, 4, config.p_max, config.dropout_schedule), rows, generator)
        lengths = [len(corpus.examples[index].tokens) for index in order.step_indices(step)]
        skipped += int((~keep.any(dim=1)).sum())
        for rank in range(WORLD):
            for chunk in micro_batches(dist_utils.shard(rows, DistContext(rank, WORLD)), lengths, config.batch_size):
                forced += int((keep.any(dim=1) & ~keep[:, chunk].any(dim=1)).sum())
    return forced, skipped


def crafted_gradients(run: trainer.Run) -> tuple[dict[str, torch.Tensor | None], torch.Tensor]:
    """Full gradients (rank 0; gathering them is collective) and CE sums of one step of the first batch with
    layer-dropout mask :data:`KEEP` and every exit enabled."""
    batch = [run.corpus.examples[index] for index in run.order.step_indices(0)]
    sums = trainer.accumulate_gradients(run, batch, KEEP, normalized_weights(run.scales, range(4)))
    gradients = {}
    for name, param in run.objective.lm.named_parameters():
        gradient = param.grad
        gradients[name] = gradient.full_tensor() if isinstance(gradient, DTensor) else gradient
    return gradients, sums


@pytest.mark.slow
@pytest.mark.parametrize("frozen", [False, True], ids=["tied_head_trained", "embeddings_frozen"])
def test_fsdp_gradients_equal_one_process(workspace, frozen):
    config = variant(**FSDP, p_max=0.5, freeze_embeddings=frozen)
    name = f"gradients_{frozen}"
    config_path, out = workspace["root"] / f"{name}.json", workspace["root"] / f"{name}.pt"
    _write_config(config_path, config)
    paths = paths_for(workspace, name)
    torchrun(Path(__file__), ["gradients", str(out), *cli_args(config_path, paths)])
    sharded = torch.load(out, weights_only=True)
    run, _ = trainer.build_run(config, BASE, paths, DistContext())
    gradients, sums = crafted_gradients(run)
    assert torch.allclose(sharded["sums"], sums, rtol=1e-6, atol=0)
    # no row keeps layer 3: no rank runs it, and its gradient stays None, as in one process
    unused = {name for name in gradients if ".layers.3." in name or (frozen and "embed_tokens" in name)}
    for result in (gradients, sharded["gradients"]):
        assert {name for name, gradient in result.items() if gradient is None} == unused
    for name, gradient in gradients.items():
        if name not in unused:
            scale = float(gradient.abs().max())
            assert float((sharded["gradients"][name] - gradient).abs().max()) <= GRADIENT_TOLERANCE * scale, name


@pytest.fixture(scope="module")
def fsdp_run(workspace) -> dict:
    """The unbroken 2-process run (the tied embedding and head trained: one parameter, several exits)."""
    return fsdp_train(workspace, variant(**FSDP, p_max=P_MAX, timing_steps=1), "fsdp")


@pytest.mark.slow
def test_fsdp_two_processes_match_one(workspace, fsdp_run):
    config = variant(**FSDP, p_max=P_MAX, timing_steps=1)
    forced, skipped = dropout_cases(workspace, config)
    assert forced > 0 and skipped > 0
    single = train(config, BASE, paths_for(workspace, "single"), progress=False)  # one process: plain training
    assert fsdp_run["world_size"] == 2 and fsdp_run["step_time_ratio"]["ratio"] > 0  # rank 0 timed, unsharded
    assert fsdp_run["trainable_parameters"] == single["trainable_parameters"]
    for one, two in zip(single["history"], fsdp_run["history"], strict=True):
        assert two["loss"] == pytest.approx(one["loss"], abs=LOSS_TOLERANCE)
        assert two["exits"].keys() == one["exits"].keys()
        for key in one["exits"]:
            assert two["exits"][key] == pytest.approx(one["exits"][key], abs=LOSS_TOLERANCE)
    for key in single["final_exit_losses"]:
        assert fsdp_run["final_exit_losses"][key] == pytest.approx(single["final_exit_losses"][key], abs=1e-4)
    difference = max_weight_difference(paths_for(workspace, "single").out, paths_for(workspace, "fsdp").out)
    assert difference < WEIGHT_TOLERANCE


def assert_matches(fsdp: object, single: object, where: str) -> None:
    """Same nesting, keys, types, tensor shapes and dtypes; tensors equal to float rounding (2 processes vs 1).

    Comparing values also checks that the optimizer state of each parameter number is that parameter's.
    """
    if isinstance(single, dict):  # state_dict() gives an OrderedDict, get_model_state_dict a dict
        assert isinstance(fsdp, dict) and fsdp.keys() == single.keys(), where
        for key in single:
            assert_matches(fsdp[key], single[key], f"{where}/{key}")
        return
    assert type(fsdp) is type(single), where
    if isinstance(single, list | tuple):
        assert len(fsdp) == len(single), where
        for index, (a, b) in enumerate(zip(fsdp, single, strict=True)):
            assert_matches(a, b, f"{where}/{index}")
        if where.endswith("/params"):  # the optimizer's parameter numbers
            assert fsdp == single, where
    elif isinstance(single, torch.Tensor):
        assert (fsdp.shape, fsdp.dtype) == (single.shape, single.dtype), where
        difference = (fsdp.double() - single.double()).abs().max()
        assert difference <= STATE_TOLERANCE * single.double().abs().max(), where


@pytest.mark.slow
def test_killed_fsdp_run_resumes_exactly(workspace, fsdp_run):
    config = variant(**FSDP, p_max=P_MAX, timing_steps=1)
    paths = paths_for(workspace, "fsdp_resumed")
    assert fsdp_train(workspace, config, "fsdp_resumed", max_steps=3) is None  # "killed" after step 3
    assert not paths.out.exists()
    single = paths_for(workspace, "single_killed")
    assert train(config, BASE, single, max_steps_this_run=3, progress=False) is None
    checkpoint, expected = (torch.load(p.checkpoints / "checkpoint.pt", weights_only=True) for p in (paths, single))
    for part in ("model", "optimizer", "scheduler", "state", "data_order"):
        assert_matches(checkpoint[part], expected[part], part)
    for model in (checkpoint["model"], expected["model"]):  # tied: the same storage, saved once
        head, embedding = model["lm_head.weight"], model["model.embed_tokens.weight"]
        assert head.untyped_storage().data_ptr() == embedding.untyped_storage().data_ptr()
    resumed = fsdp_train(workspace, config, "fsdp_resumed")  # resumes from the step-2 checkpoint
    assert resumed["resumed_from_step"] == 2
    assert [entry["loss"] for entry in resumed["history"]] == [entry["loss"] for entry in fsdp_run["history"]]
    assert max_weight_difference(paths_for(workspace, "fsdp").out, paths.out) == 0.0
    assert not any(paths.checkpoints.iterdir())


def rank_main(argv: list[str]) -> None:
    """One torchrun rank: ``stop N ARGS`` trains N steps and stops (a killed run; the CLI has no such flag);
    ``gradients OUT ARGS`` saves :func:`crafted_gradients` to OUT. ARGS: ``pipelines/train.py``'s."""
    mode, value, *rest = argv
    args = _load_pipeline().parse_args(rest)
    config = load_stage(args.config)
    variant_config = config.train.variants[args.variant]
    paths = TrainPaths(*(Path(path) for path in (args.base_model, args.data, args.out, args.checkpoints, args.report)))
    if mode == "stop":
        train(variant_config, config.base, paths, max_steps_this_run=int(value), progress=False)
        return
    with dist_utils.session(variant_config.distributed, torch.device("cpu")) as ctx:
        run, _ = trainer.build_run(variant_config, config.base, paths, ctx)
        gradients, sums = crafted_gradients(run)
        if ctx.is_main:
            torch.save({"gradients": gradients, "sums": sums}, value)


if __name__ == "__main__":
    rank_main(sys.argv[1:])
