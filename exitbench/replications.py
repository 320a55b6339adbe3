"""The published figures exitbench compares against: ``replications/*.yaml``, loaded and validated.

One YAML file per paper. Each ``rows`` entry is one figure of one table (its source, the setting it was
measured in, the reported values, the tolerance on speed-up and the exitbench task/method it maps to);
``training`` holds the paper's training hyper-parameters per experiment; ``caveats`` lists the paper's own
measurement caveats. Everything is frozen and unknown keys are rejected, so a typo in a YAML file is one
clear error instead of a silently missing comparison. Values are fractions (0.689, not 68.9%).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from exitbench.errors import ExitbenchError

Task = Literal["cnndm", "xsum", "humaneval", "mbpp", "topv2", "wmt", "squad"]
Method = Literal["autoregressive", "early_exit", "self_speculative", "calm"]
HardwareKind = Literal["cpu", "gpu", "tpu"]


def pydantic_error_line(err: ValidationError, source: str) -> str:
    """One line naming the file, the first failing field, what was wrong, and the offending value."""
    first = err.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "(top level)"
    if first["type"] == "extra_forbidden":
        return f"{source}: unknown key '{where}'"
    if first["type"] == "missing":
        return f"{source}: '{where}' is missing"
    got = first.get("input")
    shown = "" if isinstance(got, dict | list) else f" (got {got!r})"
    more = f" (+{len(err.errors()) - 1} more)" if len(err.errors()) > 1 else ""
    return f"{source}: '{where}': {first['msg']}{shown}{more}"


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Source(_Frozen):
    """Where in the paper a figure is printed."""

    table: str = Field(description="e.g. 'Table 3' or 'Table 11 (Appendix A.2.1)'")
    row: str = Field(description="the row (and column group) as printed")


class Setting(_Frozen):
    """What the paper measured: model, hardware, decoding configuration, metric and sample count."""

    model: str
    params_b: float | None = Field(None, gt=0, description="parameters, billions")
    num_layers: int | None = Field(None, ge=1, description="decoder layers")
    architecture: Literal["decoder-only", "encoder-decoder"] = "decoder-only"
    hardware: str
    hardware_kind: HardwareKind
    exit_layer: int | None = Field(None, ge=1, description="E: layers run before the shared LM head")
    num_speculations: int | None = Field(None, ge=1, description="d: tokens drafted per round")
    metric: str = Field(description="the quality metric reported (rouge2, exact_match, ...)")
    num_samples: int | None = Field(None, ge=1, description="evaluation examples, where stated")
    max_new_tokens: int | None = Field(None, ge=1)
    decoding: str = "greedy"
    shots: int | None = Field(None, ge=0)
    shape: str | None = Field(None, description="the cost_model shape name that describes this model")
    measure: Literal["softmax", "state", "classifier"] | None = None
    consistency: Literal["textual", "risk"] | None = None
    delta: float | None = Field(None, gt=0, lt=1)
    epsilon: float | None = Field(None, gt=0, lt=1)
    tau: float | None = Field(None, ge=0, description="CALM decaying-threshold temperature")


class Baseline(_Frozen):
    """The paper's reference row (its autoregressive or full-model run)."""

    description: str
    quality: dict[str, float] = {}
    tokens_per_second: float | None = Field(None, gt=0)
    time_per_token_ms: float | None = Field(None, gt=0)


class Reported(_Frozen):
    """The printed values. ``speedup`` only when the paper states it; ``speedup_derived`` is ours."""

    speedup: float | None = Field(None, gt=0)
    speedup_derived: float | None = Field(None, gt=0)
    derived_from: str | None = None
    quality: dict[str, float] = {}
    acceptance: float | None = Field(None, ge=0, le=1)
    tokens_per_second: float | None = Field(None, gt=0)
    time_per_token_ms: float | None = Field(None, gt=0)
    avg_layers: float | None = Field(None, gt=0, description="average decoder layers per token (CALM)")
    flops_reduction: float | None = Field(None, gt=0)
    baseline: Baseline | None = None

    @model_validator(mode="after")
    def _derivation_explained(self) -> Reported:
        if self.speedup_derived is not None and not self.derived_from:
            raise ValueError("speedup_derived needs derived_from (which printed numbers it is computed from)")
        return self


class MapsTo(_Frozen):
    """The exitbench measurement this row is compared with."""

    task: Task
    method: Method
    measure: Literal["softmax", "state", "classifier"] | None = None
    delta: float | None = Field(None, gt=0, lt=1)
    ablation: str | None = Field(None, description="a paper ablation exitbench does not run (kept for reference)")


