"""MindSkip: greedy decoding with trained routers deciding, per prompt, which layers' attention runs (Router-Tuning,
He et al. 2024, arXiv:2410.13184).

At the prompt, each routed layer's router (:class:`exitbench.models.router.DepthRouters`, trained on the frozen
model by the ``train_routers`` stage) scores the layer's input; a layer scoring below ``tau`` has its attention
(or, at ``layer`` granularity, the whole layer) skipped for the prompt and for every token generated after it.
Lossy: quality is measured against greedy decoding of the same model, at the skip rate the routers chose (the
records count the layers skipped).

``routing: static`` is the control, "attention drop" at the same skip rate (the paper's Figure 2): the same number
of layers skipped for every prompt, the ones the routers skipped most often at held-out prompts (stored with
them; empty, so greedy decoding, where the routers skipped nothing there).
"""

from __future__ import annotations

import time
from typing import Literal

import torch
from pydantic import Field

from exitbench.decoding.base import DecodeResult, DecodingMethod, MethodOptions, StopRule, register
from exitbench.decoding.steps import as_ids, finish, greedy, new_cache_for
from exitbench.errors import ExitbenchError
from exitbench.models.cache import KVCache
from exitbench.models.router import DepthRouters, load_routers, routed_forward
from exitbench.models.view import EarlyExitModel


class MindSkipOptions(MethodOptions):
    router_file: str = Field(
        "", description="the trained routers (evaluate fills in the model's own, made by train_routers)"
    )
    routing: Literal["learned", "static"] = Field(
        "learned", description="learned: the routers decide per prompt; static: their most-skipped set, every prompt"
    )
    threshold: float | None = Field(None, gt=0, lt=1, description="tau; left out = the one the routers were trained at")


@register
class MindSkip(DecodingMethod):
    name = "mindskip"
    Options = MindSkipOptions

    def __init__(
        self, model: EarlyExitModel, options: MindSkipOptions, draft_model: EarlyExitModel | None = None
    ) -> None:
        super().__init__(model, options, draft_model)
        if not options.router_file:
            raise ExitbenchError("mindskip: give router_file (evaluate gives the model's trained routers)")
        self.routers: DepthRouters = load_routers(model, options.router_file)
        if options.threshold is not None:
            self.routers.threshold = options.threshold

    def _forward(
        self, cache: KVCache, tokens: list[int], position: int, skipped: set[int] | None
    ) -> tuple[torch.Tensor, set[int]]:
        model = self.model
        hidden = model.embed(as_ids(model, tokens))
        hidden, skipped = routed_forward(
            model, self.routers, hidden, model.rope(hidden, position), position, cache, skipped
        )
        return model.logits(hidden[:, -1:]), skipped

    def _generate(self, prompt_ids: list[int], max_new_tokens: int, stop: StopRule) -> DecodeResult:
        start = time.perf_counter()
        cache = new_cache_for(self.model, len(prompt_ids), max_new_tokens)
        fixed = set(self.routers.static_skip) if self.options.routing == "static" else None
        logits, skipped = self._forward(cache, prompt_ids, 0, fixed)
        tokens = [greedy(logits)]
        prefill_time = time.perf_counter() - start
        while len(tokens) < max_new_tokens and stop.cut(tokens, len(tokens) - 1) is None:
            logits, _ = self._forward(cache, [tokens[-1]], len(prompt_ids) + len(tokens) - 1, skipped)
            tokens.append(greedy(logits))
        tokens = finish(tokens, max_new_tokens, stop)
        calls = {"forwards": len(tokens), "routed": len(self.routers.layers), "skipped": len(skipped)}
        return DecodeResult(tokens=tokens, wall_time_s=0.0, prefill_time_s=prefill_time, layer_calls=calls)

    def calibration_summary(self) -> dict[str, object]:
        """The routers this run decoded with: what they route, at which threshold, and the static control's set."""
        r = self.routers
        return {
            "routed_layers": r.layers,
            "granularity": r.granularity,
            "threshold": r.threshold,
            "static_skip": r.static_skip,
            "router_file": self.options.router_file,
        }
