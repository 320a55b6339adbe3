"""One (model, task, method)'s summary from its per-sample records: quality with intervals, the speed-up paired
per sample with the greedy run timed in the same round, acceptance, and exactness against greedy's tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from exitbench.decoding.base import DecodingMethod
from exitbench.prompts import first_divergence, sample_info
from exitbench.stage_plan import BASELINE, FRAMEWORK_GREEDY
from exitbench.stats import Interval, mean_interval, ratio_interval, speedup_interval
from exitbench.tasks.registry import Sample, Task

#: what a summary states about itself. 1: before these fields; 2: ``primary_metric`` (the task's), ``framework``
#: (whose generate ran: exitbench or transformers) and ``quality_from`` as ``{method, n, why}``
SUMMARY_SCHEMA = 2


def summarize(
    task: Task,
    method: DecodingMethod,
    samples: list[Sample],
    records: list[dict[str, Any]],
    greedy: list[dict[str, Any]] | None,
    *,
    is_baseline: bool = False,
) -> dict[str, Any]:
    """Quality, speed and exactness of one (model, task, method) from its per-sample records.

    ``samples`` is the quality sample and ``greedy`` the baseline's records of it; ``records`` may cover a
    prefix of it only (an exact method's timing sample): speed-up and mismatches compare it with greedy's
    records of the same samples. An exact method other than the baseline (``is_baseline``) reports greedy's
    quality on the whole quality sample (``quality_from`` says so) and its own as ``quality_measured``.
    """
    quality_sample, samples = samples, samples[: len(records)]
    full_greedy, greedy = greedy, greedy[: len(records)] if greedy is not None else None
    ok = [(s, r) for s, r in zip(samples, records, strict=True) if r.get("error") is None]
    quality = task.aggregate([s for s, _ in ok], [r["scores"] for _, r in ok])
    tokens = sum(r["decode"]["num_tokens"] for _, r in ok)
    # a batched record's time is a share of its batch's (exitbench.quality_batches): one-at-a-time records only
    alone = [r["decode"] for _, r in ok if r["decode"].get("batch_size", 1) == 1] or [r["decode"] for _, r in ok]
    seconds, alone_tokens = sum(d["wall_time_s"] for d in alone), sum(d["num_tokens"] for d in alone)
    drafted = sum(r["decode"]["num_drafted"] for _, r in ok)
    rounds = sum(r["decode"]["num_rounds"] for _, r in ok)
    speed = {
        "time_per_token_ms": 1000.0 * seconds / max(alone_tokens, 1),
        "num_tokens": tokens,
        "acceptance_rate": sum(r["decode"]["num_accepted"] for _, r in ok) / drafted if drafted else None,
        "tokens_per_round": tokens / rounds if rounds else None,
        "speedup_vs_greedy": None,
        "ideal_fraction": None,
    }
    if batched := sum(r["decode"].get("batch_size", 1) > 1 for _, r in ok):
        speed["num_batched"] = batched
    exit_layers = [layer for _, r in ok for layer in r["decode"].get("exit_layers", [])]
    if exit_layers:
        speed["avg_exit_layer"] = sum(exit_layers) / len(exit_layers)
    calls = [r["decode"].get("layer_calls") or {} for _, r in ok]
    if routed := sum(c.get("routed", 0) for c in calls):  # a routed method: the share of its routed layers skipped
        speed["skip_rate"] = sum(c.get("skipped", 0) for c in calls) / routed
    correctness: dict[str, Any] = {"exact_claimed": method.exact}
    if greedy is not None:
        timed = timed_pairs(records, greedy)
        m_tokens, m_seconds = sum(m["num_tokens"] for m, _ in timed), sum(m["wall_time_s"] for m, _ in timed)
        g_tokens, g_seconds = sum(g["num_tokens"] for _, g in timed), sum(g["wall_time_s"] for _, g in timed)
        if g_tokens and m_tokens:
            speed["speedup_vs_greedy"] = (g_seconds / g_tokens) / (m_seconds / m_tokens)
        speed["num_timed"] = len(timed)
        correctness.update(_compare(records, greedy))
    summary = {
        "schema_version": SUMMARY_SCHEMA,
        "primary_metric": task.primary_metric,
        "framework": method.framework,
        "num_samples": len(samples),
        "num_failed": len(samples) - len(ok),
        "quality": quality,
        "speed": speed,
        "correctness": correctness,
        "errors": [r["error"] for r in records if r.get("error")][:5],
        "sample_ids": [s.sample_id for s in samples],
        "sample": sample_info(task, samples),
    }
    scored = list(zip(samples, records, strict=True))
    if method.exact and not is_baseline and full_greedy is not None:
        summary.update(
            quality=greedy_quality(task, quality_sample, full_greedy),
            quality_measured=quality,
            quality_from={
                "method": BASELINE,
                "n": len(quality_sample),
                "why": f"exact method: its tokens are greedy's; its own quality on the timing sample of {len(samples)} "
                "is quality_measured",
            },
            num_quality_samples=len(quality_sample),
        )
        scored = list(zip(quality_sample, full_greedy, strict=True))
    summary["intervals"] = intervals(task, scored, records, greedy)
    if not method.exact and greedy is not None and (decode := decode_speedup(records, greedy, task.settings.seed)):
        summary["intervals"]["decode_speedup_vs_greedy"] = decode.to_dict()
    return summary


def intervals(
    task: Task,
    scored: Sequence[tuple[Sample, dict[str, Any]]],
    records: Sequence[dict[str, Any]],
    greedy: Sequence[dict[str, Any]] | None,
) -> dict[str, dict[str, Any]]:
    """95% bootstrap intervals (:mod:`exitbench.stats`, resampling samples) of every number a summary reports.

    Quality metrics over ``scored`` (the (sample, record) pairs the reported quality comes from; TOPv2's
    per-domain exact match as ``per_domain/<domain>``); speed-up paired per sample with greedy's record of
    the same sample; acceptance = accepted / drafted over samples; mismatch rate over compared samples;
    ``fraction_of_greedy/<metric>`` = sum of the method's scores / greedy's over the samples both scored
    (early exit's share of the last layer's quality), pairs resampled together.
    """
    seed = task.settings.seed
    out: dict[str, dict[str, Any]] = {}
    ok = [(sample, record) for sample, record in scored if record.get("error") is None]
    metrics = sorted({key for _, record in ok for key, value in record["scores"].items() if _is_number(value)})
    for metric in metrics:
        out[metric] = mean_interval([float(r["scores"].get(metric, 0.0)) for _, r in ok], seed).to_dict()
    if task.primary_metric in metrics and len({task.stratum(sample.row) for sample, _ in ok}) > 1:
        by_stratum: dict[str, list[float]] = {}
        for sample, record in ok:
            by_stratum.setdefault(task.stratum(sample.row), []).append(float(record["scores"][task.primary_metric]))
        for stratum, values in sorted(by_stratum.items()):
            out[f"per_domain/{stratum}"] = mean_interval(values, seed).to_dict()
    mine = [r for r in records if r.get("error") is None]
    drafted = [(r["decode"]["num_accepted"], r["decode"]["num_drafted"]) for r in mine]
    if sum(d for _, d in drafted):
        out["acceptance_rate"] = ratio_interval([a for a, _ in drafted], [d for _, d in drafted], seed).to_dict()
    if greedy is not None:
        pairs = [
            (r, g) for r, g in zip(records, greedy, strict=True) if r.get("error") is None and g.get("error") is None
        ]
        if (speedup := paired_speedup(records, greedy, seed)) is not None:
            out["speedup_vs_greedy"] = speedup.to_dict()
        if pairs:
            mismatched = [float(first_divergence(r["tokens"], g["tokens"]) is not None) for r, g in pairs]
            out["mismatch_rate"] = mean_interval(mismatched, seed).to_dict()
        for metric in metrics:  # the method's quality as a fraction of greedy's (last layer), paired by sample
            mine_scores = [float(r["scores"].get(metric, 0.0)) for r, _ in pairs]
            greedy_scores = [float(g["scores"].get(metric, 0.0)) for _, g in pairs]
            if pairs and sum(greedy_scores) > 0:
                out[f"fraction_of_greedy/{metric}"] = ratio_interval(mine_scores, greedy_scores, seed).to_dict()
    return out


def reference_of(record: dict[str, Any], baseline: dict[str, Any]) -> dict[str, Any] | None:
    """The greedy run ``record``'s speed-up is paired with: the one timed in its own round (``reference_decode``,
    see :func:`run_methods`; None past the timing sample: no pair). A record from before references were
    recorded per round pairs with greedy's stored record, which was timed in that same round."""
    if "reference_decode" in record:
        return record["reference_decode"]
    return baseline["decode"]


