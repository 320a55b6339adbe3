"""Which evaluate stages a config runs and what each one builds: a stage per registered method, the labels it
runs on each (model, task), the samples each method takes, and the config and code views DVC keys a stage on.

Pure functions of the config: ``configure`` plans the DVC graph with them without loading a model.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from exitbench.config import Config, TaskEvalConfig, stage_view
from exitbench.decoding import base_method, method_class
from exitbench.decoding.base import DecodingMethod
from exitbench.identity import method_code_identity

FRAMEWORK_GREEDY = "hf_greedy"  # the baseline of methods that run inside transformers (framework "transformers")


BASELINE = "autoregressive"


def needs_prepared_draft(label: str, options: dict[str, Any] | None) -> bool:
    """Whether method ``label`` drafts with the prepared ``models/draft`` (``speculative`` without
    ``draft_layers``; with it, the method copies the evaluated model's own first layers)."""
    return base_method(label) == "speculative" and not (options or {}).get("draft_layers")


#: methods whose batched form decodes each row exactly as the batch-1 method does (same layers, same head): evaluate
#: decodes their quality sample past the timing sample in batches (exitbench.quality_batches), and plan.py plans it
BATCHABLE = ("autoregressive", "early_exit")


def sample_limits(methods: Mapping[str, DecodingMethod], num_samples: int, timing_samples: int) -> dict[str, int]:
    """How many samples (a prefix of the quality sample) each method runs on: greedy and every inexact
    method the whole quality sample; an exact method, whose outputs equal greedy's by construction, only
    the first ``timing_samples`` (0 = all), enough to time it and to check that exactness."""
    timing = min(timing_samples or num_samples, num_samples)
    return {name: timing if method.exact and name != BASELINE else num_samples for name, method in methods.items()}


def runs_on(cfg: Config, method: str, model: str, task: str) -> bool:
    """Whether ``method`` runs on (``model``, ``task``): every model and task unless ``evaluate.method_models`` /
    ``evaluate.method_tasks`` name its own."""
    ev = cfg.evaluate
    return model in ev.method_models.get(method, [model]) and task in ev.method_tasks.get(method, [task])


def timing_sample_size(task_cfg: TaskEvalConfig) -> int:
    """How many samples exact methods run on: ``timing_samples`` capped at ``num_samples`` (0 = all), so a
    profile that shrinks the quality sample (smoke) needs no second override."""
    return min(task_cfg.timing_samples or task_cfg.num_samples, task_cfg.num_samples)


def reference_sample_size(task_cfg: TaskEvalConfig) -> int:
    """How many samples of the timing sample re-time greedy beside a method (its speed-ups pair over them):
    ``reference_samples`` capped at the timing sample (0 = all of it); none where the task is not ``timed``."""
    if not task_cfg.timed:
        return 0
    timing = timing_sample_size(task_cfg)
    return min(task_cfg.reference_samples or timing, timing)


def capped_limits(limits: Mapping[str, int], method_samples: Mapping[str, int]) -> dict[str, int]:
    """``limits`` with each label named in ``evaluate.method_samples`` held to at most its own count."""
    return {label: min(limit, method_samples.get(label, limit)) for label, limit in limits.items()}


def method_stages(cfg: Config) -> list[str]:
    """The evaluation stages ``cfg`` runs, one per registered method its ``evaluate.methods`` labels name
    (``early_exit@8`` and ``early_exit@15`` are both stage ``early_exit``), greedy's first: the reference."""
    stages = [BASELINE]
    for label in cfg.evaluate.methods:
        if base_method(label) not in stages:
            stages.append(base_method(label))
    return stages


def stage_labels(cfg: Config, stage: str, model: str, task: str) -> list[str]:
    """The labels stage ``stage`` runs on (``model``, ``task``); the reference stage's begin with greedy."""
    labels = [
        label
        for label in cfg.evaluate.methods
        if base_method(label) == stage and label != BASELINE and runs_on(cfg, label, model, task)
    ]
    return [BASELINE, *labels] if stage == BASELINE else labels


def framework_greedy_label(cfg: Config, model: str, task: str) -> str | None:
    """The ``hf_greedy`` label that runs on (``model``, ``task``), the transformers peers' own reference."""
    return next(
        (
            label
            for label in cfg.evaluate.methods
            if base_method(label) == FRAMEWORK_GREEDY and runs_on(cfg, label, model, task)
        ),
        None,
    )


def stage_methods_used(cfg: Config, stage: str) -> list[str]:
    """The labels stage ``stage`` builds: its own, greedy (the reference) and, for transformers peers, hf_greedy."""
    own = [label for label in cfg.evaluate.methods if base_method(label) == stage]
    used = [BASELINE, *own]
    if any(method_class(label).framework != "exitbench" for label in own):
        used += [label for label in cfg.evaluate.methods if base_method(label) == FRAMEWORK_GREEDY]
    return list(dict.fromkeys(used))


def stage_config_view(cfg: Config, stage: str) -> dict[str, Any]:
    """Stage ``evaluate@<stage>``'s resolved config: the evaluate view with ``methods``, ``method_models``,
    ``method_tasks`` and ``method_samples`` narrowed to the labels it builds, so another method's settings never
    re-run it."""
    view = stage_view(cfg, "evaluate")
    used = set(stage_methods_used(cfg, stage))
    section = view["evaluate"]
    for key in ("methods", "method_models", "method_tasks", "method_samples"):
        section[key] = {label: value for label, value in section[key].items() if label in used}
    return view


def stage_code_view(cfg: Config, stage: str) -> dict[str, Any]:
    """The code identity of every method stage ``stage`` builds (its module and what it imports of exitbench,
    :func:`~exitbench.identity.method_code_identity`): its DVC dependency on exactly that code."""
    used = stage_methods_used(cfg, stage) if stage in method_stages(cfg) else [stage]
    return {base_method(label): method_code_identity(method_class(label)) for label in used}
