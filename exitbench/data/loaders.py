"""One loader per dataset: validate raw records and normalise them into the stage's JSONL schemas.

Output, one JSON object per line, keys in this order, rows in source order:

``cnndm/{test,shots,train}.jsonl``
    ``{"id": str, "article": str, "highlights": str}``; ``highlights`` holds the reference summary
    sentences separated by ``"\\n"``. Only the official test split exists offline (mirror:
    ``cnndm/test_subset.jsonl``, whose extra keys ``url``, ``source``, ``article_from`` are dropped); its
    articles are partitioned by a hash of their id (:func:`cnndm_roles`) into three disjoint roles: ``shots``
    (the one-shot example pool), ``train`` (the news training corpus) and ``test`` (everything evaluated or
    calibrated on).
``humaneval/test.jsonl``
    ``{"task_id": str, "prompt": str, "entry_point": str, "canonical_solution": str, "test": str}``.
``mbpp/test.jsonl`` (task_id 11..510), ``mbpp/prompt.jsonl`` (task_id 1..10, the few-shot pool) and
``mbpp/train.jsonl`` (task_id 511..974: the official validation and train splits, training corpus only)
    ``{"task_id": int, "text": str, "code": str, "test_list": [str], "test_setup_code": str,
    "challenge_test_list": [str]}``.
``topv2/{train,eval,test}.jsonl``
    ``{"id": str, "domain": str, "utterance": str, "semantic_parse": str}``, the domains concatenated in
    config order, each file in file order; ``id`` is ``<domain>-<split>-<n>`` (n: the row's 1-based line
    number in its domain file, header excluded), stable whatever else changes (mirror:
    ``topv2/{domain}_{split}.tsv``, header ``domain<TAB>utterance<TAB>semantic_parse``, read with quoting
    disabled).

A malformed row is counted and described, never silently dropped and never fatal: a line that is not
JSON (or not UTF-8), a record that is not an object, a missing key, a wrong type, an empty required
field, a duplicate id, a TSV line without exactly three columns, a TOPv2 domain that differs from the
file's, and a TOPv2 parse whose brackets do not balance. Blank lines are not rows and are skipped.
Every loader returns ``{split: SplitData}``; :meth:`SplitData.report` gives ``{"rows", "malformed",
"malformed_examples"}`` (the first three descriptions, with line numbers). ``max_rows`` (0 = all)
caps the rows kept per split (TOPv2: split evenly over its domains, so a capped split still has every
domain; CNN/DM: per role); rows past the cap are still validated and counted in ``rows_over_cap``.
"""

from __future__ import annotations

import contextlib
import csv
import gzip
import hashlib
import json
import re
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from exitbench.data.sources import Source
from exitbench.errors import ExitbenchError

MAX_EXAMPLES = 3
_EXAMPLE_CHARS = 140
TOPV2_HEADER = ("domain", "utterance", "semantic_parse")
_BRACKET = re.compile(r"[\[\]]")

# Field kinds: "text" = non-empty string, "str" = any string, "int" = integer,
# "str_list" = list of strings, "text_list" = non-empty list of strings.
CNNDM_FIELDS: Mapping[str, str] = {"id": "text", "article": "text", "highlights": "text"}
HUMANEVAL_FIELDS: Mapping[str, str] = {
    "task_id": "text",
    "prompt": "text",
    "entry_point": "text",
    "canonical_solution": "text",
    "test": "text",
}
MBPP_FIELDS: Mapping[str, str] = {
    "task_id": "int",
    "text": "text",
    "code": "text",
    "test_list": "text_list",
    "test_setup_code": "str",
    "challenge_test_list": "str_list",
}
MBPP_SPLITS: Mapping[str, range] = {"test": range(11, 511), "prompt": range(1, 11), "train": range(511, 975)}
CNNDM_ROLES = ("shots", "train", "test")