def timed_pairs(
    records: Sequence[dict[str, Any]],
    baseline: Sequence[dict[str, Any]],
    reference: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any] | None] = reference_of,
) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(method decode, reference decode) per sample both generated without error and with tokens, in order
    (the shorter list's prefix); ``reference`` picks the reference decode of a (record, baseline record)."""
    pairs = []
    for r, b in zip(records, baseline, strict=False):
        if r.get("error") is not None or b.get("error") is not None:
            continue
        ref = reference(r, b)
        if ref is not None and r["decode"]["num_tokens"] * ref["num_tokens"]:
            pairs.append((r["decode"], ref))
    return pairs


def paired_speedup(
    records: Sequence[dict[str, Any]],
    baseline: Sequence[dict[str, Any]],
    seed: int,
    reference: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any] | None] = reference_of,
) -> Interval | None:
    """The speed-up over ``baseline`` (time per token ratio) with its interval, prompt by prompt over
    :func:`timed_pairs`; None when there is none."""
    timed = timed_pairs(records, baseline, reference)
    if not timed:
        return None
    return speedup_interval(
        [b["wall_time_s"] for _, b in timed],
        [b["num_tokens"] for _, b in timed],
        [m["wall_time_s"] for m, _ in timed],
        [m["num_tokens"] for m, _ in timed],
        seed,
    )


