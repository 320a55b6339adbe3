"""Read and validate the result files the pipeline writes under ``results/``.

The report and check stages only read JSON; they never load a model or import torch. Optional stages
(sweep, probe, calibration, cost model, training) may be absent: their loaders return nothing and the
report says "not run". A file that is present but malformed is one :class:`ExitbenchError` line naming
the file, the field and what was expected. Unknown extra keys are ignored (writers may add fields);
``provenance`` keeps its extra keys (e.g. ``num_parameters``), which the check reads.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from exitbench.errors import ExitbenchError
from exitbench.records import stage_dir
from exitbench.replications import pydantic_error_line
from exitbench.stats import Interval

Model = TypeVar("Model", bound=BaseModel)


#: the fewest timed prompts a quoted speed-up may rest on: rerun on another data mirror, a 4-prompt CNN/DM speed-up
#: went from 1.31x to 1.02x [0.98, 1.14] while every verdict resting on 64-200 prompts held. A speed-up timed on
#: fewer is printed in parentheses as not quoted, and the check does not judge it.
MIN_SPEED_PROMPTS = 16


def too_few_timed(n: int | None) -> bool:
    """Whether a speed-up timed on ``n`` prompts is too thin to quote (:data:`MIN_SPEED_PROMPTS`)."""
    return n is not None and n < MIN_SPEED_PROMPTS


class _Lenient(BaseModel):
    """Result records: frozen; keys the reader does not use are ignored."""

    model_config = ConfigDict(extra="ignore", frozen=True)


class Provenance(BaseModel):
    """Where a number was measured. Extra keys (python, dtype, num_parameters, ...) are kept."""

    model_config = ConfigDict(extra="allow", frozen=True)

    git_commit: str
    device: str
    date: str
    command: str
    threads: int | None = Field(None, ge=0)
    profile: str | None = None
    params_hash: str | None = None
    torch: str | None = None
    transformers: str | None = None

    def extra(self, key: str) -> Any:
        return (self.model_extra or {}).get(key)

    @property
    def short_commit(self) -> str:
        return self.git_commit[:12] + ("+dirty" if self.git_commit.endswith("+dirty") else "")


class Speed(_Lenient):
    time_per_token_ms: float = Field(ge=0)
    speedup_vs_greedy: float | None = Field(gt=0)
    # a transformers peer against transformers' own greedy generate() (hf_greedy) on the same prompts
    speedup_vs_framework_greedy: float | None = Field(None, gt=0)
    acceptance_rate: float | None = Field(ge=0, le=1)
    tokens_per_round: float | None = Field(None, ge=0)
    num_tokens: int | None = Field(None, ge=0)
    ideal_fraction: float | None = Field(None, ge=0)
    avg_exit_layer: float | None = Field(None, ge=0)
    skip_rate: float | None = Field(None, ge=0, le=1, description="a routed method's share of routed layers skipped")


class Correctness(_Lenient):
    exact_claimed: bool
    num_mismatched: int | None = Field(None, ge=0)
    mismatch_rate: float | None = Field(None, ge=0, le=1)
    first_divergence_mean: float | None = Field(None, ge=0)
    num_compared: int | None = Field(None, ge=0)


def memory_text(memory: dict[str, Any]) -> str:
    """What a method holds beside the model (a separate draft), from an evaluate summary's ``extra_memory``."""
    text = f"{memory.get('what', 'extra weights')}: {memory['num_parameters'] / 1e6:.1f}M parameters"
    fraction = memory.get("fraction_of_model")
    share = f" ({100 * fraction:.0f}% of the model's weights)" if fraction is not None else ""
    text += f", {memory['bytes'] / 2**20:.0f} MiB{share}"
    if memory.get("kv_cache_bytes_per_token"):
        text += f", its KV cache {memory['kv_cache_bytes_per_token'] / 1024:.1f} KiB per token"
    return text


#: the oldest evaluate summary schema the report reads (exitbench.summaries.SUMMARY_SCHEMA); older ones are
#: migrated once by scripts/migrate_summaries.py
READ_SCHEMA = 2


