"""Readability probe: how early does each layer's hidden state, read through the shared head, agree with the last?

For every layer l = 1..L the shared exit head (final norm + LM head, :meth:`EarlyExitModel.logits`) is
applied to the hidden state after layer l, at every position of a text. Per layer we report

- ``top1_agreement``: the fraction of positions whose argmax equals the final layer's argmax;
- ``median_rank``: the median rank (0 = top) of the final layer's top token in layer l's logits;
- ``confidence``: the mean max-softmax probability of layer l's distribution.

A model trained for early exit (LayerSkip) should read out well from earlier layers than the base model.
The fixed probe texts are ordinary English, Python code, and highly predictable text (counting to 60).
From the prepared data, TOPv2 eval rows (prompt ``utterance`` + newline, target ``semantic_parse`` + EOS) add
two entries: ``topv2`` over every position, and ``topv2_target`` over the positions that predict the
target, which are the positions a self-speculative draft is made at when the model answers the prompt.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from exitbench.config import ProbeConfig
from exitbench.errors import ExitbenchError
from exitbench.models.view import EarlyExitModel
from exitbench.tasks.topv2 import build_prompt, build_target

METRICS = ("top1_agreement", "median_rank", "confidence")

ENGLISH_TEXT = (
    "Every morning the small harbour town wakes up slowly. The fishing boats come back before sunrise, and "
    "the crews carry crates of fish up the stone steps to the market hall. By seven o'clock the bakery on "
    "the corner has opened its doors, and the smell of fresh bread drifts along the narrow streets. Children "
    "walk to school in pairs, stopping now and then to watch the gulls fight over scraps near the water. The "
    "old lighthouse is no longer in use; it has become a small museum where visitors can read about the "
    "storms that shaped the coast. In the afternoon the wind usually picks up, and the sailing club takes its "
    "students out past the breakwater. Most evenings end quietly, with families eating together and "
    "neighbours talking on their doorsteps until the light fades. Life here is not exciting, but people who "
    "move away often say that they miss the rhythm of the tides and the sound of the church bells."
)

CODE_TEXT = '''def merge_intervals(intervals):
    """Merge overlapping closed intervals and return them sorted by their start."""
    if not intervals:
        return []
    ordered = sorted(intervals, key=lambda pair: pair[0])
    merged = [list(ordered[0])]
    for start, end in ordered[1:]:
        last = merged[-1]
        if start <= last[1]:
            last[1] = max(last[1], end)
        else:
            merged.append([start, end])
    return [tuple(pair) for pair in merged]


def total_covered(intervals):
    """The total length covered by a list of intervals, counting overlaps once."""
    return sum(end - start for start, end in merge_intervals(intervals))
'''

NUMBERS_TEXT = ", ".join(str(number) for number in range(1, 61))

PROBE_TEXTS = {"english": ENGLISH_TEXT, "code": CODE_TEXT, "numbers": NUMBERS_TEXT}


def _as_sequence(token_ids: torch.Tensor, max_tokens: int) -> torch.Tensor:
    """Token ids [S] or [1, S] -> [1, min(S, max_tokens)]."""
    if token_ids.dim() == 1:
        token_ids = token_ids.unsqueeze(0)
    if token_ids.dim() != 2 or token_ids.shape[0] != 1:
        raise ExitbenchError(f"probe expects one sequence of token ids, got shape {tuple(token_ids.shape)}")
    if token_ids.shape[1] == 0:
        raise ExitbenchError("probe got an empty token sequence; give it a non-empty text")
    return token_ids[:, :max_tokens]


@torch.no_grad()
def layer_statistics(model: EarlyExitModel, token_ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-layer, per-position statistics of one sequence [1, S]: each a float tensor [L, S].

    ``agree`` (0/1), ``rank`` (of the final layer's top token; 0 = top) and ``confidence`` (max softmax).
    Hidden states are kept per layer (small) and read out one layer at a time, so memory stays at one
    [S, V] logits tensor beyond the final layer's.
    """
    ids = token_ids.to(model.device)
    hidden = model.embed(ids)
    rope = model.rope(hidden, 0)
    states = []
    for index in range(model.num_layers):
        hidden = model.layer_forward(index, hidden, rope)
        states.append(hidden)
    final = model.logits(states[-1])[0].float()  # [S, V]
    final_top = final.argmax(dim=-1)  # [S]
    agree, rank, confidence = [], [], []
    for state in states:
        logits = model.logits(state)[0].float()
        target = logits.gather(-1, final_top.unsqueeze(-1))  # [S, 1]
        agree.append((logits.argmax(dim=-1) == final_top).float())
        rank.append((logits > target).sum(dim=-1).float())
        confidence.append(torch.softmax(logits, dim=-1).amax(dim=-1))
    return {"agree": torch.stack(agree), "rank": torch.stack(rank), "confidence": torch.stack(confidence)}