def decode_speedup(records: Sequence[dict[str, Any]], baseline: Sequence[dict[str, Any]], seed: int) -> Interval | None:
    """The speed-up of the decoding phase alone: ``(wall - prefill) / (tokens - 1)`` of the reference over the
    method's, paired by prompt over the prompts both ran past their first token. A lossy method whose outputs end
    sooner pays its prefill over fewer tokens, which the whole-generation speed-up counts against it."""
    timed = [
        (m, b)
        for m, b in timed_pairs(records, baseline)
        if m["num_tokens"] > 1 and b["num_tokens"] > 1 and "prefill_time_s" in m and "prefill_time_s" in b
    ]
    if not timed:
        return None
    return speedup_interval(
        [b["wall_time_s"] - b["prefill_time_s"] for _, b in timed],
        [b["num_tokens"] - 1 for _, b in timed],
        [m["wall_time_s"] - m["prefill_time_s"] for m, _ in timed],
        [m["num_tokens"] - 1 for m, _ in timed],
        seed,
    )


def framework_reference_of(record: dict[str, Any], own_greedy: dict[str, Any] | None) -> dict[str, Any] | None:
    """The transformers greedy run a peer's record is paired with: the one timed in its round
    (``framework_reference_decode``), else (a record from before those were recorded) ``hf_greedy``'s stored
    record of the same sample and round, when given."""
    if "framework_reference_decode" in record:
        return record["framework_reference_decode"]
    return None if own_greedy is None else own_greedy["decode"]


def add_framework_speedup(
    summary: dict[str, Any],
    records: Sequence[dict[str, Any]],
    own_greedy: Sequence[dict[str, Any] | None],
    seed: int,
) -> None:
    """A peer's speed-up against its own framework's greedy decoding (``hf_greedy``), paired per sample.

    ``speedup_vs_greedy`` compares a transformers peer with exitbench's greedy decoding: what a user of the
    peer gets, engine and kernels included. ``speedup_vs_framework_greedy`` compares it with transformers'
    own greedy ``generate()`` on the same prompts: the method's merit inside its framework. ``own_greedy``:
    ``hf_greedy``'s stored records of the same samples (None where there is none), for older records only.
    """
    baseline = [{"error": None} if g is None else g for g in own_greedy]
    interval = paired_speedup(
        records, baseline, seed, lambda r, b: framework_reference_of(r, b if "decode" in b else None)
    )
    if interval is None:
        return
    summary["speed"]["speedup_vs_framework_greedy"] = interval.estimate
    summary["intervals"]["speedup_vs_framework_greedy"] = interval.to_dict()
    summary["framework_greedy"] = FRAMEWORK_GREEDY


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def greedy_quality(task: Task, samples: Sequence[Sample], greedy: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The baseline's quality on ``samples`` (its failed samples left out), what an exact method's is."""
    kept = [(s, g) for s, g in zip(samples, greedy, strict=True) if g.get("error") is None]
    return task.aggregate([s for s, _ in kept], [g["scores"] for _, g in kept])


def _compare(records: list[dict[str, Any]], greedy: list[dict[str, Any]]) -> dict[str, Any]:
    pairs = [(r, g) for r, g in zip(records, greedy, strict=True) if r.get("error") is None and g.get("error") is None]
    divergences = [first_divergence(r["tokens"], g["tokens"]) for r, g in pairs]
    mismatched = [d for d in divergences if d is not None]
    return {
        "num_compared": len(pairs),
        "num_mismatched": len(mismatched),
        "mismatch_rate": len(mismatched) / len(pairs) if pairs else None,
        "first_divergence_mean": sum(mismatched) / len(mismatched) if mismatched else None,
        "first_divergence_min": min(mismatched) if mismatched else None,
    }
