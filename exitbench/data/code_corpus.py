"""The code training corpus: MBPP's non-test problems as completion problems, plus pinned wheels' source.

Written by ``prepare_data`` to ``code/train.jsonl``, one document per line: ``{"id", "origin", "text"}``.

- MBPP task ids 511..974 (its validation and train splits; never the test ids 11..510 or the few-shot
  ids 1..10) become HumanEval-shaped documents (:func:`completion_document`): the function's signature,
  a docstring holding the problem statement and one of its asserts, then the solution's body. The
  model thereby sees the completion format HumanEval is evaluated in.
- The ``.py`` files of pure-Python wheels pinned in ``data.code_wheels`` (``name==version``), fetched with
  ``pip download --no-deps`` into the wheel cache (never installed) and read from the archive; each
  wheel's sha256 goes into the manifest.

No evaluated problem may be in the corpus: :func:`find_overlaps` looks for every HumanEval prompt +
canonical solution and every MBPP test solution (whitespace-normalised) in every document; MBPP
documents that repeat a test solution are left out and counted, anything else is an error.
"""

from __future__ import annotations

import ast
import hashlib
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from exitbench.config import WheelSource
from exitbench.errors import ExitbenchError
from exitbench.models.sources import download_wheel

_MIN_FILE_CHARS = 200
_MAX_FILE_CHARS = 150_000  # one huge generated file would dominate a seeded sample of documents


@dataclass
class CodeCorpus:
    documents: list[dict[str, str]] = field(default_factory=list)
    wheels: list[dict[str, Any]] = field(default_factory=list)
    excluded_overlaps: list[str] = field(default_factory=list)


def normalise(code: str) -> str:
    """Lines stripped of surrounding whitespace, blank lines dropped: what an overlap check compares."""
    return "\n".join(line.strip() for line in code.splitlines() if line.strip())


def completion_document(row: dict[str, Any]) -> str | None:
    """An MBPP problem as HumanEval shows one: signature, docstring (statement + first assert), body.

    The function is the one the first test calls (else the last one defined); None when the code does not
    parse or has no such function.
    """
    code = row["code"].replace("\t", "    ").replace("\r\n", "\n")
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return None
    functions = [node for node in tree.body if isinstance(node, ast.FunctionDef)]
    if not functions:
        return None
    tested = row["test_list"][0] if row.get("test_list") else ""
    target = next((f for f in functions if f"{f.name}(" in tested), functions[-1])
    if ast.get_docstring(target) is not None or not target.body:
        return None
    lines = code.split("\n")
    body_start = target.body[0].lineno - 1
    header = lines[:body_start]
    if target.body[0].lineno == target.lineno:  # a one-line `def f(x): return x`
        return None
    indent = " " * target.body[0].col_offset
    statement = " ".join(row["text"].split()).replace('"""', "'''")
    docstring = [f'{indent}"""{statement}']
    if tested:
        example = tested.replace("\\", "\\\\").replace('"""', "")
        docstring.append(f"{indent}>>> {example}")
    docstring.append(f'{indent}"""')
    return "\n".join([*header, *docstring, *lines[body_start:]]).rstrip() + "\n"


def mbpp_documents(rows: Iterable[dict[str, Any]]) -> list[dict[str, str]]:
    """One document per usable MBPP training problem (``{"id": "mbpp/<task_id>", "origin", "text"}``)."""
    documents = []
    for row in rows:
        text = completion_document(row)
        if text is None:
            text = f"# {' '.join(row['text'].split())}\n{row['code'].rstrip()}\n"
        documents.append({"id": f"mbpp/{row['task_id']}", "origin": "mbpp task ids 511-974", "text": text})
    return documents


def parse_pin(spec: str) -> WheelSource:
    """``name==version`` -> a wheel to fetch; anything else is one clear error."""
    name, sep, version = spec.partition("==")
    if not sep or not name.strip() or not version.strip() or any(c in version for c in "<>=!~*, "):
        raise ExitbenchError(f"data.code_wheels: {spec!r} is not pinned; write it as name==version, e.g. toolz==1.1.0")
    return WheelSource(name=name.strip(), version=version.strip(), file="")


def wheel_documents(spec: str, cache: Path | None = None) -> tuple[list[dict[str, str]], dict[str, Any]]:
    """Every ``.py`` file of the pinned wheel (tests excluded, sorted by path) and the wheel's record."""
    wheel = parse_pin(spec)
    path = download_wheel(wheel, cache)
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    documents = []
    try:
        with zipfile.ZipFile(path) as archive:
            for member in sorted(archive.namelist()):
                parts = member.split("/")
                if not member.endswith(".py") or {"tests", "test", "testing"} & set(parts):
                    continue
                text = archive.read(member).decode("utf-8", errors="replace")
                if _MIN_FILE_CHARS <= len(text) <= _MAX_FILE_CHARS:
                    documents.append({"id": f"{wheel.name}-{wheel.version}/{member}", "origin": spec, "text": text})
    except zipfile.BadZipFile:
        raise ExitbenchError(f"{path}: not a readable wheel; delete it and re-run `dvc repro prepare_data`") from None
    if not documents:
        raise ExitbenchError(f"data.code_wheels: {spec} holds no Python source; pin a pure-Python wheel instead")
    return documents, {"spec": spec, "file": path.name, "sha256": sha, "documents": len(documents)}


def evaluated_solutions(humaneval: Sequence[dict[str, Any]], mbpp_test: Sequence[dict[str, Any]]) -> dict[str, str]:
    """What must never be in a training document: problem id -> normalised solution text.

    HumanEval: prompt + canonical solution (the body alone can be a line as common as ``return x + y``);
    MBPP test: the reference code.
    """
    wanted = {f"humaneval/{row['task_id']}": normalise(row["prompt"] + row["canonical_solution"]) for row in humaneval}
    wanted.update({f"mbpp/{row['task_id']}": normalise(row["code"]) for row in mbpp_test})
    return {key: value for key, value in wanted.items() if value}


def find_overlaps(documents: Sequence[dict[str, str]], solutions: dict[str, str]) -> list[tuple[str, str]]:
    """``(document id, problem id)`` for every evaluated solution found inside a training document."""
    found = []
    for document in documents:
        text = normalise(document["text"])
        found.extend((document["id"], problem) for problem, solution in solutions.items() if solution in text)
    return found


def build_code_corpus(
    mbpp_train: Sequence[dict[str, Any]],
    wheels: Sequence[str],
    humaneval: Sequence[dict[str, Any]],
    mbpp_test: Sequence[dict[str, Any]],
    cache: Path | None = None,
) -> CodeCorpus:
    """The corpus, checked against every evaluated problem (see the module docstring)."""
    solutions = evaluated_solutions(humaneval, mbpp_test)
    corpus = CodeCorpus()
    for row, document in zip(mbpp_train, mbpp_documents(mbpp_train), strict=True):
        raw = {"id": document["id"], "text": row["code"]}  # the document inserts a docstring into the code
        if find_overlaps([document, raw], solutions):
            corpus.excluded_overlaps.append(document["id"])
        else:
            corpus.documents.append(document)
    for spec in wheels:
        documents, record = wheel_documents(spec, cache)
        overlaps = find_overlaps(documents, solutions)
        if overlaps:
            shown = ", ".join(f"{doc} contains {problem}" for doc, problem in overlaps[:3])
            raise ExitbenchError(
                f"data.code_wheels: {shown}; an evaluated problem is in the training corpus, drop {spec} from "
                "data.code_wheels"
            )
        corpus.documents.extend(documents)
        corpus.wheels.append(record)
    return corpus