@dataclass
class SplitData:
    """The valid rows of one (task, split), plus the count and first descriptions of malformed ones."""

    task: str
    split: str
    source: dict[str, Any]
    max_rows: int = 0
    rows: list[dict[str, Any]] = field(default_factory=list)
    malformed: int = 0
    malformed_examples: list[str] = field(default_factory=list)
    rows_over_cap: int = 0

    def add(self, row: dict[str, Any]) -> None:
        """Keep a valid row (or count it as over the cap)."""
        if self.max_rows and len(self.rows) >= self.max_rows:
            self.rows_over_cap += 1
        else:
            self.rows.append(row)

    def reject(self, where: str, reason: str) -> None:
        """Count a malformed row; remember the first few descriptions."""
        self.malformed += 1
        if len(self.malformed_examples) < MAX_EXAMPLES:
            text = f"{where}: {reason}"
            self.malformed_examples.append(text if len(text) <= _EXAMPLE_CHARS else text[: _EXAMPLE_CHARS - 3] + "...")

    def report(self) -> dict[str, Any]:
        return {
            "rows": len(self.rows),
            "malformed": self.malformed,
            "malformed_examples": list(self.malformed_examples),
            "rows_over_cap": self.rows_over_cap,
        }


@dataclass(frozen=True)
class _Bad:
    """A raw record that could not even be parsed (not UTF-8, not JSON)."""

    reason: str


# ---------------------------------------------------------------- raw records


@contextlib.contextmanager
def _reading(task: str, path: Path) -> Iterator[None]:
    """Turn an unreadable or corrupt file into one ExitbenchError line naming it."""
    try:
        yield
    except (OSError, EOFError, zlib.error) as err:
        detail = err.strerror if isinstance(err, OSError) and err.strerror else str(err) or type(err).__name__
        raise ExitbenchError(
            f"{task}: cannot read {path} ({detail}); replace it with a fresh copy of the dataset file"
        ) from None


