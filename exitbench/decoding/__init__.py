"""Decoding methods behind one interface; importing this package registers the built-in ones."""

from exitbench.decoding import autoregressive, early_exit, self_speculative  # noqa: F401  (registration)
from exitbench.decoding.base import (
    REGISTRY,
    DecodeResult,
    DecodingMethod,
    StopRule,
    build_method,
    method_class,
    parse_options,
    register,
)

__all__ = [
    "REGISTRY", "DecodeResult", "DecodingMethod", "StopRule", "build_method", "method_class", "parse_options",
    "register",
]
