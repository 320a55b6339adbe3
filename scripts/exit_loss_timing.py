"""Training throughput of the early-exit loss: whole-vocabulary exits vs exits over a sub-vocabulary.

One micro-batch of a ``train.variants`` entry's corpus (its batch size, sequence length and mixture), timed
forward + backward under the variant's settings (bf16 autocast, layer dropout, frozen embeddings) for:

- ``plain``: the last layer's loss only (the control's step);
- ``rotational`` and ``every_exit`` curricula, each with the whole vocabulary and with ``--exit-vocab`` ids
  (the corpus's most frequent target tokens, :func:`exitbench.training.trainer.exit_vocabulary`).

Settings are timed in turn inside every repeat (interleaved, so a change of load hits all of them); the
rotational ones cycle through the rotation's steps across repeats (their number of head evaluations varies).
Reported: median seconds per forward + backward and loss tokens trained per second; the optimizer step is the
same for all and left out. Not a DVC stage: it measures what ``exit_vocab_size`` buys (docs/training.md,
"Training cost on a CPU").
Run it with nothing else on the machine.

    python scripts/exit_loss_timing.py --variant layerskip --exit-vocab 2048 --repeats 4 --out /tmp/exit_timing.json
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
from exitbench.training.early_exit_loss import EarlyExitObjective, exit_scales, normalized_weights
from exitbench.training.layer_dropout import keep_mask
from exitbench.training.schedules import dropout_rates, enabled_exits
from exitbench.training.trainer import exit_vocab_coverage, exit_vocabulary, freeze_embeddings


def main() -> None:
    parser = timing_parser(__doc__.splitlines()[0], variant="layerskip", repeats=4)
    parser.add_argument("--exit-vocab", type=int, default=2048)
    args = parser.parse_args()
    batch = training_batch(args)
    cfg, v, tokenizer, corpus = batch.cfg, batch.variant, batch.tokenizer, batch.corpus
    ids, labels = batch.ids, batch.labels
    causal_lm = load_causal_lm(batch.base, "float32", "cpu").train()
    if v.freeze_embeddings:
        freeze_embeddings(causal_lm)
    vocab = exit_vocabulary(corpus.examples, args.exit_vocab, [tokenizer.eos_token_id])
    rows = corpus.examples[: v.batch_size]
    num_tokens = int((labels != -100).sum())
    objective = EarlyExitObjective(causal_lm)
    layers = objective.view.num_layers
    scales = exit_scales("layerskip", layers, v.e_scale)
    generator = torch.Generator().manual_seed(cfg.base.seed)

    def fwd_bwd(exits: list[int], sub: bool, keep: torch.Tensor) -> float:
        objective.set_exit_vocab(vocab if sub else None)
        weights = normalized_weights(scales, exits)
        autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=v.autocast_bf16)
        started = time.perf_counter()
        with autocast, sdpa_kernel(SDPBackend.MATH):
            loss, _ = objective(ids, labels, keep, weights, num_tokens)
        loss.backward()
        seconds = time.perf_counter() - started
        objective.zero_grad(set_to_none=True)
        return seconds

    every = list(range(layers))
    settings = {
        "plain": lambda step: ([layers - 1], False),
        "rotational": lambda step: (enabled_exits("rotational", step, v.steps, layers, v.rotation), False),
        "rotational_subvocab": lambda step: (enabled_exits("rotational", step, v.steps, layers, v.rotation), True),
        "every_exit": lambda step: (every, False),
        "every_exit_subvocab": lambda step: (every, True),
    }
    times: dict[str, list[float]] = {name: [] for name in settings}
    head_evaluations: dict[str, list[int]] = {name: [] for name in settings}
    no_dropout = torch.ones(layers, len(rows), dtype=torch.bool)
    fwd_bwd([layers - 1], False, no_dropout)  # warm-ups
    fwd_bwd(every, True, no_dropout)
    for repeat in range(args.repeats):
        for step in (2 * repeat, 2 * repeat + 1):
            keep = keep_mask(dropout_rates(step, v.steps, layers, v.p_max, v.dropout_schedule), len(rows), generator)
            for name, plan in settings.items():
                if name.startswith(("plain", "every")) and step % 2:
                    continue  # one per repeat: their exits do not depend on the step
                exits, sub = plan(step)
                times[name].append(fwd_bwd(exits, sub, no_dropout if name == "plain" else keep))
                head_evaluations[name].append(len(normalized_weights(scales, exits)))
            print(f"repeat {repeat + 1}/{args.repeats} step {step}: " + ", ".join(
                f"{name} {values[-1]:.2f}s" for name, values in times.items() if values), flush=True)
    reference = statistics.median(times["rotational"])
    result = {
        "what": "forward+backward seconds of one micro-batch, interleaved per repeat; optimizer step excluded",
        "variant": args.variant,
        "rows": len(rows),
        "loss_tokens": num_tokens,
        "exit_vocab": {"size": len(vocab), "target_coverage": exit_vocab_coverage(corpus.examples, vocab)},
        "repeats": args.repeats,
        "settings": {
            name: {
                "median_s": statistics.median(values),
                "n": len(values),
                "min_s": min(values),
                "max_s": max(values),
                "loss_tokens_per_s": num_tokens / statistics.median(values),
                "head_evaluations_mean": statistics.fmean(head_evaluations[name]),
                "speed_vs_rotational": reference / statistics.median(values),
            }
            for name, values in times.items()
        },
        "provenance": provenance(cfg.model_dump(mode="json"), dtype="float32"),
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    for name, row in result["settings"].items():
        print(
            f"{name:22s} {row['median_s']:.2f} s  {row['loss_tokens_per_s']:.0f} loss tokens/s  "
            f"x{row['speed_vs_rotational']:.2f} vs rotational  ({row['head_evaluations_mean']:.1f} heads, n={row['n']})"
        )


if __name__ == "__main__":
    main()
