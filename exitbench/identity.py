"""Identities that decide whether a stored generation may be reused: the model's, and the decoding code's.

Evaluate and calibrate keep every finished generation so that a killed run resumes. A stored record is
valid only for the same weights (a retrained model in the same folder is another model) and the same
decoding code (tokens could change, and timings do: a record timed with an older kernel must not be
compared with one timed with a newer). Both identities go into the records' keys.

Evaluate keys a method's records by that method's own code (:func:`method_code_identity`): its module and
every exitbench module it imports, followed statically through the imports. Adding a method module, or
changing another method, leaves every other method's records valid; changing shared code they import
(``decoding/steps.py``, ``models/view.py``) invalidates exactly the methods built on it.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import json
from functools import cache
from pathlib import Path

from exitbench.data.io import sha256_file

PACKAGE = Path(__file__).resolve().parent
# The code that produces a generation's tokens and its timing.
DECODING_SOURCES = ("decoding", "models")


def model_identity(model_dir: Path) -> str:
    """sha256 naming a model's weights and config: of ``model_info.json`` (which records the weights' sha256)
    when the model has one, else of ``config.json`` and every ``*.safetensors`` file."""
    model_dir = Path(model_dir)
    info = model_dir / "model_info.json"
    files = [info] if info.exists() else [model_dir / "config.json", *sorted(model_dir.glob("*.safetensors"))]
    payload = [[f.name, sha256_file(f)] for f in files]
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


@cache
def decoding_code_identity() -> str:
    """sha256 of the Python sources of ``exitbench/decoding`` and ``exitbench/models`` (paths and bytes)."""
    digest = hashlib.sha256()
    for folder in DECODING_SOURCES:
        for path in sorted((PACKAGE / folder).rglob("*.py")):
            digest.update(str(path.relative_to(PACKAGE)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def _module_file(name: str, root: Path) -> Path | None:
    """The source file of module ``exitbench.<...>`` under ``root`` (the package folder), or None."""
    parts = name.split(".")
    if parts[0] != root.name:
        return None
    base = root.joinpath(*parts[1:])
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _imported_files(path: Path, root: Path) -> set[Path]:
    """The package's source files that ``path`` imports (``import a.b``, ``from a.b import c``, c a module or
    a name), read from its syntax tree: module-level and function-level imports alike."""
    found: set[Path] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        else:
            continue
        for name in names:
            file = _module_file(name, root)
            if file is not None:
                found.add(file)
    return found


def source_closure(start: Path, root: Path = PACKAGE) -> list[Path]:
    """``start`` and every module of the package it imports, directly or through other modules, sorted."""
    seen: set[Path] = set()
    todo = [start.resolve()]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        todo.extend(_imported_files(path, root) - seen)
    return sorted(seen)


def code_identity(start: Path, root: Path = PACKAGE) -> str:
    """sha256 of :func:`source_closure` of ``start`` (paths relative to the package's parent, and bytes)."""
    digest = hashlib.sha256()
    for path in source_closure(start, root):
        digest.update(str(path.relative_to(root.parent)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


@cache
def method_code_identity(method: type) -> str:
    """The code identity of a decoding method: its module and everything of exitbench it imports."""
    return code_identity(Path(inspect.getfile(method)))
