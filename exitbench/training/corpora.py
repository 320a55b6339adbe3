"""Offline training corpora (never test data): TOPv2 train rows, stdlib Python source, package docs.

``topv2`` gives one example per row (prompt tokens masked out of the loss); ``stdlib_code`` and
``docs_text`` are packed: documents joined with EOS and cut into blocks of ``seq_len + 1`` tokens (each
block yields ``seq_len`` next-token targets). A mixture concatenates the listed corpora and shuffles them
with a seeded generator. Every source is read in a fixed order, so a corpus is a pure function of the
installed environment, the prepared data, the tokenizer and the config.
"""

from __future__ import annotations

import importlib.metadata
import json
import sysconfig
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase

from exitbench.errors import ExitbenchError
from exitbench.tasks.topv2 import build_prompt, build_target

IGNORE_INDEX = -100
_STDLIB_EXCLUDED_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"})
_MIN_DOC_CHARS = 200


class CorpusName(str, Enum):
    TOPV2 = "topv2"
    STDLIB_CODE = "stdlib_code"
    DOCS_TEXT = "docs_text"


@dataclass(frozen=True)
class Example:
    """One training sequence; ``tokens[:prompt_len]`` are never targets (labels -100)."""

    tokens: tuple[int, ...]
    prompt_len: int = 0

    @property
    def loss_tokens(self) -> int:
        return len(self.tokens) - max(self.prompt_len, 1)


@dataclass
class Corpus:
    """The examples of a (mixed) corpus and what each source contributed."""

    examples: list[Example]
    counts: dict[str, dict[str, int]] = field(default_factory=dict)

    def totals(self) -> dict[str, int]:
        return {
            "examples": len(self.examples),
            "tokens": sum(len(example.tokens) for example in self.examples),
            "loss_tokens": sum(example.loss_tokens for example in self.examples),
        }


def seeded_permutation(size: int, seed: int) -> list[int]:
    """A deterministic permutation of range(size) from its own seeded generator."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randperm(size, generator=generator).tolist()


def _eos_id(tokenizer: PreTrainedTokenizerBase) -> int:
    if tokenizer.eos_token_id is None:
        raise ExitbenchError("the tokenizer has no EOS token; training needs one to end targets and documents")
    return int(tokenizer.eos_token_id)


def read_topv2_rows(path: Path) -> list[dict]:
    """Rows of the prepared ``train.jsonl`` ({"domain", "utterance", "semantic_parse"}), in file order."""
    if not path.exists():
        raise ExitbenchError(f"{path}: not found; run `dvc repro prepare_data` (with topv2 in data.tasks) first")
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            raise ExitbenchError(f"{path}:{number}: not a JSON object; re-run `dvc repro prepare_data`") from None
    return rows


def topv2_examples(
    data_dir: Path, tokenizer: PreTrainedTokenizerBase, seq_len: int, limit: int, seed: int
) -> tuple[list[Example], int]:
    """Prompt + target + EOS per row (seeded row order), skipping rows longer than seq_len + 1 tokens.

    Returns (examples, number skipped). ``limit`` 0 = every row.
    """
    rows = read_topv2_rows(Path(data_dir) / "topv2" / "train.jsonl")
    rows = [rows[index] for index in seeded_permutation(len(rows), seed)]
    prompts = tokenizer([build_prompt(row) for row in rows], verbose=False)["input_ids"]
    targets = tokenizer([build_target(row) for row in rows], add_special_tokens=False, verbose=False)["input_ids"]
    eos = _eos_id(tokenizer)
    examples, skipped = [], 0
    for prompt, target in zip(prompts, targets, strict=True):
        tokens = (*prompt, *target, eos)
        if len(tokens) > seq_len + 1:
            skipped += 1
            continue
        examples.append(Example(tokens, prompt_len=len(prompt)))
        if limit and len(examples) == limit:
            break
    return examples, skipped


def stdlib_sources() -> list[Path]:
    """The running interpreter's standard-library ``.py`` files (no tests, no site-packages), sorted."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = [path for path in root.rglob("*.py") if not _STDLIB_EXCLUDED_DIRS & set(path.relative_to(root).parts)]
    return sorted(files, key=lambda path: path.relative_to(root).as_posix())


def stdlib_texts(seed: int) -> Iterable[str]:
    """Source text of every stdlib file, in a seeded order (so a prefix samples the whole library)."""
    files = stdlib_sources()
    for index in seeded_permutation(len(files), seed):
        text = files[index].read_text(encoding="utf-8", errors="replace")
        if text.strip():
            yield text