class Row(_Frozen):
    """One published figure."""

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]*$")
    source: Source
    setting: Setting
    reported: Reported
    tolerance: float | None = Field(None, ge=0, description="relative, on speed-up; None = the check's default")
    maps_to: MapsTo
    headline: bool = Field(False, description="a figure quoted in the paper's abstract")
    unverified: bool = False
    unverified_fields: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _consistent(self) -> Row:
        if self.unverified_fields and not self.unverified:
            raise ValueError("unverified_fields is set, so unverified must be true")
        if self.unverified and not self.notes:
            raise ValueError("an unverified row needs a note saying what is uncertain and why")
        if self.headline and self.reported.speedup is None:
            raise ValueError("a headline row needs the paper's stated speedup")
        if self.reported.speedup is None and self.reported.speedup_derived is None and not self.reported.quality:
            raise ValueError("reported needs a speedup, a speedup_derived or a quality value")
        return self

    @property
    def paper_speedup(self) -> tuple[float, bool] | None:
        """The speed-up to compare with and whether it is derived by us (not printed), or None."""
        if self.reported.speedup is not None:
            return self.reported.speedup, False
        if self.reported.speedup_derived is not None:
            return self.reported.speedup_derived, True
        return None

    def tolerance_or(self, default: float) -> float:
        return default if self.tolerance is None else self.tolerance

    @property
    def label(self) -> str:
        """A short legend label, e.g. 'Llama2 7B, H100, E8 d12' (parentheticals dropped)."""
        parts = [short_name(self.setting.model), short_name(self.setting.hardware)]
        if self.setting.exit_layer is not None:
            config = f"E{self.setting.exit_layer}"
            if self.setting.num_speculations is not None:
                config += f" d{self.setting.num_speculations}"
            parts.append(config)
        if self.setting.measure is not None:
            parts.append(f"{self.setting.measure}, {self.setting.consistency} δ={self.setting.delta:g}")
        return ", ".join(parts)


def short_name(text: str) -> str:
    """'Llama2 7B (continual pretraining)' -> 'Llama2 7B': the text before a parenthetical."""
    return text.split(" (", 1)[0].strip()


class TrainingRecipe(_Frozen):
    """A paper's training hyper-parameters for one experiment."""

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]*$")
    source: str = Field(description="section / table where these values are printed")
    model: str
    kind: Literal["continual_pretraining", "pretraining_from_scratch", "finetuning_domain", "finetuning_task"]
    data: str
    tokens: str | None = None
    steps: int | None = Field(None, ge=1)
    batch_size: int | None = Field(None, ge=1)
    batch_size_note: str | None = None
    lr: float | tuple[float, ...] | None = None
    lr_without_layer_dropout: float | None = Field(None, gt=0)
    optimizer: str | None = None
    p_max: float | None = Field(None, ge=0, le=1)
    e_scale: float | None = Field(None, ge=0, le=1)
    layer_dropout_curriculum: Literal["constant", "exponential"] | None = None
    early_exit_curriculum: Literal["rotational", "gradual", "all_layers"] | None = None
    rotation: int | None = Field(None, ge=1, description="R of the rotational early-exit curriculum")
    loss_weighting: str | None = None
    hardware: str | None = None
    exitbench_variant: str | None = Field(None, description="the params.yaml train variant modelled on it")
    unverified: bool = False
    notes: tuple[str, ...] = ()


class Paper(_Frozen):
    """One ``replications/<paper>.yaml`` file."""

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]*$")
    title: str
    authors: str
    venue: str
    year: int
    arxiv: str
    version: str = Field(description="which version of the paper the figures were read from")
    url: str
    caveats: tuple[str, ...]
    rows: tuple[Row, ...]
    training: tuple[TrainingRecipe, ...] = ()

    @model_validator(mode="after")
    def _unique_ids(self) -> Paper:
        for kind, ids in (("row", [r.id for r in self.rows]), ("training", [t.id for t in self.training])):
            seen = {i for i in ids if ids.count(i) > 1}
            if seen:
                raise ValueError(f"duplicate {kind} id(s): {', '.join(sorted(seen))}")
        return self


def load_paper(path: str | Path) -> Paper:
    """Read and validate one replication file."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as err:
        raise ExitbenchError(f"{path}: cannot be read ({err.strerror})") from None
    except yaml.YAMLError as err:
        raise ExitbenchError(f"{path}: not valid YAML ({str(err).splitlines()[0]})") from None
    if not isinstance(raw, dict):
        raise ExitbenchError(f"{path}: expected a mapping with id, title, ..., rows")
    try:
        return Paper.model_validate(raw)
    except ValidationError as err:
        raise ExitbenchError(pydantic_error_line(err, str(path))) from None


def load_replications(directory: str | Path) -> tuple[Paper, ...]:
    """Every ``*.yaml`` paper file in ``directory`` (sorted by name); row ids are unique across papers."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ExitbenchError(f"{directory}: replications directory not found (expected replications/*.yaml)")
    papers = tuple(load_paper(path) for path in sorted(directory.glob("*.yaml")))
    if not papers:
        raise ExitbenchError(f"{directory}: no *.yaml replication files")
    seen: dict[str, str] = {}
    for paper in papers:
        for row in paper.rows:
            if row.id in seen:
                raise ExitbenchError(f"{directory}: row id '{row.id}' appears in both {seen[row.id]} and {paper.id}")
            seen[row.id] = paper.id
    return papers