def summarise(stats: Sequence[dict[str, torch.Tensor]]) -> dict[str, list[float]]:
    """Pool the positions of one or more sequences' :func:`layer_statistics` into per-layer lists."""
    agree = torch.cat([item["agree"] for item in stats], dim=1).cpu()
    rank = torch.cat([item["rank"] for item in stats], dim=1).cpu()
    confidence = torch.cat([item["confidence"] for item in stats], dim=1).cpu()
    return {
        "top1_agreement": agree.double().mean(dim=1).tolist(),
        "median_rank": rank.double().quantile(0.5, dim=1).tolist(),
        "confidence": confidence.double().mean(dim=1).tolist(),
    }


def pooled_entry(stats: Sequence[dict[str, torch.Tensor]]) -> dict[str, Any]:
    """One probe entry: how many sequences and positions were pooled, then :func:`summarise`."""
    return {
        "num_texts": len(stats),
        "num_tokens": sum(item["agree"].shape[1] for item in stats),
        **summarise(stats),
    }


def probe_layers(
    model: EarlyExitModel, token_ids: torch.Tensor, max_tokens: int = ProbeConfig().max_tokens
) -> dict[str, list[float]]:
    """Per-layer readability of one token sequence ([S] or [1, S], cut to ``max_tokens``).

    Returns ``{"top1_agreement", "median_rank", "confidence"}``, each a list over layers 1..L.
    """
    return summarise([layer_statistics(model, _as_sequence(token_ids, max_tokens))])


def probe_many(
    model: EarlyExitModel, sequences: Sequence[torch.Tensor], max_tokens: int = ProbeConfig().max_tokens
) -> dict[str, list[float]]:
    """Like :func:`probe_layers` over several sequences (each cut to ``max_tokens``), positions pooled."""
    if not sequences:
        raise ExitbenchError("probe got no sequences")
    return summarise([layer_statistics(model, _as_sequence(ids, max_tokens)) for ids in sequences])


def load_topv2_pairs(path: str | Path, limit: int) -> list[tuple[str, str]]:
    """The first ``limit`` rows of a prepared TOPv2 file as (prompt, target), formatted as the task does."""
    path = Path(path)
    if not path.is_file():
        raise ExitbenchError(f"{path}: not found; run `dvc repro prepare_data` first, or drop --data")
    pairs: list[tuple[str, str]] = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if len(pairs) >= limit:
                break
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                raise ExitbenchError(f"{path}:{number}: not valid JSON; re-run `dvc repro prepare_data`") from None
            utterance, parse = row.get("utterance"), row.get("semantic_parse")
            if not isinstance(utterance, str) or not isinstance(parse, str):
                raise ExitbenchError(f"{path}:{number}: a row needs string 'utterance' and 'semantic_parse'")
            pairs.append((build_prompt(row), build_target(row)))
    if not pairs:
        raise ExitbenchError(f"{path}: no rows; re-run `dvc repro prepare_data`")
    return pairs


def probe_prompt_target(
    model: EarlyExitModel,
    tokenizer: Any,
    pairs: Sequence[tuple[str, str]],
    name: str,
    max_tokens: int = ProbeConfig().max_tokens,
) -> dict[str, dict[str, Any]]:
    """Probe prompt + target + EOS sequences, tokenized as training and decoding see them.

    Two entries: ``name`` pools every position; ``{name}_target`` only the positions whose next token is a
    target token or the EOS: the positions a decoder generates from when given the prompt, so the ones
    whose agreement drives a self-speculative draft's acceptance on this task.
    """
    eos = tokenizer.eos_token_id
    every, targets = [], []
    for prompt, target in pairs:
        prompt_ids = tokenizer(prompt)["input_ids"]
        target_ids = tokenizer(target, add_special_tokens=False)["input_ids"] + ([eos] if eos is not None else [])
        ids = _as_sequence(torch.tensor([*prompt_ids, *target_ids], dtype=torch.long), max_tokens)
        stats = layer_statistics(model, ids)
        every.append(stats)
        first, last = len(prompt_ids) - 1, ids.shape[1] - 1  # position p predicts token p + 1
        if last > first:
            targets.append({key: value[:, first:last] for key, value in stats.items()})
    if not targets:
        raise ExitbenchError(f"probe {name}: every sequence was cut before its target; raise probe.max_tokens")
    return {name: pooled_entry(every), f"{name}_target": pooled_entry(targets)}


def probe_texts(
    model: EarlyExitModel,
    tokenizer: Any,
    texts: dict[str, str | list[str]],
    max_tokens: int = ProbeConfig().max_tokens,
) -> dict[str, dict[str, Any]]:
    """Probe each named text (or list of texts, pooled); each entry also records its token/text counts."""
    results: dict[str, dict[str, Any]] = {}
    for kind, value in texts.items():
        items = [value] if isinstance(value, str) else list(value)
        sequences = [
            _as_sequence(torch.tensor(tokenizer(text)["input_ids"], dtype=torch.long), max_tokens) for text in items
        ]
        entry: dict[str, Any] = {"num_texts": len(items), "num_tokens": sum(ids.shape[1] for ids in sequences)}
        entry.update(probe_many(model, sequences, max_tokens))
        results[kind] = entry
    return results
