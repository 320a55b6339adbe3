"""Decoding methods behind one interface; importing this package registers every method module in it.

A method is one module here (a :class:`~exitbench.decoding.base.DecodingMethod` subclass under ``@register``),
found by listing the package, so adding one edits no other file of the library. A module that fails to import
is recorded in :data:`BROKEN_MODULES`, not raised: the other methods stay usable, and asking for a method of
that module (``method_class``) raises one line naming the module and its error.
"""

import importlib
import pkgutil

from exitbench.decoding.base import (
    BROKEN_MODULES,
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

#: modules of shared code, not methods
_SHARED = frozenset({"base", "steps"})

for _module in sorted(info.name for info in pkgutil.iter_modules(__path__)):
    if _module in _SHARED:
        continue
    try:
        importlib.import_module(f"{__name__}.{_module}")
    except Exception as _err:  # one broken method must not take the others down
        BROKEN_MODULES[_module] = f"{type(_err).__name__}: {_err}"

__all__ = [
    "BROKEN_MODULES", "REGISTRY", "DecodeResult", "DecodingMethod", "StopRule", "base_method", "build_method",
    "method_class", "parse_options", "register",
]
