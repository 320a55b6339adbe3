"""Identities that decide whether a stored generation may be reused: the model's, and the decoding code's.

Evaluate and calibrate keep every finished generation so that a killed run resumes. A stored record is
valid only for the same weights (a retrained model in the same folder is another model) and the same
decoding code (tokens could change, and timings do: a record timed with an older kernel must not be
compared with one timed with a newer). Both identities go into the records' keys.
"""

from __future__ import annotations

import hashlib
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
