"""Seeded, stratified, prefix-stable draws of evaluation rows.

Every row is ranked inside its stratum by ``sha256(seed, row id)``; the strata are then interleaved round
robin (in a seeded order of their own), skipping a stratum once it is used up. A draw of ``n`` is the first
``n`` rows of that one order, so:

* it depends only on the rows' ids, strata and the seed, never on file order, and is therefore the same
  for every model and method;
* it is prefix-stable: the draw of 20 is the first 20 rows of the draw of 50 (a timing sample taken as a
  prefix of the quality sample is a subset of it);
* the allocation across strata is equal, capped by each stratum's size, with what a small stratum cannot
  take redistributed evenly over the others (counts differ by at most one between uncapped strata).

Equal rather than proportional allocation: TOPv2's domains differ in size several-fold, and a proportional
draw of a few dozen rows leaves the small domains with one or two rows (or none); equal allocation gives the
per-domain table all eight domains with comparable counts. The overall mean then weights the domains
(nearly) alike rather than by their share of the test split; every summary records the counts
(``sample.strategy`` and ``sample.strata``). The rows come back in draw order, not sorted by stratum, so
that every prefix is itself a stratified draw.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from exitbench.errors import ExitbenchError

Row = TypeVar("Row")
ONE_STRATUM = "all"


def content_id(row: Mapping[str, Any]) -> str:
    """A stable id for a row that has none: ``sha256:`` + 16 hex digits of its canonical JSON (never its index)."""
    digest = hashlib.sha256(json.dumps(row, sort_keys=True, default=str).encode()).hexdigest()
    return f"sha256:{digest[:16]}"


def seeded_key(seed: int, name: str) -> str:
    """The seeded rank of ``name``: hex sha256 of ``"<seed>/<name>"`` (a fixed pseudo-random order)."""
    return hashlib.sha256(f"{seed}/{name}".encode()).hexdigest()


def draw_order(
    ids: Sequence[str], strata: Sequence[str], seed: int, tiebreak: Sequence[str] | None = None
) -> list[int]:
    """Every position of ``ids`` in draw order: ranked by :func:`seeded_key` inside each stratum, strata
    interleaved round robin in a seeded order. Duplicate ids are ordered by ``tiebreak`` (e.g. row content)."""
    members: dict[str, list[int]] = {}
    for position, stratum in enumerate(strata):
        members.setdefault(stratum, []).append(position)

    def rank(position: int) -> tuple[str, str, str]:
        return seeded_key(seed, ids[position]), ids[position], tiebreak[position] if tiebreak else ""

    queues = [
        sorted(positions, key=rank)
        for _, positions in sorted(members.items(), key=lambda item: seeded_key(seed, f"stratum/{item[0]}"))
    ]
    order: list[int] = []
    for depth in range(max((len(q) for q in queues), default=0)):
        order.extend(queue[depth] for queue in queues if depth < len(queue))
    return order


def stratified_sample(
    rows: Sequence[Row],
    num: int,
    seed: int,
    row_id: Callable[[Row], str],
    stratum: Callable[[Row], str] = lambda row: ONE_STRATUM,
    *,
    what: str = "rows",
    lower: str = "the sample size",
) -> list[Row]:
    """``num`` rows drawn without replacement, in :func:`draw_order` (the first ``k`` are the draw of ``k``).

    ``what`` names the data and ``lower`` the setting in the one-line error when ``num`` exceeds the rows.
    The same rows in another file order give the same draw.
    """
    if num > len(rows):
        raise ExitbenchError(f"{what}: {num} samples requested but only {len(rows)} rows; lower {lower}")
    ids = [row_id(row) for row in rows]
    duplicated = len(set(ids)) < len(ids)  # only then does content decide (it costs a JSON dump per row)
    tiebreak = [json.dumps(row, sort_keys=True, default=str) for row in rows] if duplicated else None
    order = draw_order(ids, [stratum(row) for row in rows], seed, tiebreak)
    return [rows[position] for position in order[:num]]
