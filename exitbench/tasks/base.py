"""The task interface and registry: rows in, prompts out, completions scored.

A task is one module with a registered :class:`Task` subclass plus one ``evaluate.tasks`` entry in
params.yaml. Tasks never import decoding; the evaluate stage composes the two.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from exitbench.errors import ExitbenchError
from exitbench.tasks.sampling import ONE_STRATUM, content_id, stratified_sample


@dataclass(frozen=True)
class Sample:
    """One evaluation item: the exact prompt text and what the completion is compared with."""

    sample_id: str
    prompt: str
    reference: str
    row: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class TaskSettings:
    """What the evaluate stage passes to a task (from params.yaml and base.seed)."""

    seed: int = 1234
    sandbox_timeout_s: float = 10.0


class Task:
    """Base class: subclasses set ``name``, ``split``, ``stop_strings``, ``primary_metric``."""

    name: ClassVar[str] = ""
    split: ClassVar[str] = "test"
    stop_strings: ClassVar[tuple[str, ...]] = ()
    primary_metric: ClassVar[str] = ""
    version: ClassVar[int] = 1  # bump when prompts or scoring change
    context_splits: ClassVar[tuple[str, ...]] = ()  # other splits the prompts draw on (few-shot examples)
    runs_generated_code: ClassVar[bool] = False  # scoring executes the model's output (in the sandbox)
    id_field: ClassVar[str] = "id"  # the row field holding its stable id (sample ids are never indices)
    stratum_field: ClassVar[str] = ""  # the row field the sample is stratified by ("" = one stratum)

    def __init__(self, settings: TaskSettings | None = None) -> None:
        self.settings = settings or TaskSettings()
        self.context: dict[str, list[dict[str, Any]]] = {}

    def set_context(self, rows_by_split: dict[str, list[dict[str, Any]]]) -> None:
        """Receive the rows of ``context_splits`` (few-shot examples) before :meth:`samples`."""
        self.context = rows_by_split

    def row_id(self, row: dict[str, Any]) -> str:
        """A row's stable id: its ``id_field`` as text, else a hash of its content (never its position)."""
        value = row.get(self.id_field)
        return content_id(row) if value is None or isinstance(value, bool) else str(value)

    def stratum(self, row: dict[str, Any]) -> str:
        """The stratum of a row in the sample draw (:data:`stratum_field`'s value; one stratum by default)."""
        return str(row.get(self.stratum_field, "?")) if self.stratum_field else ONE_STRATUM

    def sample_strategy(self) -> str:
        """How :meth:`samples` draws, as written into every summary."""
        return f"stratified by {self.stratum_field}" if self.stratum_field else "seeded"

    def samples(self, rows: Sequence[dict[str, Any]], num_samples: int, lower: str = "") -> list[Sample]:
        """A seeded draw of ``num_samples`` rows, stratified by :meth:`stratum`, as prompts.

        The draw (:func:`exitbench.tasks.sampling.stratified_sample`) depends only on the rows' ids and
        ``settings.seed``, and is prefix-stable: ``samples(rows, k)`` is ``samples(rows, n)[:k]``. ``lower``
        names the setting to lower in the error when there are too few rows (default: evaluate's).
        """
        lower = lower or f"evaluate.tasks.{self.name}.num_samples"
        drawn = stratified_sample(
            rows, num_samples, self.settings.seed, self.row_id, self.stratum, what=self.name, lower=lower
        )
        return [self.make_sample(index, row) for index, row in enumerate(drawn)]

    def make_sample(self, index: int, row: dict[str, Any]) -> Sample:
        """The prompt of ``row``, the ``index``-th of the draw; its ``sample_id`` is :meth:`row_id`."""
        raise NotImplementedError

    def postprocess(self, text: str) -> str:
        """Cut the completion at the first stop string (the decoder stopped on the token completing it)."""
        cut = min((text.find(s) for s in self.stop_strings if s in text), default=len(text))
        return text[:cut]

    def score(self, sample: Sample, completion: str) -> dict[str, float]:
        raise NotImplementedError

    def aggregate(self, samples: Sequence[Sample], scores: Sequence[dict[str, float]]) -> dict[str, Any]:
        """Mean of every per-sample metric."""
        if not scores:
            return {}
        keys = sorted({key for score in scores for key in score})
        return {key: sum(s.get(key, 0.0) for s in scores) / len(scores) for key in keys}


TASKS: dict[str, type[Task]] = {}


def register_task(cls: type[Task]) -> type[Task]:
    if not cls.name or cls.name in TASKS:
        raise ValueError(f"task name {cls.name!r} is empty or already registered")
    TASKS[cls.name] = cls
    return cls


def build_task(name: str, settings: TaskSettings | None = None) -> Task:
    if name not in TASKS:
        raise ExitbenchError(f"unknown task '{name}'; registered: {', '.join(sorted(TASKS))}")
    return TASKS[name](settings)


def require_isolation(task_names: Sequence[str]) -> None:
    """Before any work: when a task would execute generated code, check that the sandbox can isolate it here
    (one-line :class:`ExitbenchError` otherwise; see :func:`exitbench.tasks.sandbox.isolation`)."""
    import exitbench.tasks.registry  # noqa: F401  (registers every task)

    if any(TASKS[name].runs_generated_code for name in task_names if name in TASKS):
        from exitbench.tasks.sandbox import isolation

        isolation()


def require(row: dict[str, Any], key: str, task: str, kind: type = str) -> Any:
    """A row's field, or one clear error naming the task, the field and the fix."""
    value = row.get(key)
    if not isinstance(value, kind):
        raise ExitbenchError(
            f"{task}: malformed row (field '{key}' missing or not {kind.__name__}); re-run `dvc repro prepare_data`"
        )
    return value
