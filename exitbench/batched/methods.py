"""Batched greedy, early exit, self-speculation and CALM over B prompts of different lengths.

Every method decodes all live rows in lockstep calls of :mod:`exitbench.batched.forward` and drops a row
from the batch (its cache rows too) as soon as it is finished, so no work is spent on finished rows.
Each row's tokens are those of the batch-1 method on that prompt (tested on the tiny model, measured on
the real one by the `throughput` stage):

- ``autoregressive``: one full-model step per round for every live row.
- ``early_exit``: the same with layers ``0..E-1`` and the shared head (LayerSkip §4.2).
- ``self_speculative``: every live row drafts ``d`` tokens through layers ``0..E-1``, then one call
  verifies all rows' ``d + 1`` positions through layers ``E..L-1`` (LayerSkip §4.3); each row accepts its
  own prefix, so rows advance by different amounts (their next positions differ; the cache needs no
  cropping, see :mod:`exitbench.batched.cache`). Drafting does not stop at EOS inside a round (a row's
  tokens are cut at its stop point afterwards), so a batched round may draft past the batch-1 one.
- ``calm``: per-token exits by the softmax-response confidence and CALM Eq. 5's threshold, per row.
  The batch runs a layer while any live row still needs it, so a step costs the deepest row's depth
  (rows are not regrouped); a row that exited rides along with its exit state frozen, which gives its
  skipped layers exactly the K/V of state propagation (CALM §3.3.1, the ``propagate`` strategy). When
  every row has exited, the remaining layers get their K/V from the frozen states without attention
  or MLP, as in the batch-1 method.

What a batch costs beyond useful work is counted in :attr:`BatchResult.work`: padded prefill positions,
rejected draft positions (self-speculation), layers run for rows that had already exited (CALM).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from exitbench.batched import forward as bf
from exitbench.batched.cache import BatchKVCache
from exitbench.confidence import softmax_response
from exitbench.decoding.base import MethodOptions, StopRule, parse_options
from exitbench.decoding.calm import CalmOptions, candidate_layers, step_threshold
from exitbench.decoding.draft_verify import DraftHead
from exitbench.decoding.self_speculative import SelfSpeculativeOptions
from exitbench.decoding.steps import finish
from exitbench.errors import ExitbenchError
from exitbench.models.view import EarlyExitModel


@dataclass
class BatchResult:
    """One batch's generations (one token list per prompt, in prompt order) and what they cost."""

    tokens: list[list[int]]
    wall_time_s: float = 0.0
    #: per-row counters: drafted / accepted / rounds (self-speculation), exit_layers (early exit, CALM)
    rows: list[dict[str, Any]] = field(default_factory=list)
    #: batch counters: prefill and padded positions, rejected drafts, token-layers run after an exit
    work: dict[str, int] = field(default_factory=dict)
    #: CALM: the layers the batch ran at each decoding step (the deepest live row's exit)
    step_depths: list[int] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(len(row) for row in self.tokens)


class Rows:
    """The live rows of a batch: their tokens, next positions and stop bookkeeping."""

    def __init__(self, prompts: Sequence[Sequence[int]], first: torch.Tensor, max_new_tokens: int, stop: StopRule):
        self.prompt_lens = [len(p) for p in prompts]
        self.tokens: list[list[int]] = [[int(t)] for t in first.tolist()]
        self.live = list(range(len(prompts)))  # indices into the prompts, in cache-row order
        self.checked = [0] * len(prompts)
        self.max_new_tokens, self.stop = max_new_tokens, stop

    def last_tokens(self, device: torch.device) -> torch.Tensor:
        """``[B_live, 1]``: each live row's last committed token (not yet in the cache)."""
        return torch.tensor([[self.tokens[i][-1]] for i in self.live], dtype=torch.long, device=device)

    def positions(self, device: torch.device) -> torch.Tensor:
        """``[B_live]``: the position of each live row's last committed token."""
        return torch.tensor([self.prompt_lens[i] + len(self.tokens[i]) - 1 for i in self.live], device=device)

    def finished(self, row: int) -> bool:
        tokens = self.tokens[row]
        done = len(tokens) >= self.max_new_tokens or self.stop.cut(tokens, self.checked[row]) is not None
        self.checked[row] = len(tokens)
        return done

    def retire(self, cache: BatchKVCache) -> bool:
        """Drop finished rows from the batch and the cache; whether any row is still live."""
        keep = [slot for slot, row in enumerate(self.live) if not self.finished(row)]
        if len(keep) < len(self.live):
            self.live = [self.live[slot] for slot in keep]
            if keep:
                cache.keep(keep)
        return bool(self.live)

    def result(self) -> list[list[int]]:
        return [finish(tokens, self.max_new_tokens, self.stop) for tokens in self.tokens]


