"""Decoding methods behind one interface; importing this package registers every method module in it.

A method is one module here (a :class:`~exitbench.decoding.base.DecodingMethod` subclass under ``@register``),
found by listing the package, so adding one edits no other file of the library. A module that fails to import
is recorded in :data:`BROKEN_MODULES`, not raised: the other methods stay usable, and asking for a method of
that module (:func:`method_class`, :func:`parse_options`, :func:`build_method`) raises one line naming the module
and its error. (This lives here, not in ``base``: ``base`` is part of every method's code identity.)
"""

import importlib
import pkgutil
from typing import Any

from exitbench.decoding import base as _base
from exitbench.decoding.base import (
    REGISTRY,
    DecodeResult,
    DecodingMethod,
    MethodOptions,
    StopRule,
    base_method,
    register,
)
from exitbench.errors import ExitbenchError

#: modules of shared code, not methods
_SHARED = frozenset({"base", "draft_verify", "steps"})
#: method modules that failed to import: module name -> the error
BROKEN_MODULES: dict[str, str] = {}

for _module in sorted(info.name for info in pkgutil.iter_modules(__path__)):
    if _module in _SHARED:
        continue
    try:
        importlib.import_module(f"{__name__}.{_module}")
    except Exception as _err:  # one broken method must not take the others down
        BROKEN_MODULES[_module] = f"{type(_err).__name__}: {_err}"


def _require_importable(name: str) -> None:
    base = base_method(name)
    if base not in REGISTRY and base in BROKEN_MODULES:
        raise ExitbenchError(
            f"decoding method '{name}': its module exitbench/decoding/{base}.py failed to import "
            f"({BROKEN_MODULES[base]}); fix the module, or remove '{name}' from params.yaml"
        )


def method_class(name: str) -> type[DecodingMethod]:
    """The registered class of a method name or label (:func:`exitbench.decoding.base.method_class`)."""
    _require_importable(name)
    return _base.method_class(name)


def parse_options(name: str, options: dict[str, Any] | None) -> MethodOptions:
    """A params.yaml method entry validated against the method's Options (one-line errors)."""
    _require_importable(name)
    return _base.parse_options(name, options)


def build_method(
    name: str, model: Any, options: dict[str, Any] | None = None, draft_model: Any = None
) -> DecodingMethod:
    """A registered method instantiated with validated options."""
    _require_importable(name)
    return _base.build_method(name, model, options, draft_model)


__all__ = [
    "BROKEN_MODULES", "REGISTRY", "DecodeResult", "DecodingMethod", "StopRule", "base_method", "build_method",
    "method_class", "parse_options", "register",
]
