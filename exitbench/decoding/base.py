"""The decoding-method interface, its typed result, stop rules and the registry.

A method is a class with a ``name``, an ``Options`` pydantic model (its params.yaml entry) and
``generate(prompt_ids, max_new_tokens, stop) -> DecodeResult``. Registering it with
:func:`register` makes it available to every stage by name: one module plus one params entry.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from pydantic import BaseModel, ConfigDict, ValidationError

from exitbench.errors import ExitbenchError
from exitbench.models.view import EarlyExitModel


class MethodOptions(BaseModel):
    """Base for a method's options: frozen, unknown keys rejected."""

    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass(frozen=True)
class StopRule:
    """When generation ends: an EOS id, or a stop string in the decoded continuation."""

    eos_token_ids: frozenset[int] = frozenset()
    stop_strings: tuple[str, ...] = ()
    decode: Callable[[Sequence[int]], str] | None = None

    def cut(self, new_tokens: Sequence[int], checked: int = 0) -> int | None:
        """Number of tokens to keep if a stop point lies in ``new_tokens[checked:]``, else None.

        An EOS token is kept (it ends the sequence); a stop string keeps the token that completes it.
        The task trims the text at the stop string afterwards. All methods share this rule, so their
        token outputs are comparable one for one.
        """
        for index in range(checked, len(new_tokens)):
            if new_tokens[index] in self.eos_token_ids:
                return index + 1
        if not self.stop_strings or self.decode is None:
            return None
        text = self.decode(new_tokens)
        if not any(stop in text for stop in self.stop_strings):
            return None
        for index in range(max(checked, 1), len(new_tokens) + 1):
            prefix = self.decode(new_tokens[:index])
            if any(stop in prefix for stop in self.stop_strings):
                return index
        return len(new_tokens)


@dataclass
class DecodeResult:
    """What one generation produced and what it cost."""

    tokens: list[int]
    wall_time_s: float
    prefill_time_s: float = 0.0
    num_rounds: int = 0
    num_drafted: int = 0
    num_accepted: int = 0
    acceptance_histogram: list[int] = field(default_factory=list)
    layer_calls: dict[str, int] = field(default_factory=dict)
    exit_layers: list[int] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    @property
    def decode_time_s(self) -> float:
        return self.wall_time_s - self.prefill_time_s

    @property
    def time_per_token_ms(self) -> float:
        """Mean wall time per generated token, prefill included (LayerSkip's speed-up metric)."""
        return 1000.0 * self.wall_time_s / max(self.num_tokens, 1)

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted / drafted tokens (LayerSkip's definition); None for non-drafting methods."""
        return self.num_accepted / self.num_drafted if self.num_drafted else None

    @property
    def tokens_per_round(self) -> float | None:
        """Generated tokens (the prefill's first included) per draft-verify round; None for non-drafting methods."""
        return self.num_tokens / self.num_rounds if self.num_rounds else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "num_tokens": self.num_tokens,
            "wall_time_s": self.wall_time_s,
            "prefill_time_s": self.prefill_time_s,
            "time_per_token_ms": self.time_per_token_ms,
            "num_rounds": self.num_rounds,
            "num_drafted": self.num_drafted,
            "num_accepted": self.num_accepted,
            "acceptance_rate": self.acceptance_rate,
            "tokens_per_round": self.tokens_per_round,
            "acceptance_histogram": self.acceptance_histogram,
            "layer_calls": self.layer_calls,
            "exit_layers": self.exit_layers,
        }


class DecodingMethod:
    """Base class: subclasses set ``name`` and ``Options`` and implement :meth:`_generate`."""

    name: ClassVar[str] = ""
    Options: ClassVar[type[MethodOptions]] = MethodOptions
    exact: ClassVar[bool] = False  # claims token-for-token equality with greedy decoding
    # The engine that runs it: "exitbench" (this package's forward and cache) or "transformers" (a peer inside
    # transformers' generate(); evaluate then also times it against transformers' own greedy, hf_greedy).
    framework: ClassVar[str] = "exitbench"

    def __init__(self, model: EarlyExitModel, options: MethodOptions, draft_model: EarlyExitModel | None = None):
        self.model = model
        self.options = options
        self.draft_model = draft_model

    @torch.inference_mode()
    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int, stop: StopRule | None = None) -> DecodeResult:
        """Generate up to ``max_new_tokens`` after ``prompt_ids`` (batch size 1), timed end to end."""
        if not prompt_ids:
            raise ExitbenchError(f"{self.name}: empty prompt")
        stop = stop or StopRule()
        start = time.perf_counter()
        result = self._generate(list(prompt_ids), max_new_tokens, stop)
        if self.model.device.type == "cuda":
            torch.cuda.synchronize()
        result.wall_time_s = time.perf_counter() - start
        return result

    def _generate(self, prompt_ids: list[int], max_new_tokens: int, stop: StopRule) -> DecodeResult:
        raise NotImplementedError


REGISTRY: dict[str, type[DecodingMethod]] = {}


def register(cls: type[DecodingMethod]) -> type[DecodingMethod]:
    """Class decorator: make a method available by its ``name``."""
    if not cls.name or cls.name in REGISTRY:
        raise ValueError(f"decoding method name {cls.name!r} is empty or already registered")
    REGISTRY[cls.name] = cls
    return cls


def base_method(label: str) -> str:
    """The registered method an ``evaluate.methods`` label names: ``early_exit@8`` -> ``early_exit`` (a label
    ``<method>@<anything>`` runs one method several times with different options)."""
    return label.split("@", 1)[0]


def method_class(name: str) -> type[DecodingMethod]:
    """The registered class of a method name or label (see :func:`base_method`)."""
    base = base_method(name)
    if base not in REGISTRY:
        raise ExitbenchError(f"unknown decoding method '{name}'; registered: {', '.join(sorted(REGISTRY))}")
    return REGISTRY[base]


def parse_options(name: str, options: dict[str, Any] | None) -> MethodOptions:
    """Validate a params.yaml method entry against the method's Options, with a one-line error."""
    cls = method_class(name)
    try:
        return cls.Options.model_validate(options or {})
    except ValidationError as err:
        first = err.errors()[0]
        key = ".".join(str(p) for p in first["loc"])
        allowed = ", ".join(sorted(cls.Options.model_fields))
        raise ExitbenchError(f"method '{name}': option '{key}': {first['msg']} (options: {allowed})") from None


def build_method(
    name: str,
    model: EarlyExitModel,
    options: dict[str, Any] | None = None,
    draft_model: EarlyExitModel | None = None,
) -> DecodingMethod:
    """Instantiate a registered method with validated options."""
    cls = method_class(name)
    parsed = parse_options(name, options)
    check = getattr(parsed, "exit_layer", None)
    if check is not None and not 1 <= check <= model.num_layers:
        raise ExitbenchError(f"method '{name}': exit_layer {check} is outside 1..{model.num_layers} for this model")
    return cls(model, parsed, draft_model)