def _start(model: EarlyExitModel, prompts: Sequence[Sequence[int]], max_new_tokens: int, slack: int,
           last_layer: int | None = None) -> tuple[BatchKVCache, torch.Tensor, dict[str, int]]:
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ExitbenchError("batched decoding: every prompt needs at least one token")
    cache = bf.new_batch_cache(model, len(prompts), max(len(p) for p in prompts) + max_new_tokens + slack)
    first = bf.prefill(model, cache, prompts, last_layer)
    longest = max(len(p) for p in prompts)
    padded = sum(longest - len(p) for p in prompts)
    work = {"prefill_positions": longest * len(prompts), "padded_prefill_positions": padded}
    return cache, first, work


def _step_all(
    model: EarlyExitModel, prompts: Sequence[Sequence[int]], max_new_tokens: int, stop: StopRule, layers: int
) -> BatchResult:
    """Greedy decoding through the first ``layers`` layers (all of them: autoregressive; E: early exit)."""
    cache, first, work = _start(model, prompts, max_new_tokens, 1, layers)
    rows = Rows(prompts, first, max_new_tokens, stop)
    while rows.retire(cache):
        positions = rows.positions(model.device).unsqueeze(1)
        hidden = bf.forward_layers(model, model.embed(rows.last_tokens(model.device)), 0, layers, positions, cache)
        for slot, token in enumerate(model.logits(hidden)[:, -1].argmax(-1).tolist()):
            rows.tokens[rows.live[slot]].append(token)
    tokens = rows.result()
    return BatchResult(tokens, rows=[{"exit_layers": [layers] * len(t)} for t in tokens], work=work)


def autoregressive(model: EarlyExitModel, options: MethodOptions, prompts: Sequence[Sequence[int]],
                   max_new_tokens: int, stop: StopRule) -> BatchResult:
    return _step_all(model, prompts, max_new_tokens, stop, model.num_layers)


def early_exit(model: EarlyExitModel, options: MethodOptions, prompts: Sequence[Sequence[int]],
               max_new_tokens: int, stop: StopRule) -> BatchResult:
    return _step_all(model, prompts, max_new_tokens, stop, options.exit_layer)  # type: ignore[attr-defined]


def _propose(head: DraftHead, hidden: torch.Tensor) -> torch.Tensor:
    """Each row's draft token ``[B]`` from its exit state ``[B, 1, H]`` (full or sub-vocabulary head)."""
    if head.ids is None:
        return head.model.logits(hidden)[:, -1].argmax(-1)
    return head.ids[head.model.logits_subset(hidden, head.weight)[:, -1].argmax(-1)]


def self_speculative(model: EarlyExitModel, options: SelfSpeculativeOptions, prompts: Sequence[Sequence[int]],
                     max_new_tokens: int, stop: StopRule) -> BatchResult:
    exit_layer, d = options.exit_layer, options.num_speculations
    head = DraftHead(model, options.draft_vocab_file)
    cache, first, work = _start(model, prompts, max_new_tokens, d + 2)
    work["rejected_draft_positions"] = 0
    rows = Rows(prompts, first, max_new_tokens, stop)
    counters = [{"drafted": 0, "accepted": 0, "rounds": 0} for _ in prompts]
    offsets = torch.arange(d + 1, device=model.device)
    while rows.retire(cache):
        start = rows.positions(model.device)  # [B]
        token = rows.last_tokens(model.device)  # [B, 1]
        states, drafts = [], []
        for step in range(d + 1):
            hidden = bf.forward_layers(model, model.embed(token), 0, exit_layer, (start + step).unsqueeze(1), cache)
            states.append(hidden)
            if step < d:  # the last draft only needs its layers 0..E-1 (no head), as in the batch-1 round
                token = _propose(head, hidden).unsqueeze(1)
                drafts.append(token)
        verify_positions = start.unsqueeze(1) + offsets  # [B, d + 1]
        verify_in = torch.cat(states, dim=1)  # [B, d + 1, H]: the exit states of `last` and the d drafts
        verified = bf.forward_layers(model, verify_in, exit_layer, model.num_layers, verify_positions, cache)
        choice = model.logits(verified).argmax(-1)  # [B, d + 1]: the full model's token after each position
        drafted = torch.cat(drafts, dim=1)  # [B, d]
        accepted = (drafted == choice[:, :d]).int().cumprod(dim=1).sum(dim=1).tolist()
        for slot, row in enumerate(rows.live):
            a = accepted[slot]
            rows.tokens[row].extend([*drafted[slot, :a].tolist(), int(choice[slot, a])])
            counters[row]["drafted"] += d
            counters[row]["accepted"] += a
            counters[row]["rounds"] += 1
            work["rejected_draft_positions"] += d - a
    return BatchResult(rows.result(), rows=counters, work=work)