class EvalResult(_Lenient):
    """``results/eval/<method stage>/<model>/<task>/<label>.json``."""

    task: str
    method: str
    model: str
    options: dict[str, Any] = {}
    schema_version: int = Field(1, ge=1, description="exitbench.summaries.SUMMARY_SCHEMA of the file (absent: 1)")
    primary_metric: str = Field(description="the task's primary quality metric")
    framework: str = Field(description="whose generate() ran: exitbench or transformers")
    num_samples: int = Field(ge=0)
    num_failed: int = Field(0, ge=0)
    quality: dict[str, float | dict[str, float] | None]
    speed: Speed
    correctness: Correctness
    dtype: str
    provenance: Provenance
    num_parameters: int | None = Field(None, ge=1)
    model_info: dict[str, Any] | None = None
    intervals: dict[str, dict[str, Any]] = Field(
        {},
        description="metric -> exitbench.stats.Interval.to_dict(): quality metrics by name, speedup_vs_greedy, "
        "acceptance_rate, mismatch_rate",
    )
    sample_ids: tuple[str, ...] = ()
    settings_key: str | None = Field(None, description="the key of this summary's per-sample records in the store")
    sample: dict[str, Any] | None = None
    base_method: str | None = Field(None, description="the registry method of an instance label (early_exit@8)")
    quality_from: dict[str, Any] | None = Field(
        None, description="{method, n, why}: an exact method's quality is that run's (greedy's), by construction"
    )
    chat_template: bool | None = Field(None, description="prompts went through the tokenizer's chat template")
    extra_memory: dict[str, Any] | None = Field(
        None, description="what the method holds beside the model (a separate draft: parameters, bytes, KV bytes/token)"
    )
    source_file: str = ""

    def interval(self, metric: str) -> Interval | None:
        """The confidence interval the evaluate stage stored for ``metric``, or None."""
        data = self.intervals.get(metric)
        return Interval.from_dict(data) if data else None

    @property
    def family(self) -> str:
        """The registry method (``early_exit`` for the instance ``early_exit@8``); a missing base_method = method."""
        return self.base_method or self.method

    @property
    def exit_layer(self) -> int | None:
        value = self.options.get("exit_layer")
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    @property
    def primary(self) -> str:
        """The task's primary quality metric, as the summary states it."""
        return self.primary_metric

    @property
    def quality_source(self) -> str | None:
        """The method whose quality this result reports (``quality_from.method``), or None: its own."""
        return self.quality_from.get("method") if isinstance(self.quality_from, dict) else None

    @model_validator(mode="before")
    @classmethod
    def _current_schema(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("schema_version", 1) < READ_SCHEMA:
            raise ValueError(
                f"an evaluate summary of schema {data.get('schema_version', 1)} (the report reads {READ_SCHEMA}): run "
                "`python scripts/migrate_summaries.py <results folder>` once (it adds what the newer schema states; "
                "no number changes)"
            )
        return data

    @model_validator(mode="after")
    def _failed_at_most_all(self) -> EvalResult:
        if self.num_failed > self.num_samples:
            raise ValueError(f"num_failed ({self.num_failed}) is larger than num_samples ({self.num_samples})")
        return self

    def scalar_quality(self) -> dict[str, float]:
        """The quality metrics that are single numbers (``per_domain`` and nulls left out)."""
        return {k: v for k, v in self.quality.items() if isinstance(v, int | float) and not isinstance(v, bool)}


class CostSet(NamedTuple):
    """One set of step costs relative to a greedy step, in the order the cost model takes them."""

    c_draft: float
    c_verify: float
    c_tail: float


class SweepRow(_Lenient):
    model: str
    dtype: str
    method: str
    exit_layer: int | None = Field(None, ge=0)
    num_speculations: int | None = Field(None, ge=1)
    time_per_token_ms: float = Field(ge=0)
    iqr_ms: float | None = Field(None, ge=0)
    speedup_vs_greedy: float | None = Field(None, gt=0)
    acceptance_rate: float | None = Field(None, ge=0, le=1)
    tokens_per_round: float | None = Field(None, ge=0)
    c_draft: float | None = Field(None, gt=0)
    c_tail: float | None = Field(None, ge=0)  # absent from sweeps written before it was measured
    c_verify: float | None = Field(None, gt=0)
    ideal_speedup: float | None = Field(None, gt=0)
    ideal_fraction: float | None = Field(None, ge=0)
    exact: bool | None = None
    num_mismatched: int | None = Field(None, ge=0)
    num_prompts: int = Field(ge=1)
    max_new_tokens: int = Field(ge=1)
    speedup_vs_greedy_low: float | None = Field(None, ge=0)
    speedup_vs_greedy_high: float | None = Field(None, ge=0)
    speedup_vs_greedy_n: int | None = Field(None, ge=1)
    acceptance_rate_low: float | None = Field(None, ge=0, le=1)
    acceptance_rate_high: float | None = Field(None, ge=0, le=1)
    acceptance_rate_n: int | None = Field(None, ge=1)
    bytes_per_token: float | None = Field(None, gt=0)  # absent from sweeps written before the roofline
    roofline_ms_per_token: float | None = Field(None, gt=0)
    roofline_fraction: float | None = Field(None, gt=0)
    speedup_passes: tuple[float, ...] | None = None  # one speed-up per timing pass (absent before passes)
    # each step cost's interval over its timing rounds (absent from sweeps written before it was measured)
    c_draft_low: float | None = Field(None, gt=0)
    c_draft_high: float | None = Field(None, gt=0)
    c_tail_low: float | None = Field(None, ge=0)
    c_tail_high: float | None = Field(None, ge=0)
    c_verify_low: float | None = Field(None, gt=0)
    c_verify_high: float | None = Field(None, gt=0)

    def cost_bounds(self) -> tuple[CostSet, CostSet] | None:
        """(lowest, highest) (c_draft, c_verify, c_tail) over the costs' intervals, or None if not recorded."""
        ends = [self.c_draft_low, self.c_draft_high, self.c_verify_low, self.c_verify_high]
        if any(value is None for value in ends):
            return None
        tail_low = self.c_tail_low if self.c_tail_low is not None else self.c_tail or 0.0
        tail_high = self.c_tail_high if self.c_tail_high is not None else self.c_tail or 0.0
        low = CostSet(self.c_draft_low or 0.0, self.c_verify_low or 0.0, tail_low)
        return low, CostSet(self.c_draft_high or 0.0, self.c_verify_high or 0.0, tail_high)

    def interval(self, metric: str) -> Interval | None:
        """``speedup_vs_greedy`` or ``acceptance_rate`` with the sweep's paired interval over prompts, or None."""
        estimate, low, high = (getattr(self, f"{metric}{suffix}", None) for suffix in ("", "_low", "_high"))
        if estimate is None or low is None or high is None:
            return None
        return Interval(estimate, low, high, getattr(self, f"{metric}_n", None) or self.num_prompts)


class Sweep(_Lenient):
    """``results/bench/sweep.json``."""

    rows: tuple[SweepRow, ...]
    provenance: Provenance
    task: str | None = Field(None, description="the task whose prompts were timed (bench.task)")
    source_file: str = ""


class ProbeCurves(_Lenient):
    """One probe text's per-layer curves (the probe stage writes ``top1_agreement``)."""

    agreement: tuple[float, ...] = Field(min_length=1, validation_alias=AliasChoices("agreement", "top1_agreement"))
    median_rank: tuple[float, ...] = ()
    confidence: tuple[float, ...] = ()
    num_texts: int | None = Field(None, ge=0)
    num_tokens: int | None = Field(None, ge=0)

    @model_validator(mode="after")
    def _same_length(self) -> ProbeCurves:
        if any(not 0.0 <= a <= 1.0 for a in self.agreement):
            raise ValueError("agreement values must be fractions in [0, 1]")
        for name in ("median_rank", "confidence"):
            values = getattr(self, name)
            if values and len(values) != len(self.agreement):
                raise ValueError(f"{name} has {len(values)} layers but agreement has {len(self.agreement)}")
        return self


class Probe(_Lenient):
    """``results/probe/<model>.json``: per-layer readability of the shared LM head."""

    model: str
    num_layers: int = Field(ge=1)
    texts: dict[str, ProbeCurves] = Field(min_length=1)
    provenance: Provenance
    source_file: str = ""


class CalibrationRow(_Lenient):
    """One calibrated threshold. Accepts the calibrate stage's names (``calibration_mean_risk``, and a
    ``quality: {metric, calm, greedy}`` block, read into ``quality_*``; ``quality_vs_greedy`` = calm / greedy).
    ``certified`` False means no candidate passed and ``threshold`` is the fallback ``lambda = 1``."""

    task: str
    measure: str
    kv_strategy: str
    delta: float = Field(gt=0, lt=1)
    threshold: float | None = None
    certified: bool | None = None
    calibration_risk: float | None = Field(
        None, validation_alias=AliasChoices("calibration_risk", "calibration_mean_risk")
    )
    test_risk: float | None = None
    risk_ok: bool | None = None
    avg_exit_layer: float | None = Field(None, ge=0)
    speedup_vs_greedy: float | None = Field(None, gt=0)
    quality_vs_greedy: float | None = None
    quality_metric: str | None = None
    quality_calm: float | None = None
    quality_greedy: float | None = None
    num_calibration: int | None = Field(None, ge=1)
    min_num_calibration: int | None = Field(None, ge=1)
    num_test: int | None = Field(None, ge=1)
    consistency: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _quality(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not isinstance(data.get("quality"), dict):
            return data
        quality = data["quality"]
        calm, greedy = quality.get("calm"), quality.get("greedy")
        data = {"quality_metric": quality.get("metric"), "quality_calm": calm, "quality_greedy": greedy, **data}
        if (
            "quality_vs_greedy" not in data
            and isinstance(calm, int | float)
            and isinstance(greedy, int | float)
            and greedy > 0
        ):
            data["quality_vs_greedy"] = calm / greedy
        return data


class CalibrationCurve(_Lenient):
    """Risk and speed-up over the threshold grid (the calibrate stage writes the calibration-split mean risk
    as ``calibration_mean_risk`` and the speed-up as ``speedup_vs_greedy``)."""

    task: str
    measure: str
    kv_strategy: str
    thresholds: tuple[float, ...] = Field(min_length=1)
    risk: tuple[float | None, ...] = Field(validation_alias=AliasChoices("risk", "calibration_mean_risk"))
    speedup: tuple[float | None, ...] = Field(validation_alias=AliasChoices("speedup", "speedup_vs_greedy"))

    @model_validator(mode="after")
    def _same_length(self) -> CalibrationCurve:
        n = len(self.thresholds)
        for name in ("risk", "speedup"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"{name} has {len(getattr(self, name))} values but thresholds has {n}")
        return self


class Calibration(_Lenient):
    """``results/calibrate/<model>.json``: CALM thresholds calibrated per task, measure and KV strategy.

    ``rows`` may be named ``results``; a top-level ``risk`` ("textual" or "risk") is the consistency objective.
    """

    model: str
    rows: tuple[CalibrationRow, ...] = Field(validation_alias=AliasChoices("rows", "results"))
    curves: tuple[CalibrationCurve, ...] = ()
    consistency: str | None = Field(None, validation_alias=AliasChoices("consistency", "risk"))
    speedup_measures: str | None = None
    provenance: Provenance
    source_file: str = ""


class CostShape(_Lenient):
    c_draft: dict[int, float]
    c_verify: dict[str, float]

    @field_validator("c_verify")
    @classmethod
    def _keys_are_e_comma_d(cls, value: dict[str, float]) -> dict[str, float]:
        bad = [key for key in value if not re.fullmatch(r"\d+,\d+", key.replace(" ", ""))]
        if bad:
            raise ValueError(f"keys must be 'E,d' (e.g. '8,12'), got {bad[0]!r}")
        return {key.replace(" ", ""): cost for key, cost in value.items()}

    def verify(self, exit_layer: int, num_speculations: int) -> float | None:
        return self.c_verify.get(f"{exit_layer},{num_speculations}")


class CostModel(_Lenient):
    """``results/cost_model/*.json``: measured draft/verify costs per model shape."""

    device: str
    dtype: str
    shapes: dict[str, CostShape]
    provenance: Provenance
    source_file: str = ""


@dataclass(frozen=True)
class TrainReport:
    """``results/train/<variant>.json``: shown as reported (any JSON object)."""

    variant: str
    data: dict[str, Any]
    source_file: str


@dataclass(frozen=True)
class Results:
    """Everything under one results directory; absent optional stages are empty."""

    root: Path
    evals: tuple[EvalResult, ...]
    sweep: Sweep | None
    probes: tuple[Probe, ...]
    calibrations: tuple[Calibration, ...]
    cost_models: tuple[CostModel, ...]
    trains: tuple[TrainReport, ...]
    throughput: dict[str, Any] | None = None  # results/throughput/throughput.json (exitbench.report.throughput)
    #: the add-ons' training reports: results/adapters/<model>.json and results/routers/<model>.json, by folder
    addons: dict[str, tuple[TrainReport, ...]] = field(default_factory=dict)

    def eval_models(self) -> list[str]:
        return sorted({r.model for r in self.evals})

    def eval_tasks(self) -> list[str]:
        return sorted({r.task for r in self.evals})


def read_json(path: Path) -> Any:
    """Parse one JSON file; a read or syntax error is one line naming the file and position."""
    try:
        text = path.read_text()
    except OSError as err:
        raise ExitbenchError(f"{path}: cannot be read ({err.strerror})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise ExitbenchError(f"{path}: not valid JSON (line {err.lineno}, column {err.colno}: {err.msg})") from None


def _display_name(path: Path, root: Path) -> str:
    """``results/eval/base/cnndm/greedy.json`` style: the results directory's name plus the relative path."""
    try:
        return (Path(root.name) / path.relative_to(root)).as_posix()
    except ValueError:
        return path.as_posix()


def _parse(model: type[Model], path: Path, root: Path) -> Model:
    data = read_json(path)
    if not isinstance(data, dict):
        raise ExitbenchError(f"{path}: expected a JSON object at the top level, got {type(data).__name__}")
    data = {**data, "source_file": _display_name(path, root)}
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise ExitbenchError(pydantic_error_line(err, str(path))) from None


def _check_path_matches(result: EvalResult, path: Path) -> None:
    expected = {"model": path.parent.parent.name, "task": path.parent.name, "method": path.stem}
    expected["stage"] = path.parent.parent.parent.name
    for key, value in expected.items():
        found = result.family if key == "stage" else getattr(result, key)
        if found != value:
            raise ExitbenchError(
                f"{path}: '{key}' is {found!r} but the path says {value!r} "
                "(expected eval/<method's stage>/<model>/<task>/<method>.json)"
            )


def eval_records_path(root: Path, result: EvalResult) -> Path:
    """The per-sample records beside an evaluate summary."""
    return stage_dir(root / "eval", result.family, result.model, result.task) / f"{result.method}.jsonl"


#: inputs evaluate keeps beside the summaries (a draft sub-vocabulary, calibration text), not results
EVAL_INPUT_FILES = frozenset({"draft_vocab.json", "calibration.json"})


def load_evals(root: Path) -> tuple[EvalResult, ...]:
    results = []
    for path in sorted((root / "eval").glob("*/*/*/*.json")):  # eval/<stage>/<model>/<task>/<label>.json
        if path.name in EVAL_INPUT_FILES:
            continue
        result = _parse(EvalResult, path, root)
        _check_path_matches(result, path)
        results.append(result)
    return tuple(results)


def load_sweep(root: Path) -> Sweep | None:
    path = root / "bench" / "sweep.json"
    return _parse(Sweep, path, root) if path.exists() else None


def load_probes(root: Path) -> tuple[Probe, ...]:
    """Every probed model's curves (a model the profile or experiment does not probe leaves a ``skipped`` stub)."""
    paths = [path for path in sorted((root / "probe").glob("*.json")) if "skipped" not in _peek(path)]
    return tuple(_parse(Probe, path, root) for path in paths)


def _peek(path: Path) -> dict[str, Any]:
    data = read_json(path)
    return data if isinstance(data, dict) else {}


def load_calibrations(root: Path) -> tuple[Calibration, ...]:
    return tuple(_parse(Calibration, path, root) for path in sorted((root / "calibrate").glob("*.json")))


def load_cost_models(root: Path) -> tuple[CostModel, ...]:
    return tuple(_parse(CostModel, path, root) for path in sorted((root / "cost_model").glob("*.json")))


def load_trains(root: Path) -> tuple[TrainReport, ...]:
    reports = []
    for path in sorted((root / "train").glob("*.json")):
        data = read_json(path)
        if not isinstance(data, dict):
            raise ExitbenchError(f"{path}: expected a JSON object (a training report), got {type(data).__name__}")
        reports.append(TrainReport(path.stem, data, _display_name(path, root)))
    return tuple(reports)


#: the add-on training stages' report folders (exitbench.models.trained)
ADDON_FOLDERS = ("adapters", "routers")


def load_addons(root: Path) -> dict[str, tuple[TrainReport, ...]]:
    """Each add-on stage's training reports (``<root>/<folder>/<model>.json``), by folder; absent folders left out."""
    out = {}
    for folder in ADDON_FOLDERS:
        reports = []
        for path in sorted((root / folder).glob("*.json")):
            data = read_json(path)
            if not isinstance(data, dict):
                raise ExitbenchError(f"{path}: expected a JSON object (a training report), got {type(data).__name__}")
            reports.append(TrainReport(path.stem, data, _display_name(path, root)))
        if reports:
            out[folder] = tuple(reports)
    return out


def load_throughput(root: Path) -> dict[str, Any] | None:
    """``results/throughput/throughput.json`` (the throughput stage's rows), or None when it has not run."""
    path = root / "throughput" / "throughput.json"
    if not path.exists():
        return None
    data = read_json(path)
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list) or "provenance" not in data:
        raise ExitbenchError(f"{path}: expected the throughput stage's JSON (rows, provenance); `dvc repro throughput`")
    return data


def load_results(root: str | Path) -> Results:
    """Load and validate every result file under ``root``; the directory itself must exist."""
    root = Path(root)
    if not root.is_dir():
        raise ExitbenchError(f"{root}: results directory not found; run the pipeline (`dvc repro`) first")
    return Results(
        root=root,
        evals=load_evals(root),
        sweep=load_sweep(root),
        probes=load_probes(root),
        calibrations=load_calibrations(root),
        cost_models=load_cost_models(root),
        trains=load_trains(root),
        throughput=load_throughput(root),
        addons=load_addons(root),
    )