def docs_texts(seed: int) -> Iterable[str]:
    """Long descriptions (README text, headers and licence fields dropped) of installed distributions.

    Taken from each distribution's ``METADATA`` body, distributions sorted by name, then in a seeded order.
    """
    by_name: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        name = (dist.metadata["Name"] or "").lower()
        text = dist.read_text("METADATA") or ""
        body = text.split("\n\n", 1)[1].strip() if "\n\n" in text else ""
        if name and name not in by_name and len(body) >= _MIN_DOC_CHARS:
            by_name[name] = body
    texts = [by_name[name] for name in sorted(by_name)]
    for index in seeded_permutation(len(texts), seed):
        yield texts[index]


def pack(texts: Iterable[str], tokenizer: PreTrainedTokenizerBase, seq_len: int, limit: int) -> list[Example]:
    """Sequence packing: documents + EOS joined into one stream, cut into blocks of seq_len + 1 tokens.

    Consecutive blocks overlap by one token, so each stream token is a target exactly once. Stops reading
    documents once ``limit`` blocks are available (0 = read them all).
    """
    eos = _eos_id(tokenizer)
    stream: list[int] = []
    for text in texts:
        stream.extend(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])
        stream.append(eos)
        if limit and (len(stream) - 1) // seq_len >= limit:
            break
    count = max(len(stream) - 1, 0) // seq_len
    if limit:
        count = min(count, limit)
    return [Example(tuple(stream[i * seq_len : (i + 1) * seq_len + 1])) for i in range(count)]


def _load_one(
    name: CorpusName, data_dir: Path, tokenizer: PreTrainedTokenizerBase, seq_len: int, limit: int, seed: int
) -> tuple[list[Example], int]:
    if name is CorpusName.TOPV2:
        return topv2_examples(data_dir, tokenizer, seq_len, limit, seed)
    texts: Callable[[int], Iterable[str]] = stdlib_texts if name is CorpusName.STDLIB_CODE else docs_texts
    return pack(texts(seed), tokenizer, seq_len, limit), 0


def build_corpus(
    names: Sequence[str],
    data_dir: Path,
    tokenizer: PreTrainedTokenizerBase,
    seq_len: int,
    max_examples: int,
    seed: int,
) -> Corpus:
    """The mixture of ``names``: concatenated, shuffled by a seeded generator, cut to ``max_examples`` (0 = all)."""
    examples: list[Example] = []
    counts: dict[str, dict[str, int]] = {}
    for name in dict.fromkeys(names):
        part, skipped = _load_one(CorpusName(name), Path(data_dir), tokenizer, seq_len, max_examples, seed)
        if not part:
            raise ExitbenchError(f"corpus '{name}' produced no examples of at most {seq_len + 1} tokens")
        counts[name] = {**Corpus(part).totals(), "skipped_too_long": skipped}
        examples.extend(part)
    mixed = [examples[index] for index in seeded_permutation(len(examples), seed + 1)]
    if max_examples:
        mixed = mixed[:max_examples]
    return Corpus(mixed, counts)


def collate(examples: Sequence[Example], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded (ids, labels) [B, S] with labels shifted: labels[:, i] is the target after ids[:, i].

    Padding and prompt positions get label -100; causal attention needs no mask for right padding.
    """
    width = max(len(example.tokens) for example in examples) - 1
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), width), IGNORE_INDEX, dtype=torch.long)
    for row, example in enumerate(examples):
        tokens = torch.tensor(example.tokens, dtype=torch.long)
        ids[row, : len(tokens) - 1] = tokens[:-1]
        labels[row, : len(tokens) - 1] = tokens[1:]
        labels[row, : max(example.prompt_len - 1, 0)] = IGNORE_INDEX
    return ids, labels


class DataOrder:
    """Which examples each optimizer step takes: a fresh seeded permutation per epoch, no state but the step.

    Step t takes positions t*G .. (t+1)*G - 1 of the endless stream of epoch permutations (G = global batch),
    so resuming at step t needs nothing but t.
    """

    def __init__(self, num_examples: int, global_batch: int, seed: int) -> None:
        self.num_examples = num_examples
        self.global_batch = global_batch
        self.seed = seed
        self._epochs: dict[int, list[int]] = {}

    def _epoch(self, epoch: int) -> list[int]:
        if epoch not in self._epochs:
            self._epochs = {epoch: seeded_permutation(self.num_examples, self.seed * 1_000_003 + epoch)}
        return self._epochs[epoch]

    def step_indices(self, step: int) -> list[int]:
        start = step * self.global_batch
        positions = range(start, start + self.global_batch)
        return [self._epoch(pos // self.num_examples)[pos % self.num_examples] for pos in positions]
