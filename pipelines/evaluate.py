"""Stage `evaluate@<method>`: one method's labels on every model x task -> results/eval/<method>/<model>/<task>/.

``--method autoregressive`` is the reference stage (greedy on the quality sample); every other method's stage
compares with greedy's records and times greedy again beside itself, sample by sample, in the same process
(:func:`exitbench.evaluation.evaluate_stage`). ``<out>/<method>/stage.json`` lists what the stage evaluated.

Sharded over several GPUs (or processes) with the same command under torchrun:
``torchrun --nproc_per_node 8 pipelines/evaluate.py ...``: each rank generates every method on its slice of
the samples (sample i on rank i % N, on cuda:LOCAL_RANK), then rank 0 merges the records and writes the
summaries, as one process would.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from transformers import AutoConfig

from exitbench.cli import run_stage, set_threads
from exitbench.config import EvaluateConfig, check_exit_layers, load_stage
from exitbench.data.io import atomic_write_json
from exitbench.decoding import parse_options
from exitbench.errors import ExitbenchError
from exitbench.evaluation import evaluate_all
from exitbench.records import Shard
from exitbench.stage_plan import method_stages


def check_method_exit_layers(evaluate: EvaluateConfig, models_dir: Path) -> None:
    """Every ``evaluate.methods.<name>.exit_layer`` (calm: ``min_exit_layer``, speculative: ``draft_layers``
    other than 0) within 1..L-1 of every listed model, L read from the model's config.json: one error before any
    model is loaded or any sample generated."""
    layers = {}
    for name, options in evaluate.methods.items():
        parsed = parse_options(name, options)
        for option in ("exit_layer", "min_exit_layer", "draft_layers"):
            if getattr(parsed, option, None):
                layers[f"evaluate.methods.{name}.{option}"] = getattr(parsed, option)
    for model in evaluate.models:
        if not (models_dir / model / "config.json").exists():
            continue  # evaluate_all names the missing model and the stage that makes it
        num_layers = AutoConfig.from_pretrained(models_dir / model).num_hidden_layers
        for key, layer in layers.items():
            check_exit_layers(key, [layer], num_layers)


def remove_stale_summaries(out: Path, rows: list[dict]) -> list[Path]:
    """Delete the summary JSONs under ``out`` (one stage's folder) that this run did not write (a label, task or
    model no longer in params.yaml, or one from before a retrain), so the report and check read only this run's
    results. The per-sample record files (``*.jsonl``) stay: they are the resumable store, keyed by settings and
    sample."""
    written = {out / row["model"] / row["task"] / f"{row['method']}.json" for row in rows}
    inputs = {"draft_vocab.json", "calibration.json"}  # what evaluate writes beside the summaries for methods
    stale = [path for path in sorted(out.glob("*/*/*.json")) if path not in written and path.name not in inputs]
    for path in stale:
        path.unlink()
    return stale


def launched_shard(device: str) -> Shard:
    """This process's :class:`Shard` under torchrun (RANK, WORLD_SIZE, LOCAL_RANK), else the whole sample list.
    The ranks meet at a gloo barrier after each (model, task); on CUDA each rank takes its own GPU."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return Shard()
    import torch
    import torch.distributed as dist

    if device in ("cuda", "auto") and torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    return Shard(rank=dist.get_rank(), world=world, barrier=dist.barrier)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--method", required=True, help="the registered method whose stage this is")
    parser.add_argument("--config", help="default: build/config/evaluate/<method>.json")
    parser.add_argument("--models-dir", default="models")
    parser.add_argument("--data", default="data")
    parser.add_argument("--train-reports", default="results/train",
                        help="training reports: a model trained with exit_vocab_size drafts over its exits' set")
    parser.add_argument("--out", default="results/eval")
    args = parser.parse_args()
    cfg = load_stage(args.config or f"build/config/evaluate/{args.method}.json")
    set_threads(cfg.base.threads)
    stage_out = Path(args.out) / args.method
    if args.method not in method_stages(cfg):
        stage_out.mkdir(parents=True, exist_ok=True)
        removed = remove_stale_summaries(stage_out, [])
        atomic_write_json(stage_out / "stage.json", {"method": args.method, "labels": [], "rows": []})
        print(f"evaluate@{args.method}: no evaluate.methods label of this profile names it; nothing to run"
              + (f" ({len(removed)} old summaries removed)" if removed else ""))
        return
    for label, options in cfg.evaluate.methods.items():
        try:
            parse_options(label, options)
        except ExitbenchError as err:
            raise ExitbenchError(f"evaluate@{args.method}: evaluate.methods.{label}: {err}") from None
    check_method_exit_layers(cfg.evaluate, Path(args.models_dir))
    shard = launched_shard(cfg.base.device)
    rows = evaluate_all(
        cfg, Path(args.models_dir), Path(args.data), Path(args.out), shard, [args.method], Path(args.train_reports)
    )
    if shard.rank != 0:
        return
    for path in remove_stale_summaries(stage_out, rows):
        print(f"evaluate@{args.method}: removed {path} (not part of this run's settings)")
    labels = sorted({row["method"] for row in rows})
    atomic_write_json(stage_out / "stage.json", {"method": args.method, "labels": labels, "rows": rows})
    for row in rows:
        speedup = row["speedup_vs_greedy"]
        shown = f"{speedup:.2f}x" if speedup is not None else "-"
        where = f"{row['model']:>10} {row['task']:>9} {row['method']:>17}"
        print(f"{where}: {row['time_per_token_ms']:.1f} ms/token, {shown}")


if __name__ == "__main__":
    run_stage(main)
