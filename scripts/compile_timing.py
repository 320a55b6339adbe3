"""What ``torch.compile`` would buy a training step on this machine: one micro-batch, eager vs compiled layers.

Two copies of the prepared base model; in one every decoder layer is compiled (inductor, static shapes). One
micro-batch of a ``train.variants`` entry's corpus (its batch size, sequence length and mixture), forward +
backward of the last layer's loss (the ``plain`` step, no KV cache) under the variant's bf16 autocast, timed
eager then compiled inside every repeat (interleaved). Reported: the one-time compile + first step and the
median seconds of each. Not a DVC stage, and the trainer's own step (layer dropout's per-row skipping changes the
shapes from step to step, so compiled layers would recompile) is not what it times: it bounds the gain.
Run it with nothing else on the machine.

    python scripts/compile_timing.py --variant plain --repeats 5 --out /tmp/compile_timing.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from exitbench.cli import set_threads  # noqa: E402
from exitbench.config import load  # noqa: E402
from exitbench.models.load import load_causal_lm, load_tokenizer  # noqa: E402
from exitbench.provenance import provenance  # noqa: E402
from exitbench.training.corpora import build_corpus, collate  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--variant", default="plain")
    parser.add_argument("--models", default="models", help="folder holding the prepared base model (models/base)")
    parser.add_argument("--data", default="data")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    cfg = load(args.params)
    set_threads(cfg.base.threads)
    v = cfg.train.variants[args.variant]
    base = Path(args.models) / "base"
    tokenizer = load_tokenizer(base)
    corpus = build_corpus(v.corpus, Path(args.data), tokenizer, v.seq_len, 4 * v.batch_size, cfg.base.seed)
    ids, labels = collate(corpus.examples[: v.batch_size], tokenizer.pad_token_id or 0)
    eager = load_causal_lm(base, "float32", "cpu").train()
    compiled = load_causal_lm(base, "float32", "cpu").train()
    torch._dynamo.config.cache_size_limit = max(64, len(compiled.model.layers))  # one graph per layer
    for layer in compiled.model.layers:
        layer.compile(dynamic=False)

    def step(model: torch.nn.Module) -> float:
        started = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=v.autocast_bf16):
            loss = model(input_ids=ids, labels=labels, use_cache=False).loss
        loss.backward()
        seconds = time.perf_counter() - started
        model.zero_grad(set_to_none=True)
        return seconds

    first = step(compiled)
    step(eager)  # warm-up
    times: dict[str, list[float]] = {"eager": [], "compiled": []}
    for repeat in range(args.repeats):
        times["eager"].append(step(eager))
        times["compiled"].append(step(compiled))
        print(f"repeat {repeat + 1}/{args.repeats}: eager {times['eager'][-1]:.2f} s, "
              f"compiled {times['compiled'][-1]:.2f} s", flush=True)  # fmt: skip
    medians = {name: statistics.median(values) for name, values in times.items()}
    result = {
        "what": "forward+backward seconds of one plain micro-batch, eager vs compiled decoder layers, interleaved",
        "variant": args.variant,
        "rows": int(ids.shape[0]),
        "seq_len": int(ids.shape[1]),
        "compile_and_first_step_s": first,
        "median_s": medians,
        "seconds": times,
        "n": args.repeats,
        "speedup": medians["eager"] / medians["compiled"],
        "provenance": provenance(cfg.model_dump(mode="json"), dtype="float32"),
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"eager {medians['eager']:.2f} s, compiled {medians['compiled']:.2f} s: {result['speedup']:.2f}x "
          f"(n={args.repeats}; compile + first step {first:.1f} s)")  # fmt: skip


if __name__ == "__main__":
    main()
