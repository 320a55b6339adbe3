"""Measure what decoding the quality sample in batches gains (exitbench.quality_batches, plan.BATCH_GAIN_AT_8).

For each task, greedy and early exit run the same prompts one at a time and ``--batch-size`` at a time, batch by
batch interleaved in one process (length-sorted batches, as evaluate forms them), and the script prints and writes
the wall-time ratio and how many rows equal their batch-1 tokens. TOPv2 runs without its stop rule (every prompt
to ``max_new_tokens``: the untrained base model would stop after a token or two, where a finetune writes a parse).

    python scripts/batch_gain.py --models models --model base --data data --out /tmp/batch_gain.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from exitbench.config import load
from exitbench.decoding import build_method
from exitbench.decoding.base import StopRule
from exitbench.evaluation import load_context
from exitbench.prompts import encode_prompt, load_samples, stop_rule, uses_chat_template
from exitbench.quality_batches import batched_form, decode_batch, length_batches
from exitbench.tasks.registry import TaskSettings, build_task


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--models", type=Path, default=Path("models"))
    parser.add_argument("--model", default="base")
    parser.add_argument("--data", type=Path, default=Path("data"))
    parser.add_argument("--tasks", nargs="+", default=["topv2:64", "humaneval:20", "cnndm:16"], help="task:prompts")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--exit-layer", type=int, default=15)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    cfg = load(args.params)
    torch.set_num_threads(cfg.base.threads or torch.get_num_threads())
    ctx = load_context(cfg, args.models, args.model)
    results = {}
    for spec in args.tasks:
        name, count = spec.split(":")
        task = build_task(name, TaskSettings(cfg.base.seed, cfg.evaluate.sandbox_timeout_s))
        samples = load_samples(task, args.data, int(count))
        chat = uses_chat_template(cfg, args.model, name)
        ids = [encode_prompt(ctx.tokenizer, s.prompt, chat) for s in samples]
        stop = StopRule() if name == "topv2" else stop_rule(ctx.tokenizer, task)
        max_new = cfg.evaluate.tasks[name].max_new_tokens
        for label, options in (("autoregressive", {}), ("early_exit", {"exit_layer": args.exit_layer})):
            method = build_method(label, ctx.model, options)
            form = batched_form(method)
            assert form is not None
            method.generate(ids[0], 4, stop)  # warm both forms
            form(ids[:2], 4, stop)
            alone_s = batched_s = 0.0
            same = tokens = 0
            for chunk in length_batches(range(len(ids)), ids, args.batch_size):
                start = time.perf_counter()
                one = [method.generate(ids[i], max_new, stop).tokens for i in chunk]
                alone_s += time.perf_counter() - start
                start = time.perf_counter()
                many = [r.tokens for r in decode_batch(form, ids, chunk, max_new, stop)]
                batched_s += time.perf_counter() - start
                same += sum(a == b for a, b in zip(one, many, strict=True))
                tokens += sum(len(t) for t in one)
            row = {"prompts": len(ids), "batch_size": args.batch_size, "tokens": tokens, "alone_s": round(alone_s, 2),
                   "batched_s": round(batched_s, 2), "gain": round(alone_s / batched_s, 2), "rows_identical": same}
            results[f"{name}/{label}"] = row
            print(name, label, row, flush=True)
    args.out.write_text(json.dumps({"model": args.model, "threads": torch.get_num_threads(), "results": results},
                                   indent=1))


if __name__ == "__main__":
    main()
