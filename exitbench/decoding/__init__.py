"""Decoding methods behind one interface; importing this package registers the built-in ones."""

import exitbench.decoding.calm  # noqa: F401  (registration)
from exitbench.decoding import (  # noqa: F401  (registration)
    adaptive_self_speculative,
    autoregressive,
    depth_pruning,
    early_exit,
    hf_early_exit,
    hf_prompt_lookup,
    layer_skip_draft,
    prompt_lookup,
    self_speculative,
    self_speculative_lookup,
    speculative,
)
from exitbench.decoding.base import (
    REGISTRY,
    DecodeResult,
    DecodingMethod,
    StopRule,
    base_method,
    build_method,
    method_class,
    parse_options,
    register,
)

__all__ = [
    "REGISTRY", "DecodeResult", "DecodingMethod", "StopRule", "base_method", "build_method", "method_class",
    "parse_options", "register",
]
