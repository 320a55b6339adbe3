"""The published figures exitbench compares against: ``replications/*.yaml``, loaded and validated.

One YAML file per paper. Each ``rows`` entry is one figure of one table (its source, the setting it was
measured in, the reported values, the tolerance on speed-up and the exitbench task/method it maps to);
``training`` holds the paper's training hyper-parameters per experiment; ``caveats`` lists the paper's own
measurement caveats; ``claims`` lists statements that do not depend on hardware kind or model size (a
trend over relative depth, a ratio within one model, an exactness or a guarantee), each with the rule
that computes our side and a tolerance band (see :class:`Claim`). Everything is frozen and unknown keys are
rejected, so a typo in a YAML file is one clear error instead of a silently missing comparison. Values
are fractions (0.689, not 68.9%).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from exitbench.config import StrictLoader
from exitbench.errors import ExitbenchError

#: exitbench's tasks and the papers' others; lm_eval_avg: an average over lm-evaluation-harness tasks (none run here)
Task = Literal["cnndm", "xsum", "humaneval", "mbpp", "topv2", "wmt", "squad", "lm_eval_avg"]
Method = Literal["autoregressive", "early_exit", "self_speculative", "speculative", "calm", "swift", "kangaroo",
                 "mindskip"]
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

    def reported_value(self, field: str) -> float | None:
        """A printed value by name: ``acceptance``, ``speedup`` (printed, else derived), ``avg_layers``,
        ``time_per_token_ms``, ``quality.<metric>`` or ``baseline.quality.<metric>``; None when absent."""
        reported = self.reported
        if field == "speedup":
            return None if self.paper_speedup is None else self.paper_speedup[0]
        if field in ("acceptance", "avg_layers", "time_per_token_ms", "flops_reduction"):
            return getattr(reported, field)
        if field.startswith("quality."):
            return reported.quality.get(field.removeprefix("quality."))
        if field.startswith("baseline.quality.") and reported.baseline is not None:
            return reported.baseline.quality.get(field.removeprefix("baseline.quality."))
        return None

    @property
    def relative_depth(self) -> float | None:
        """E / L of this row's exit layer, or None when either is not stated."""
        if self.setting.exit_layer is None or self.setting.num_layers is None:
            return None
        return self.setting.exit_layer / self.setting.num_layers

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


ClaimKind = Literal[
    "acceptance_at_depth",
    "speedup_at_depth",
    "exit_quality_fraction",
    "exit_quality_fraction_gain",
    "last_layer_cost",
    "exactness",
    "speculative_bound",
    "speculative_bound_paper",
    "calm_risk_guarantee",
    "calm_measure_order",
    "shared_compute",
    "quality_fraction",
    "quality_above_control",
]
Bound = Literal["within", "at_most", "above"]

# kind -> (maps_to keys it needs, paper keys it needs, the band it is judged against)
CLAIM_KINDS: dict[str, tuple[tuple[str, ...], tuple[str, ...], Bound]] = {
    "acceptance_at_depth": (("task", "method"), ("rows", "field"), "within"),
    "speedup_at_depth": (("task", "method"), ("rows", "field"), "within"),
    "exit_quality_fraction": (("task", "method", "reference_method", "metric"), ("rows", "field", "reference_row"),
                              "within"),
    "exit_quality_fraction_gain": (("task", "models", "control", "method", "reference_method", "metric"), ("value",),
                                   "above"),
    "last_layer_cost": (("task", "models", "control", "method", "metric"), ("rows", "field", "reference_field"),
                        "within"),
    "exactness": (("method",), ("value",), "at_most"),
    "speculative_bound": (("method",), ("value",), "at_most"),
    "speculative_bound_paper": ((), ("rows", "value"), "at_most"),
    "calm_risk_guarantee": ((), (), "at_most"),
    "calm_measure_order": ((), ("rows", "field"), "above"),
    "shared_compute": (("method", "reference_method"), ("value",), "above"),
    "quality_fraction": (("method", "reference_method"), ("rows", "field", "reference_field"), "within"),
    "quality_above_control": (("method", "control_label"), ("value",), "above"),
}
CURVE_KINDS = ("acceptance_at_depth", "speedup_at_depth", "exit_quality_fraction")


class ClaimSource(_Frozen):
    """Where the paper states the claim: a table or a section, and the rows/columns/sentence it rests on."""

    table: str | None = None
    section: str | None = None
    row: str = Field(description="the rows, columns or sentence the claim reads, as printed")

    @model_validator(mode="after")
    def _somewhere(self) -> ClaimSource:
        if self.table is None and self.section is None:
            raise ValueError("a claim's source needs a table or a section")
        return self

    def describe(self) -> str:
        return f"{' · '.join(p for p in (self.table, self.section) if p)}: {self.row}"


