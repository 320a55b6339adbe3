"""What ``torch.compile`` would buy a training step on this machine: the variant's step, eager vs compiled layers.

The trainer's objective (``EarlyExitObjective``, fused head loss, the variant's exit sub-vocabulary) on two copies
of the prepared base model; in one, each decoder layer's forward (``objective.layer_forwards``) is compiled
(inductor; dynamic shapes where layer dropout changes a layer's rows from step to step). One micro-batch of a
``train.variants`` entry (:mod:`training_batch`), forward + backward under the variant's bf16 autocast, with the
step's exits and layer-dropout mask as the trainer plans them (``step_plan``'s schedules, steps spread over the
run), compiled then eager inside every repeat (interleaved). Reported: the first compiled step (compiling), the
medians over the second half of the repeats (after the recompiles dynamic shapes cause) and every time.
Not a DVC stage. Run it with nothing else on the machine.

    python scripts/compile_timing.py --variant plain --repeats 10 --out /tmp/compile_plain.json
    python scripts/compile_timing.py --variant layerskip --repeats 12 --out /tmp/compile_layerskip.json
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from training_batch import timing_parser, training_batch  # scripts/; puts the repository on sys.path

from exitbench.models.load import load_causal_lm
from exitbench.provenance import provenance
from exitbench.training.early_exit_loss import IGNORE_INDEX, EarlyExitObjective, exit_scales, normalized_weights
from exitbench.training.layer_dropout import keep_mask
from exitbench.training.schedules import dropout_rates, enabled_exits
from exitbench.training.trainer import exit_vocabulary, freeze_embeddings


def main() -> None:
    args = timing_parser(__doc__.splitlines()[0], variant="plain", repeats=5).parse_args()
    batch = training_batch(args)
    cfg, v, base, ids, labels = batch.cfg, batch.variant, batch.base, batch.ids, batch.labels
    models = [load_causal_lm(base, "float32", "cpu").train() for _ in range(2)]
    for model in models if v.freeze_embeddings else []:
        freeze_embeddings(model)
    eager, compiled = (EarlyExitObjective(model) for model in models)
    if v.exit_vocab_size:
        vocab = exit_vocabulary(batch.corpus.examples, v.exit_vocab_size, [batch.tokenizer.eos_token_id])
        for objective in (eager, compiled):
            objective.set_exit_vocab(vocab)
    layers = eager.view.num_layers
    torch._dynamo.config.cache_size_limit = max(64, layers)  # one graph (and its recompiles) per layer
    compiled.layer_forwards = [torch.compile(forward) for forward in compiled.layer_forwards]
    scales = exit_scales(v.recipe, layers, v.e_scale)
    num_tokens = int((labels != IGNORE_INDEX).sum())
    generator = torch.Generator().manual_seed(cfg.base.seed)

    def step(objective: EarlyExitObjective, keep: torch.Tensor, weights: dict[int, float]) -> float:
        started = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=v.autocast_bf16), sdpa_kernel(SDPBackend.MATH):
            loss, _ = objective(ids, labels, keep, weights, num_tokens)
        loss.backward()
        seconds = time.perf_counter() - started
        objective.zero_grad(set_to_none=True)
        return seconds

    times: dict[str, list[float]] = {"compiled": [], "eager": []}
    for repeat in range(args.repeats):
        at = repeat * v.steps // args.repeats  # the schedules' step this repeat plans as
        keep = keep_mask(dropout_rates(at, v.steps, layers, v.p_max, v.dropout_schedule), ids.shape[0], generator)
        weights = normalized_weights(scales, enabled_exits(v.curriculum, at, v.steps, layers, v.rotation))
        for name, objective in (("compiled", compiled), ("eager", eager)):
            times[name].append(step(objective, keep, weights))
        print(f"repeat {repeat + 1}/{args.repeats} (step {at}): eager {times['eager'][-1]:.2f} s, "
              f"compiled {times['compiled'][-1]:.2f} s", flush=True)  # fmt: skip
    settled = args.repeats // 2
    medians = {name: statistics.median(values[settled:]) for name, values in times.items()}
    result = {
        "what": "forward+backward seconds of the variant's step, eager vs compiled layer forwards, interleaved",
        "variant": args.variant,
        "rows": int(ids.shape[0]),
        "seq_len": int(ids.shape[1]),
        "first_compiled_step_s": times["compiled"][0],
        "median_s": medians,
        "median_over": f"repeats {settled + 1}-{args.repeats}",
        "seconds": times,
        "n": args.repeats - settled,
        "speedup": medians["eager"] / medians["compiled"],
        "provenance": provenance(cfg.model_dump(mode="json"), dtype="float32"),
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"eager {medians['eager']:.2f} s, compiled {medians['compiled']:.2f} s: {result['speedup']:.2f}x (median of "
          f"repeats {settled + 1}-{args.repeats}; first compiled step {times['compiled'][0]:.1f} s)")  # fmt: skip


if __name__ == "__main__":
    main()
