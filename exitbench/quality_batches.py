"""The quality sample past the timing sample, decoded in batches.

Greedy decoding and the lossy methods run on the whole quality sample (hundreds of prompts in the twins), but
only the timing sample's generations are timed or compared token by token with an exact method's. Past it a
generation is read for its tokens alone, so where a method has a batched form whose rows are its batch-1
tokens (:mod:`exitbench.batched`: tested on the tiny model; the ``throughput`` stage counts mismatches on the
real one), those prompts are decoded ``evaluate.quality_batch_size`` at a time: 2.3x greedy's tokens per second
at B = 4 and 4.5x at B = 16 on 2 CPU cores (TOPv2, results/throughput). Their records say so
(``decode.batch_size``) and never count for speed: they are past the prompts a speed-up pairs over, and the
summary's time per token leaves them out.
"""

from __future__ import annotations

from collections.abc import Sequence

from exitbench.batched import BatchedMethod, batched_method
from exitbench.decoding.base import DecodeResult, DecodingMethod, StopRule
from exitbench.stage_plan import BATCHABLE


def batched_form(method: DecodingMethod) -> BatchedMethod | None:
    """The batched form of ``method``: greedy with the measured projection form and early exit; None for every
    other method (an exact method's generations are compared token by token; ``projection: linear`` is about
    its kernel; a transformers peer runs its own generate)."""
    if method.name not in BATCHABLE or method.framework != "exitbench":
        return None
    if getattr(method.options, "projection", "measured") != "measured":
        return None
    return batched_method(method.name, method.model, method.options.model_dump())


def length_batches(indices: Sequence[int], prompt_ids: Sequence[Sequence[int]], size: int) -> list[list[int]]:
    """``indices`` in batches of at most ``size``, neighbours by prompt length (the least padding), each batch in
    sample order."""
    by_length = sorted(indices, key=lambda i: (len(prompt_ids[i]), i))
    return [sorted(by_length[start : start + size]) for start in range(0, len(by_length), size)]


def decode_batch(
    form: BatchedMethod,
    prompt_ids: Sequence[Sequence[int]],
    indices: Sequence[int],
    max_new_tokens: int,
    stop: StopRule,
) -> list[DecodeResult]:
    """One :class:`DecodeResult` per index, as the batch-1 method reports it, but for time: each row gets the
    batch's wall time in proportion to its tokens (a share, not a measurement of its own)."""
    result = form([prompt_ids[i] for i in indices], max_new_tokens, stop)
    total = max(result.num_tokens, 1)
    early = form.label.split("@", 1)[0] == "early_exit"  # greedy's batch-1 records carry no exit layers
    return [
        DecodeResult(
            tokens=list(tokens),
            wall_time_s=result.wall_time_s * len(tokens) / total,
            exit_layers=list(row["exit_layers"]) if early else [],
        )
        for tokens, row in zip(result.tokens, result.rows, strict=True)
    ]
