"""Offline training corpora (never evaluated data), one per task family, mixed by weight.

- ``topv2``: one example per TOPv2 train row, prompt tokens masked out of the loss (the task's format).
- ``news``: one example per article of ``cnndm/train.jsonl`` (a role disjoint from every evaluated,
  calibrated or one-shot article, see :func:`exitbench.data.loaders.cnndm_roles`) in the one-shot format
  the cnndm task prompts with: ``Article: <lead>\nSummary: <highlights>\n\n``, the article's lead cut to
  fit ``seq_len``, loss on the summary only.
- ``code``: ``code/train.jsonl`` (MBPP's non-test problems as completion problems + pinned wheels' source,
  :mod:`exitbench.data.code_corpus`), packed.
- ``stdlib_code``, ``docs_text``: the interpreter's standard library and installed packages' descriptions,
  packed (kept for experiments; they depend on the installed environment).

Packing joins documents with EOS and cuts the stream into blocks of ``seq_len + 1`` tokens (each block
yields ``seq_len`` next-token targets). A mixture takes ``round(weight / sum(weights) * size)`` examples
of each corpus (cycling through a corpus smaller than its share), then shuffles them with a seeded
generator; ``size`` is one pass of the run (steps x global batch). Every source is read in a fixed order,
so a corpus is a pure function of the prepared data, the tokenizer and the config.
"""

from __future__ import annotations

import importlib.metadata
import json
import sysconfig
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase

from exitbench.errors import ExitbenchError
from exitbench.tasks.cnndm import format_example
from exitbench.tasks.topv2 import build_prompt, build_target

IGNORE_INDEX = -100
_STDLIB_EXCLUDED_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"})
_MIN_DOC_CHARS = 200


class CorpusName(str, Enum):
    TOPV2 = "topv2"
    NEWS = "news"
    CODE = "code"
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


def read_rows(path: Path, stage: str = "prepare_data") -> list[dict]:
    """The JSON objects of a prepared JSONL file, in file order (one clear error when missing or corrupt)."""
    if not path.exists():
        raise ExitbenchError(f"{path}: not found; run `dvc repro {stage}` first (is its task in data.tasks?)")
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            raise ExitbenchError(f"{path}:{number}: not a JSON object; re-run `dvc repro {stage}`") from None
    return rows


def read_topv2_rows(path: Path) -> list[dict]:
    """Rows of the prepared ``train.jsonl`` ({"id", "domain", "utterance", "semantic_parse"}), in file order."""
    return read_rows(path)


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


def news_examples(
    data_dir: Path, tokenizer: PreTrainedTokenizerBase, seq_len: int, limit: int, seed: int
) -> tuple[list[Example], int]:
    """``Article: <lead>\nSummary:`` + `` <highlights>\n\n`` per training article (seeded order), the lead cut
    so the example fits ``seq_len + 1`` tokens; articles whose summary alone takes over half of it are skipped.
    """
    rows = read_rows(Path(data_dir) / "cnndm" / "train.jsonl")
    rows = [rows[index] for index in seeded_permutation(len(rows), seed)]
    examples, skipped = [], 0
    for row in rows:
        summary = " ".join(str(row["highlights"]).split("\n"))
        head = tokenizer(format_example(row["article"]).removesuffix("\nSummary:"), verbose=False)["input_ids"]
        tail = tokenizer("\nSummary:", add_special_tokens=False, verbose=False)["input_ids"]
        target = tokenizer(f" {summary}\n\n", add_special_tokens=False, verbose=False)["input_ids"]
        room = seq_len + 1 - len(tail) - len(target)
        if len(target) > (seq_len + 1) // 2 or room < 8:
            skipped += 1
            continue
        prompt = [*head[:room], *tail]
        examples.append(Example((*prompt, *target), prompt_len=len(prompt)))
        if limit and len(examples) == limit:
            break
    return examples, skipped


def code_texts(data_dir: Path, seed: int) -> Iterable[str]:
    """The code corpus's documents (``code/train.jsonl``) in a seeded order."""
    rows = read_rows(Path(data_dir) / "code" / "train.jsonl")
    for index in seeded_permutation(len(rows), seed):
        yield str(rows[index]["text"])


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
    if name is CorpusName.NEWS:
        return news_examples(data_dir, tokenizer, seq_len, limit, seed)
    texts: dict[CorpusName, Callable[[], Iterable[str]]] = {
        CorpusName.CODE: lambda: code_texts(data_dir, seed),
        CorpusName.STDLIB_CODE: lambda: stdlib_texts(seed),
        CorpusName.DOCS_TEXT: lambda: docs_texts(seed),
    }
    return pack(texts[name](), tokenizer, seq_len, limit), 0


def mixture_counts(weights: Mapping[str, float], size: int) -> dict[str, int]:
    """Examples per corpus: ``weight / total * size`` rounded, at least 1 each, the rounding remainder given to
    the heaviest corpus so the counts add up to ``size``."""
    total = sum(weights.values())
    if not weights or total <= 0 or any(w <= 0 for w in weights.values()):
        raise ExitbenchError(f"train corpus weights must be positive, got {dict(weights)}")
    counts = {name: max(1, round(weight / total * size)) for name, weight in weights.items()}
    heaviest = max(weights, key=lambda name: weights[name])
    counts[heaviest] += size - sum(counts.values())
    return counts


def build_corpus(
    weights: Mapping[str, float] | Sequence[str],
    data_dir: Path,
    tokenizer: PreTrainedTokenizerBase,
    seq_len: int,
    size: int,
    seed: int,
) -> Corpus:
    """The seeded mixture of ``weights`` (corpus name -> weight; a list = equal weights) with ``size`` examples.

    ``size`` 0 = every example of every corpus, concatenated (no weighting). A corpus with fewer examples
    than its share is cycled through (an example then appears more than once; ``repeats`` in its counts).
    """
    if not isinstance(weights, Mapping):
        weights = dict.fromkeys(weights, 1.0)
    wanted = mixture_counts(weights, size) if size else dict.fromkeys(weights, 0)
    examples: list[Example] = []
    counts: dict[str, dict[str, int]] = {}
    for name, want in wanted.items():
        part, skipped = _load_one(CorpusName(name), Path(data_dir), tokenizer, seq_len, want, seed)
        if not part:
            raise ExitbenchError(f"corpus '{name}' produced no examples of at most {seq_len + 1} tokens")
        unique = len(part)
        if want:
            part = [part[i % unique] for i in range(want)]
        counts[name] = {**Corpus(part).totals(), "unique_examples": unique, "skipped_too_long": skipped}
        examples.extend(part)
    mixed = [examples[index] for index in seeded_permutation(len(examples), seed + 1)]
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