def _lines(task: str, path: Path) -> Iterator[tuple[int, str | _Bad]]:
    """``(line number, text without newline)`` for each non-blank line; gzip when the name ends in .gz."""
    opener = gzip.open if path.suffix == ".gz" else open
    with _reading(task, path), opener(path, "rb") as handle:
        for lineno, raw in enumerate(handle, start=1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                yield lineno, _Bad(f"not valid UTF-8 (byte {err.start})")
                continue
            if lineno == 1:
                text = text.removeprefix("\ufeff")
            text = text.rstrip("\r\n")
            if text.strip():
                yield lineno, text


def _json_records(task: str, path: Path) -> Iterator[tuple[str, Any]]:
    for lineno, text in _lines(task, path):
        if isinstance(text, _Bad):
            yield f"line {lineno}", text
            continue
        try:
            yield f"line {lineno}", json.loads(text)
        except json.JSONDecodeError as err:
            yield f"line {lineno}", _Bad(f"not valid JSON ({err.msg})")


def _records(source: Source) -> Iterator[tuple[str, Any]]:
    """``(where, record)`` pairs of a single-file JSONL source or of loaded hub splits."""
    if source.kind == "hub":
        for split, rows in source.hub_splits:
            for index, row in enumerate(rows, start=1):
                yield f"hub {split} row {index}", row
        return
    for path in source.files:
        yield from _json_records(source.task, path)


# ---------------------------------------------------------------- validation


def _kind_problem(value: Any, kind: str) -> str | None:
    """Why ``value`` is not of field kind ``kind``, or ``None`` when it is."""
    got = f"(got {type(value).__name__})"
    if kind == "int":
        return None if isinstance(value, int) and not isinstance(value, bool) else f"must be an integer {got}"
    if kind in ("str", "text"):
        if not isinstance(value, str):
            return f"must be a string {got}"
        return "is empty" if kind == "text" and not value.strip() else None
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        return f"must be a list of strings {got}"
    return "is empty" if kind == "text_list" and not value else None


def _validate(record: Any, fields: Mapping[str, str]) -> tuple[dict[str, Any] | None, str]:
    """``(row in schema order, "")`` for a valid record, else ``(None, reason)``."""
    if isinstance(record, _Bad):
        return None, record.reason
    if not isinstance(record, Mapping):
        return None, f"not a JSON object (got {type(record).__name__})"
    missing = [key for key in fields if key not in record]
    if missing:
        return None, f"missing key(s) {', '.join(repr(key) for key in missing)}"
    for key, kind in fields.items():
        problem = _kind_problem(record[key], kind)
        if problem:
            return None, f"{key!r} {problem}"
    return {key: record[key] for key in fields}, ""


SplitOf = Callable[[Mapping[str, Any]], str | None]


def _load_keyed(
    source: Source, fields: Mapping[str, str], key: str, split_of: SplitOf, splits: tuple[str, ...], max_rows: int
) -> dict[str, SplitData]:
    """Validate every record, reject duplicate ``key`` values, and route rows to splits with ``split_of``.

    ``split_of`` returns ``None`` for a record outside every split written here (it is skipped, valid or
    not); a record too broken to route is counted against the first split.
    """
    data = {split: SplitData(source.task, split, source.describe(), max_rows) for split in splits}
    first_seen: dict[Any, str] = {}
    for where, record in _records(source):
        split = split_of(record) if isinstance(record, Mapping) else splits[0]
        if split is None:
            continue
        target = data[split]
        row, reason = _validate(record, fields)
        if row is None:
            target.reject(where, reason)
        elif row[key] in first_seen:
            target.reject(where, f"duplicate {key} {row[key]!r} (first at {first_seen[row[key]]})")
        else:
            first_seen[row[key]] = where
            target.add(row)
    return data


# ---------------------------------------------------------------- the loaders


def cnndm_roles(ids: list[str], shots: int, train: int) -> dict[str, str]:
    """Each article id's role: the ``shots`` ids with the smallest sha256(id) are the one-shot pool, the next
    ``train`` ids the training corpus, every other id ``test``. Depends on the ids alone (not on file order
    or any seed), so the roles are disjoint by construction and the same in every stage and run."""
    ranked = sorted(ids, key=lambda row_id: hashlib.sha256(f"cnndm-role/{row_id}".encode()).hexdigest())
    roles = {row_id: "test" for row_id in ranked}
    roles.update({row_id: "shots" for row_id in ranked[:shots]})
    roles.update({row_id: "train" for row_id in ranked[shots : shots + train]})
    return roles


def load_cnndm(source: Source, max_rows: int = 0, *, shots: int = 20, train: int = 200) -> dict[str, SplitData]:
    """CNN/DailyMail 3.0.0 test split, partitioned by :func:`cnndm_roles`: ``{"shots", "train", "test"}``.

    ``shots`` and ``train`` are upper bounds: a small mirror keeps at least half of its articles for ``test``
    (shots at most a quarter, at least one; train at most half of the rest).
    """
    everything = _load_keyed(source, CNNDM_FIELDS, "id", lambda row: "test", ("test",), 0)["test"]
    count = len(everything.rows)
    if count < 3:
        example = f", e.g. {everything.malformed_examples[0]}" if everything.malformed_examples else ""
        raise ExitbenchError(
            f"cnndm: {count} valid articles ({everything.malformed} malformed{example}); one-shot evaluation needs "
            "at least 3 (an example, a training article, a test article): replace the file with a complete copy"
        )
    shots = max(1, min(shots, count // 4))
    train = min(train, (count - shots) // 2)
    roles = cnndm_roles([row["id"] for row in everything.rows], shots, train)
    data = {role: SplitData(source.task, role, source.describe(), max_rows) for role in CNNDM_ROLES}
    for row in everything.rows:
        data[roles[row["id"]]].add(row)
    test = data["test"]
    test.malformed, test.malformed_examples = everything.malformed, everything.malformed_examples
    return data


def load_humaneval(source: Source, max_rows: int = 0) -> dict[str, SplitData]:
    """HumanEval (164 problems): ``{"test": SplitData}``."""
    return _load_keyed(source, HUMANEVAL_FIELDS, "task_id", lambda row: "test", ("test",), max_rows)


def _mbpp_split(record: Mapping[str, Any]) -> str | None:
    """The MBPP split of a record by task_id; "test" when the id is missing or not an integer."""
    task_id = record.get("task_id")
    if not isinstance(task_id, int) or isinstance(task_id, bool):
        return "test"
    return next((split for split, ids in MBPP_SPLITS.items() if task_id in ids), None)


def load_mbpp(source: Source, max_rows: int = 0) -> dict[str, SplitData]:
    """MBPP: ``{"test": task_id 11..510, "prompt": task_id 1..10}``; other task ids are not used."""
    return _load_keyed(source, MBPP_FIELDS, "task_id", _mbpp_split, tuple(MBPP_SPLITS), max_rows)


def _parse_problem(parse: str) -> str | None:
    """Why a TOPv2 semantic parse has unbalanced brackets, or ``None`` when it balances."""
    depth = 0
    for match in _BRACKET.finditer(parse):
        depth += 1 if match.group() == "[" else -1
        if depth < 0:
            return f"unbalanced brackets in semantic_parse (unmatched ']' at char {match.start()})"
    return f"unbalanced brackets in semantic_parse ({depth} unclosed '[')" if depth else None


def _topv2_row(columns: list[str], domain: str) -> tuple[dict[str, Any] | None, str | None]:
    if len(columns) != len(TOPV2_HEADER):
        return None, f"expected {len(TOPV2_HEADER)} tab-separated columns, got {len(columns)}"
    row = dict(zip(TOPV2_HEADER, columns, strict=True))
    empty = [key for key, value in row.items() if not value.strip()]
    if empty:
        return None, f"empty {', '.join(repr(key) for key in empty)}"
    if row["domain"] != domain:
        return None, f"domain {row['domain']!r} in the {domain} file"
    problem = _parse_problem(row["semantic_parse"])
    return (None, problem) if problem else (row, None)


def _read_topv2_file(path: Path, domain: str, split: str, target: SplitData, cap: int = 0) -> int:
    """Add the file's rows to ``target`` (at most ``cap`` of them, 0 = all; the rest count as over the cap);
    returns how many were valid."""
    name = path.name
    header_seen = False
    valid = 0
    for lineno, text in _lines("topv2", path):
        if isinstance(text, _Bad):
            target.reject(f"{name} line {lineno}", text.reason)
            continue
        try:
            columns = next(csv.reader([text], delimiter="\t", quoting=csv.QUOTE_NONE))
        except csv.Error as err:
            target.reject(f"{name} line {lineno}", f"not a TSV line ({err})")
            continue
        if not header_seen:
            header_seen = True
            if tuple(columns) != TOPV2_HEADER:
                raise ExitbenchError(
                    f"topv2: {path} does not start with the header {chr(9).join(TOPV2_HEADER)!r}; "
                    "replace it with the authors' TSV file"
                )
            continue
        row, reason = _topv2_row(columns, domain)
        if row is None:
            target.reject(f"{name} line {lineno}", reason or "malformed")
            continue
        valid += 1
        if cap and valid > cap:
            target.rows_over_cap += 1
        else:
            target.add({"id": f"{domain}-{split}-{lineno - 1}", **row})
    return valid


def topv2_file_parts(path: Path) -> tuple[str, str]:
    """``(domain, split)`` of a mirror file named ``{domain}_{split}.tsv``."""
    domain, _, split = path.stem.rpartition("_")
    return domain, split


def load_topv2(source: Source, max_rows: int = 0) -> dict[str, SplitData]:
    """TOPv2 from the mirror's per-domain TSV files: ``{"train", "eval", "test"}`` (domains in file order)."""
    by_split: dict[str, list[tuple[str, Path]]] = {}
    for path in source.files:
        domain, split = topv2_file_parts(path)
        by_split.setdefault(split, []).append((domain, path))
    data: dict[str, SplitData] = {}
    for split, files in by_split.items():
        target = SplitData("topv2", split, source.describe([path for _, path in files]))
        cap = -(-max_rows // len(files)) if max_rows else 0  # every domain keeps its share of a capped split
        for domain, path in files:
            malformed = target.malformed
            if not _read_topv2_file(path, domain, split, target, cap):  # the split would silently lack this domain
                raise ExitbenchError(
                    f"topv2: domain '{domain}' has no valid rows in {path} ({target.malformed - malformed} "
                    "malformed); replace it with the authors' TSV file or drop the domain from data.topv2_domains"
                )
        data[split] = target
    return data


LOADERS: Mapping[str, Callable[[Source, int], dict[str, SplitData]]] = {
    "cnndm": load_cnndm,
    "humaneval": load_humaneval,
    "mbpp": load_mbpp,
    "topv2": load_topv2,
}