class ClaimPaper(_Frozen):
    """The paper's side. Numbers are read from this file's ``rows`` (never typed in twice): ``field`` of each
    row (see :meth:`Row.reported_value`), divided by (fractions) or minus (differences) ``reference_field`` of
    ``reference_row`` (default: the same row). ``value`` is a bound the paper states in words (0 mismatches,
    a speed-up ratio of 1, a gain of 0), with the claim's source saying where."""

    rows: tuple[str, ...] = ()
    field: str | None = None
    reference_row: str | None = None
    reference_field: str | None = None
    value: float | None = None


class ClaimMapsTo(_Frozen):
    """Which of our results the claim's rule reads."""

    task: Task | None = Field(None, description="None: every task the results hold")
    models: tuple[str, ...] = Field((), description="our models; empty: every model the results hold")
    control: str | None = Field(None, description="the control model (e.g. plain: the same finetune without "
                                                  "LayerSkip); never replaced by another model when missing")
    method: Method | None = None
    reference_method: Method | None = Field(None, description="the denominator's method (e.g. autoregressive)")
    metric: str | None = Field(None, description="None: each task's primary metric")
    control_label: str | None = Field(None, description="the control's evaluate label, e.g. mindskip@static: the "
                                                        "same method and model with a fixed skip set")
    kv_strategy: str | None = Field(None, description="CALM KV strategy to read (None: every one)")


class Claim(_Frozen):
    """A statement of the paper that does not depend on hardware kind or model size, with its verdict rule.

    ``kind`` names the rule that computes our side (an interval) and the band it is judged against:
    ``within`` (the paper's value ± tolerance, absolute or relative), ``at_most`` (≤ value + tolerance) or
    ``above`` (> value + tolerance). reproduced: our interval inside the band; not reproduced: entirely
    outside; inconclusive: it straddles an edge; not measured: the results lack what the rule needs.
    """

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]*$")
    statement: str
    source: ClaimSource
    kind: ClaimKind
    paper: ClaimPaper = ClaimPaper()
    maps_to: ClaimMapsTo = ClaimMapsTo()
    tolerance: float = Field(ge=0, description="band half-width (within) or slack/margin (at_most/above)")
    tolerance_mode: Literal["absolute", "relative"] = "absolute"
    unverified: bool = False
    notes: tuple[str, ...] = ()

    @property
    def bound(self) -> Bound:
        return CLAIM_KINDS[self.kind][2]

    @model_validator(mode="after")
    def _has_what_its_kind_needs(self) -> Claim:
        maps_to_keys, paper_keys, bound = CLAIM_KINDS[self.kind]
        for prefix, block, keys in (("maps_to", self.maps_to, maps_to_keys), ("paper", self.paper, paper_keys)):
            for key in keys:
                if getattr(block, key) in (None, ()):
                    raise ValueError(f"'{prefix}.{key}': kind '{self.kind}' needs it")
        if self.tolerance_mode == "relative" and bound != "within":
            raise ValueError(f"'tolerance_mode': relative needs a 'within' band; kind '{self.kind}' is '{bound}'")
        if self.unverified and not self.notes:
            raise ValueError("'notes': an unverified claim needs a note saying what is uncertain and why")
        return self


def claim_paper_values(claim: Claim, rows: dict[str, Row]) -> tuple[tuple[float | None, float, str], ...]:
    """The paper's values of a claim as (E/L, value, row id), one per ``paper.rows`` entry: ``field``, over
    (``exit_quality_fraction``, ``quality_fraction``) or minus (``last_layer_cost``) the reference. Raises ValueError
    naming the key."""
    paper = claim.paper
    out = []
    for row_id in paper.rows:
        if row_id not in rows:
            raise ValueError(f"'paper.rows': unknown row '{row_id}' (not in this file)")
        row = rows[row_id]
        value = row.reported_value(paper.field or "")
        if value is None:
            raise ValueError(f"'paper.field': row '{row_id}' has no value '{paper.field}'")
        if claim.kind in ("exit_quality_fraction", "quality_fraction", "last_layer_cost"):
            ref_id = paper.reference_row or row_id
            if ref_id not in rows:
                raise ValueError(f"'paper.reference_row': unknown row '{ref_id}' (not in this file)")
            ref_field = paper.reference_field or paper.field or ""
            reference = rows[ref_id].reported_value(ref_field)
            fraction = claim.kind != "last_layer_cost"
            if reference is None or (fraction and reference <= 0):
                raise ValueError(f"'paper.reference_field': row '{ref_id}' has no positive value '{ref_field}'")
            value = value / reference if fraction else value - reference
        if claim.kind == "speculative_bound_paper":
            setting = row.setting
            if None in (row.reported.acceptance, setting.exit_layer, setting.num_speculations, setting.num_layers):
                raise ValueError(f"'paper.rows': row '{row_id}' needs acceptance, exit_layer, num_speculations "
                                 "and num_layers for the cost model")
        out.append((row.relative_depth, value, row_id))
    if claim.kind in CURVE_KINDS:
        depths = [x for x, _, _ in out]
        if None in depths:
            raise ValueError("'paper.rows': a curve over E/L needs exit_layer and num_layers in every row's setting")
        if len(set(depths)) != len(depths):
            raise ValueError("'paper.rows': two rows have the same E/L")
    return tuple(out)


