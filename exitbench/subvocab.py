"""A draft sub-vocabulary: the most frequent tokens of a task's training text.

Self-speculative drafting proposes tokens through the shared head; restricted to the tokens a task
actually uses, that head costs a fraction of the 49k-word one, and since the full model verifies every
token the output stays exact (only acceptance can drop, when the right token is outside the subset).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence


def frequent_token_ids(token_lists: Iterable[Sequence[int]], size: int, always: Iterable[int] = ()) -> list[int]:
    """The ``size`` most frequent ids (ties broken by id, deterministic), plus every id in ``always``."""
    counts = Counter(token for tokens in token_lists for token in tokens)
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    chosen = {token for token, _ in ranked[:size]}
    return sorted(chosen | set(always))
