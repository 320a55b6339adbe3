"""Generic file helpers shared by every stage: atomic writes, JSONL reading and file hashing.

A write goes to a temporary file in the target's directory, is flushed and fsynced, then renamed over
the target with :func:`os.replace`, so a reader (or a crashed run) sees either the old file or the
complete new one, never a partial file. On any error the temporary file is removed.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any

from exitbench.errors import ExitbenchError

_NEW_FILE_MODE = 0o644


def _fsync_dir(directory: Path) -> None:
    """Persist a rename in ``directory`` (best effort: not every platform can open a directory)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _atomic_write(path: str | Path, write: Callable[[IO[str]], None]) -> Path:
    """Call ``write(handle)`` on a temporary text file next to ``path``, then move it into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = path.stat().st_mode & 0o777 if path.exists() else _NEW_FILE_MODE
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    _fsync_dir(path.parent)
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically; returns the path."""
    return _atomic_write(path, lambda handle: handle.write(text))


def atomic_write_json(path: str | Path, obj: Any, indent: int | None = 2) -> Path:
    """Write ``obj`` as JSON (UTF-8, trailing newline) to ``path`` atomically; returns the path."""

    def write(handle: IO[str]) -> None:
        json.dump(obj, handle, indent=indent, ensure_ascii=False)
        handle.write("\n")

    return _atomic_write(path, write)


def write_jsonl_atomic(path: str | Path, rows: Iterable[Any]) -> int:
    """Write one JSON document per line to ``path`` atomically; returns the number of rows written."""
    count = 0

    def write(handle: IO[str]) -> None:
        nonlocal count
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False))
            handle.write("\n")
            count += 1

    _atomic_write(path, write)
    return count


def read_jsonl(path: str | Path) -> list[Any]:
    """All documents of a JSONL file (gzip-compressed when the name ends in ``.gz``); blank lines skipped.

    A line that is not valid JSON raises :class:`ExitbenchError` naming the file and line.
    """
    path = Path(path)
    if not path.exists():
        raise ExitbenchError(f"{path}: not found; run the stage that writes it first")
    opener = gzip.open if path.suffix == ".gz" else open
    rows: list[Any] = []
    with opener(path, "rt", encoding="utf-8") as handle:
        for lineno, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ExitbenchError(
                    f"{path}: line {lineno} is not valid JSON ({err.msg}); delete the file and re-run its stage"
                ) from None
    return rows


def sha256_file(path: str | Path, chunk_size: int = 1 << 20) -> str:
    """Hex SHA-256 of a file's bytes, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(chunk_size), b""):
            digest.update(chunk)
    return digest.hexdigest()