def paper_measure_order(claim: Claim, rows: dict[str, Row]) -> tuple[str, ...]:
    """The confidence measures in increasing ``field`` (e.g. average exit layer), the same in every group of
    the claim's rows that share task, consistency objective and δ. Raises ValueError naming the key."""
    groups: dict[tuple[str, str | None, float | None], list[tuple[float, str]]] = {}
    for (_, value, row_id) in claim_paper_values(claim, rows):
        setting = rows[row_id].setting
        if setting.measure is None:
            raise ValueError(f"'paper.rows': row '{row_id}' names no confidence measure")
        key = (rows[row_id].maps_to.task, setting.consistency, setting.delta)
        groups.setdefault(key, []).append((value, setting.measure))
    orders = {tuple(m for _, m in sorted(group)) for group in groups.values() if len(group) > 1}
    if len(orders) != 1:
        raise ValueError("'paper.rows': the rows give no single ordering of the measures (groups disagree or "
                         "no group has two measures)")
    return orders.pop()


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
    claims: tuple[Claim, ...] = ()

    @model_validator(mode="after")
    def _unique_ids(self) -> Paper:
        for kind, ids in (("row", [r.id for r in self.rows]), ("training", [t.id for t in self.training]),
                          ("claim", [c.id for c in self.claims])):
            seen = {i for i in ids if ids.count(i) > 1}
            if seen:
                raise ValueError(f"duplicate {kind} id(s): {', '.join(sorted(seen))}")
        return self

    @model_validator(mode="after")
    def _claims_read_existing_rows(self) -> Paper:
        rows = self.rows_by_id
        for claim in self.claims:
            try:
                claim_paper_values(claim, rows)
                if claim.kind == "calm_measure_order":
                    paper_measure_order(claim, rows)
            except ValueError as err:
                raise ValueError(f"claim '{claim.id}': {err}") from None
        return self

    @property
    def rows_by_id(self) -> dict[str, Row]:
        return {row.id: row for row in self.rows}


def load_paper(path: str | Path) -> Paper:
    """Read and validate one replication file."""
    path = Path(path)
    try:
        raw = yaml.load(path.read_text(), Loader=StrictLoader)  # a SafeLoader refusing repeated keys
    except OSError as err:
        raise ExitbenchError(f"{path}: cannot be read ({err.strerror})") from None
    except yaml.YAMLError as err:
        raise ExitbenchError(f"{path}: not valid YAML ({str(err).splitlines()[0]})") from None
    except ExitbenchError as err:
        raise ExitbenchError(f"{path}: {err}") from None
    if not isinstance(raw, dict):
        raise ExitbenchError(f"{path}: expected a mapping with id, title, ..., rows")
    try:
        return Paper.model_validate(raw)
    except ValidationError as err:
        raise ExitbenchError(_paper_error_line(err, raw, str(path))) from None


def _paper_error_line(err: ValidationError, raw: dict, source: str) -> str:
    """:func:`pydantic_error_line`, except that an error inside a claim names the claim by its id:
    ``<file>: claim '<id>': '<key>': <what>``."""
    first = err.errors()[0]
    loc = first["loc"]
    message = str(first.get("msg", "")).removeprefix("Value error, ")
    if not loc and message.startswith("claim '"):
        return f"{source}: {message}"
    if len(loc) < 2 or loc[0] != "claims" or not isinstance(loc[1], int):
        return pydantic_error_line(err, source)
    claims = raw.get("claims")
    entry = claims[loc[1]] if isinstance(claims, list) and loc[1] < len(claims) else None
    name = entry.get("id") if isinstance(entry, dict) else None
    where = f"claim '{name}'" if isinstance(name, str) else f"claim #{loc[1] + 1} (no valid id)"
    key = ".".join(str(part) for part in loc[2:])
    if first["type"] == "extra_forbidden":
        return f"{source}: {where}: unknown key '{key}'"
    if first["type"] == "missing":
        return f"{source}: {where}: '{key}' is missing"
    got = first.get("input")
    shown = "" if not key or isinstance(got, dict | list) else f" (got {got!r})"
    return f"{source}: {where}: " + (f"'{key}': {message}{shown}" if key else message)


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
        for kind, ids in (("row", [r.id for r in paper.rows]), ("claim", [c.id for c in paper.claims])):
            for item in ids:
                if item in seen:
                    raise ExitbenchError(f"{directory}: {kind} id '{item}' appears in both {seen[item]} and {paper.id}")
                seen[item] = paper.id
    return papers