def calm(model: EarlyExitModel, options: CalmOptions, prompts: Sequence[Sequence[int]],
         max_new_tokens: int, stop: StopRule) -> BatchResult:
    if options.measure != "softmax" or options.kv_strategy != "propagate":
        raise ExitbenchError(
            f"batched calm: measure '{options.measure}', kv_strategy '{options.kv_strategy}' has no batched form; "
            "use measure: softmax, kv_strategy: propagate"
        )
    num_layers = model.num_layers
    candidates = candidate_layers(num_layers, options.min_exit_layer, options.exit_every)
    cache, first, work = _start(model, prompts, max_new_tokens, 1)
    work["carried_token_layers"] = 0  # layers run for rows that had already exited (wasted by batching)
    work["run_token_layers"] = 0
    rows = Rows(prompts, first, max_new_tokens, stop)
    exits: list[list[int]] = [[num_layers] for _ in prompts]
    result = BatchResult([], work=work)
    while rows.retire(cache):
        t = len(rows.tokens[rows.live[0]])  # rows decode in lockstep: every live row has t tokens
        threshold = step_threshold(options.threshold, t, max_new_tokens, options.tau)
        positions = rows.positions(model.device).unsqueeze(1)
        last = rows.last_tokens(model.device)
        tokens, depths = _calm_step(model, cache, last, positions, threshold, candidates, work)
        for slot, row in enumerate(rows.live):
            rows.tokens[row].append(tokens[slot])
            exits[row].append(depths[slot])
        result.step_depths.append(max(depths))
    result.tokens = rows.result()
    result.rows = [{"exit_layers": exits[i][: len(result.tokens[i])]} for i in range(len(prompts))]
    return result


def _calm_step(
    model: EarlyExitModel, cache: BatchKVCache, token: torch.Tensor, positions: torch.Tensor, threshold: float,
    candidates: frozenset[int], work: dict[str, int],
) -> tuple[list[int], list[int]]:
    """One CALM token for every live row: (next tokens, exit layers)."""
    num_layers, batch = model.num_layers, token.shape[0]
    hidden = model.embed(token)
    rope = bf.rope_at(model, hidden, positions)
    exited = torch.zeros(batch, dtype=torch.bool, device=model.device)
    depth = [num_layers] * batch
    chosen = [0] * batch
    count = 0
    for index in range(num_layers):
        out = bf.layer_forward(model, index, hidden, rope, positions, cache)
        hidden = torch.where(exited.view(-1, 1, 1), hidden, out)  # exited rows keep their exit state
        work["carried_token_layers"] += int(exited.sum())
        count = index + 1
        if count == num_layers or count not in candidates or threshold == math.inf:
            continue
        live = (~exited).nonzero().flatten()
        logits = model.logits(hidden[live])
        confident = softmax_response(logits)[:, -1] > threshold
        for slot, token_id in zip(live[confident].tolist(), logits[confident][:, -1].argmax(-1).tolist(), strict=True):
            exited[slot], depth[slot], chosen[slot] = True, count, token_id
        if bool(exited.all()):
            break
    work["run_token_layers"] += batch * count  # what the batch ran: every live row, to the deepest exit
    for index in range(count, num_layers):  # every row exited before the last layer: propagate the rest
        bf.write_kv_only(model, index, hidden, rope, positions, cache)
    rest = (~exited).nonzero().flatten()
    if rest.numel():
        for slot, token_id in zip(rest.tolist(), model.logits(hidden[rest])[:, -1].argmax(-1).tolist(), strict=True):
            chosen[slot] = token_id
    return chosen, depth


BatchedFn = Callable[[EarlyExitModel, Any, Sequence[Sequence[int]], int, StopRule], BatchResult]

#: method name -> its batched form; options are the batch-1 method's (validated by its Options)
BATCHED: dict[str, BatchedFn] = {
    "autoregressive": autoregressive,
    "early_exit": early_exit,
    "self_speculative": self_speculative,
    "calm": calm,
}


@dataclass(frozen=True)
class BatchedMethod:
    """A batched method bound to its model and validated options; call it on a batch of prompts."""

    label: str
    fn: BatchedFn
    model: EarlyExitModel
    options: MethodOptions

    @torch.inference_mode()
    def __call__(
        self, prompts: Sequence[Sequence[int]], max_new_tokens: int, stop: StopRule | None = None
    ) -> BatchResult:
        if self.model.device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        result = self.fn(self.model, self.options, prompts, max_new_tokens, stop or StopRule())
        if self.model.device.type == "cuda":
            torch.cuda.synchronize()
        result.wall_time_s = time.perf_counter() - start
        return result


def batched_method(label: str, model: EarlyExitModel, options: dict[str, Any] | None = None) -> BatchedMethod:
    """The batched form of the method ``label`` names (``<method>`` or ``<method>@<tag>``), options validated
    as the batch-1 method's; one clear error for a method without a batched form."""
    name = label.split("@", 1)[0]
    if name not in BATCHED:
        raise ExitbenchError(f"method '{label}' has no batched form; batched methods: {', '.join(sorted(BATCHED))}")
    parsed = parse_options(name, options)
    exit_layer = getattr(parsed, "exit_layer", None)
    if exit_layer is not None and not 1 <= exit_layer <= model.num_layers:
        raise ExitbenchError(
            f"method '{label}': exit_layer {exit_layer} is outside 1..{model.num_layers} for this model"
        )
    return BatchedMethod(label, BATCHED[name], model, parsed)
