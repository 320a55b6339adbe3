"""The calibrate stage: CALM's risk-controlled threshold per (model, task, measure, kv_strategy) (CALM §4).

For each candidate threshold ``lambda_j`` (high to low) the calibration prompts are decoded with
``calm`` and with greedy decoding of the full model; the per-example risk is the inconsistency of the two
outputs (CALM §4 "textual consistency"): ``1 - ROUGE-L F`` of the early-exit text against the full model's
text (``risk: textual``), or the fraction of mismatched token positions (any other ``risk`` value). Then
:func:`exitbench.calibration.calibrate_threshold` (Learn-then-Test) picks, for every ``delta``, the
lowest threshold certified to keep the risk at most ``delta`` with probability ``1 - epsilon``.

The chosen threshold is then checked on disjoint test prompts: empirical risk (``risk_ok`` when at most
``delta``), mean exit layer of the tokens whose exit the rule decided (every token after the first; the
first comes from the full-model prefill), speed-up over greedy, and the task's quality metric for both.

Shared prefill and fair timing: every generation of a prompt (greedy and every calm setting) starts from
the same full-model prefill, made once per (model, prompt) and continued from a private copy of its KV
cache (:meth:`~exitbench.decoding.calm.Calm.generate_from_prefill`, token-identical to a generation with its
own prefill). Speed-up is therefore measured on the decode phase only: greedy's wall time per decoded
token (every token after the prefill's first) over calm's, both continuing the same prefills, side by side
in one process (:data:`SPEEDUP_MEASURES`, written to the output JSON). The prefill's own time is reported
apart (``prefill_time_ms``).

Every generation is made once: greedy once per example, ``calm`` once per (example, measure, kv_strategy,
threshold), and reused by every ``delta`` and for the test split where thresholds coincide. Each finished
generation is appended to ``<store>/<model>/generations.jsonl`` under a hash of what determines it
(:class:`GenerationStore`), so a rerun after a kill reuses them, timings included, and makes only the rest.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from exitbench.calibration import (
    CalibrationResult,
    calibrate_threshold,
    hoeffding_bentkus_pvalue,
    min_calibration_size,
)
from exitbench.confidence import save_exit_classifier, train_exit_classifier
from exitbench.config import CalibrateConfig, Config, check_exit_layers, stage_view
from exitbench.data.io import atomic_write_json, read_jsonl, sha256_file, write_jsonl_atomic
from exitbench.decoding import StopRule, build_method
from exitbench.decoding.autoregressive import Autoregressive
from exitbench.decoding.calm import Calm, candidate_layers
from exitbench.decoding.steps import Prefill, prefill_prompt
from exitbench.errors import ExitbenchError
from exitbench.identity import decoding_code_identity, model_identity
from exitbench.models.load import load_early_exit_model, load_tokenizer
from exitbench.models.view import EarlyExitModel
from exitbench.provenance import provenance
from exitbench.tasks.base import require_isolation
from exitbench.tasks.metrics import rouge_scores
from exitbench.tasks.registry import Sample, Task, TaskSettings, build_task

# Where calibration prompts come from: a split of their own, else the rows of the task's test split that
# the seeded draw ranks right after the test sample (see calibration_samples).
CALIBRATION_SPLIT: dict[str, str] = {"topv2": "eval"}
CLASSIFIER_SEQUENCES = 64
CLASSIFIER_STEPS = 200
CLASSIFIER_LR = 1e-2
STORE_VERSION = 1  # bump when a change to decoding or to Generation makes stored generations stale
SPEEDUP_MEASURES = (
    "decode phase only: greedy's wall time per decoded token over calm's (tokens after the first, which both "
    "take from one shared full-model prefill per prompt), measured side by side in one process; prefill excluded"
)


# ----------------------------------------------------------------------------------------------- risks


def textual_risk(prediction: str, reference: str) -> float:
    """CALM §4 textual consistency loss: ``1 - ROUGE-L F(prediction, reference)``; 0 for identical texts."""
    if prediction == reference:
        return 0.0
    return 1.0 - rouge_scores(prediction, reference)["rougeL"]


def token_mismatch_risk(prediction: Sequence[int], reference: Sequence[int]) -> float:
    """Fraction of positions ``0..max(len)-1`` where the two token sequences differ (a length gap counts)."""
    longest = max(len(prediction), len(reference))
    if longest == 0:
        return 0.0
    same = sum(a == b for a, b in zip(prediction, reference, strict=False))
    return 1.0 - same / longest


def risk_definition(risk: str) -> str:
    if risk == "textual":
        return "1 - ROUGE-L F(early-exit text, full-model text)"
    return "fraction of token positions where early-exit and full-model outputs differ"


# ------------------------------------------------------------------------------------------- the inputs


@dataclass(frozen=True)
class CalibrationTask:
    """One task's encoded prompts: calibration and test (disjoint), how to read outputs, how to score them.

    ``decode`` turns generated ids into the task's final text (stop strings cut); ``score(i, text)`` is
    the quality of ``text`` on test example ``i`` (None: no quality is reported).
    """

    name: str
    calibration: list[list[int]]
    test: list[list[int]]
    decode: Callable[[Sequence[int]], str]
    stop: StopRule | None = None
    score: Callable[[int, str], float] | None = None
    quality_metric: str = ""

    def prompt(self, split: str, index: int) -> list[int]:
        """Prompt ``index`` of ``split`` ("calibration" or "test")."""
        return (self.calibration if split == "calibration" else self.test)[index]

    def check(self) -> None:
        for split, prompts in (("calibration", self.calibration), ("test", self.test)):
            if not prompts:
                raise ExitbenchError(f"calibrate: task '{self.name}' has no {split} prompts")
            for index, ids in enumerate(prompts):
                if not ids or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
                    raise ExitbenchError(
                        f"calibrate: task '{self.name}' {split} prompt {index} is not a non-empty list of token ids"
                    )


def check_thresholds(thresholds: Sequence[float]) -> None:
    """Candidate thresholds must lie in [0, 1] and strictly decrease (LTT's fixed sequence, CALM §4)."""
    if not thresholds or any(not 0.0 <= t <= 1.0 for t in thresholds):
        raise ExitbenchError(f"calibrate.thresholds must be non-empty and within [0, 1], got {list(thresholds)}")
    if any(b >= a for a, b in itertools.pairwise(thresholds)):
        raise ExitbenchError(f"calibrate.thresholds must strictly decrease (most conservative first), got {thresholds}")


def calibration_samples(
    task: Task, rows_by_split: dict[str, list[dict[str, Any]]], num_calibration: int, num_test: int
) -> tuple[list[Sample], list[Sample]]:
    """Calibration and test samples, built by the task's own prompt function (the one evaluate uses).

    Test = the task's seeded draw of ``num_test`` rows of its split (:meth:`Task.samples`: the first
    ``num_test`` of evaluate's sample, same ids and prompts). Calibration = the same sampler's draw of
    ``num_calibration`` rows of :data:`CALIBRATION_SPLIT` when the task has one, else the next
    ``num_calibration`` rows of the test split's draw order (the draw is prefix-stable, so these follow the
    test rows and never include one): calibration and test never share a row.
    """
    task.set_context({split: rows_by_split.get(split, []) for split in task.context_splits})
    rows = rows_by_split.get(task.split, [])
    lower = "calibrate.num_test/num_calibration"
    if task.name in CALIBRATION_SPLIT:
        own = rows_by_split.get(CALIBRATION_SPLIT[task.name], [])
        calibration = task.samples(own, num_calibration, lower)
        return calibration, task.samples(rows, num_test, lower)
    needed = num_test + num_calibration
    if len(rows) < needed:
        raise ExitbenchError(
            f"calibrate: {task.name} needs {needed} rows of {task.split} ({num_test} test + {num_calibration} "
            f"calibration), data has {len(rows)}; lower {lower}"
        )
    samples = task.samples(rows, needed, lower)
    return samples[num_test:], samples[:num_test]


# --------------------------------------------------------------------------------------- generations

MethodKey = tuple[str, str, float] | None  # calm's (measure, kv_strategy, threshold); None: greedy


@dataclass(frozen=True)
class Generation:
    """One output. ``decode_time_s``: wall time of the decode phase (every token after the shared prefill's
    first); ``prefill_time_s``: the shared prefill's wall time (the same for every generation of a prompt)."""

    tokens: list[int]
    text: str
    decode_time_s: float
    exit_layers: list[int] = field(default_factory=list)
    prefill_time_s: float = 0.0

    @property
    def num_decoded(self) -> int:
        """Tokens made by the decode phase (all but the prefill's first)."""
        return max(len(self.tokens) - 1, 0)


def _sha256_json(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


class GenerationStore:
    """Finished generations, one JSON line each under a hash of everything that determines them; resumable.

    Each line is appended, flushed and fsynced as soon as its generation is made (like evaluate's record
    files), so a killed run loses at most the generation in flight; a torn last line is dropped on reopening.
    ``context`` (model identity, dtype, device, seed, threads) enters every hash; lines of other contexts
    stay in the file unused. ``path`` None keeps the generations in memory only.
    """

    def __init__(self, path: Path | None = None, context: dict[str, Any] | None = None) -> None:
        self.path = path
        self.context = {"version": STORE_VERSION, **(context or {})}
        self.records: dict[str, Generation] = {}
        self.stored: set[str] = set()
        self.reused: set[str] = set()
        self.made = 0
        if path is not None:
            self._load(path)

    def _load(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            return
        text = path.read_text()
        lines = []
        for line in text.splitlines():
            try:
                record = json.loads(line)
                generation = Generation(**record["generation"])
            except (json.JSONDecodeError, KeyError, TypeError):
                continue  # a torn line (killed mid-write)
            self.records[record["key"]] = generation
            lines.append(record)
        self.stored = set(self.records)
        if text and not text.endswith("\n"):  # the next append must start on a line of its own
            write_jsonl_atomic(path, lines)

    def key(self, fields: dict[str, Any]) -> str:
        """The hash of ``fields`` (task, split, row, prompt, method, budget) and the store's context."""
        return _sha256_json({**self.context, **fields})[:32]

    def get(self, key: str) -> Generation | None:
        found = self.records.get(key)
        if found is not None and key in self.stored:
            self.reused.add(key)
        return found

    def put(self, key: str, fields: dict[str, Any], generation: Generation) -> None:
        if self.path is not None:
            line = json.dumps({"key": key, "fields": fields, "generation": asdict(generation)})
            with self.path.open("a") as handle:
                handle.write(line + "\n")
                handle.flush()
                os.fsync(handle.fileno())
        self.records[key] = generation
        self.made += 1


class Generations:
    """Every generation of one model, made at most once (and, with a file store, once across runs).

    All generations of one prompt continue one shared full-model prefill (made only when one of them is
    missing), each from its own copy of the prefill's cache; their timings cover the decode phase only.
    """

    def __init__(
        self, model: EarlyExitModel, settings: CalibrateConfig, classifier_file: str = "",
        store: GenerationStore | None = None,
    ) -> None:
        self.model = model
        self.settings = settings
        self.classifier_file = classifier_file
        self.classifier_sha256 = sha256_file(classifier_file) if classifier_file else ""
        self.store = store if store is not None else GenerationStore()
        self.methods: dict[MethodKey, Autoregressive | Calm] = {}
        self.warmed: set[str] = set()

    def method(self, key: MethodKey) -> Autoregressive | Calm:
        if key not in self.methods:
            if key is None:
                method = build_method("autoregressive", self.model)
            else:
                measure, kv_strategy, threshold = key
                options = {
                    "threshold": threshold, "measure": measure, "kv_strategy": kv_strategy,
                    "tau": self.settings.tau, "min_exit_layer": self.settings.min_exit_layer,
                    "exit_every": self.settings.exit_every, "classifier_file": self.classifier_file,
                }
                method = build_method("calm", self.model, options)
            assert isinstance(method, Autoregressive | Calm)
            self.methods[key] = method
        return self.methods[key]

    def fields(self, task: CalibrationTask, split: str, index: int, key: MethodKey) -> dict[str, Any]:
        """Everything (besides the store's context) that determines one generation."""
        method: dict[str, Any] = {"name": "greedy"}
        if key is not None:
            measure, kv_strategy, threshold = key
            method = {
                "name": "calm", "measure": measure, "kv_strategy": kv_strategy, "threshold": threshold,
                "tau": self.settings.tau, "min_exit_layer": self.settings.min_exit_layer,
                "exit_every": self.settings.exit_every,
            }
            if measure == "classifier":
                method["classifier_sha256"] = self.classifier_sha256
        return {
            "task": task.name, "split": split, "index": index, "prompt_sha256": _sha256_json(task.prompt(split, index)),
            "max_new_tokens": self.settings.max_new_tokens, "method": method,
        }

    def get(self, task: CalibrationTask, split: str, index: int, key: MethodKey) -> Generation:
        """The generation of prompt ``index`` of ``task``'s ``split`` by greedy (``key`` None) or calm."""
        found = self.store.get(self.store.key(self.fields(task, split, index, key)))
        if found is None:
            self.make_side_by_side(task, split, index, [] if key is None else [key])
            found = self.store.get(self.store.key(self.fields(task, split, index, key)))
        assert found is not None
        return found

    def make_side_by_side(self, task: CalibrationTask, split: str, index: int, keys: Sequence[MethodKey]) -> None:
        """Greedy and every calm setting on one prompt, back to back from one shared prefill, so all are timed
        under the same load; only those not yet stored are made.

        Greedy goes first on even examples and last on odd ones, so neither side always runs first.
        """
        order: list[MethodKey] = [None, *keys] if index % 2 == 0 else [*keys, None]
        todo = [(key, self.fields(task, split, index, key)) for key in order]
        todo = [(key, fields) for key, fields in todo if self.store.get(self.store.key(fields)) is None]
        if not todo:
            return
        prefilled = prefill_prompt(self.model, task.prompt(split, index), self.settings.max_new_tokens)
        if task.name not in self.warmed:
            self.warm_up(task, prefilled)
        for key, fields in todo:
            result = self.method(key).generate_from_prefill(prefilled, self.settings.max_new_tokens, task.stop)
            generation = Generation(
                result.tokens, task.decode(result.tokens), result.wall_time_s, result.exit_layers, prefilled.time_s
            )
            self.store.put(self.store.key(fields), fields, generation)

    def warm_up(self, task: CalibrationTask, prefilled: Prefill) -> None:
        """Untimed short runs, so the first timed generation does not pay one-off start-up costs."""
        for key in [None, *((m, k, 0.5) for m in self.settings.measures for k in self.settings.kv_strategies)]:
            self.method(key).generate_from_prefill(prefilled, min(4, self.settings.max_new_tokens), task.stop)
        self.warmed.add(task.name)


def time_per_token_ms(generations: Sequence[Generation]) -> float | None:
    """Decode-phase wall time per decoded token (prefill excluded); None when no token was decoded."""
    tokens = sum(g.num_decoded for g in generations)
    return 1000.0 * sum(g.decode_time_s for g in generations) / tokens if tokens else None


def speedup(greedy: Sequence[Generation], calm: Sequence[Generation]) -> float | None:
    """Greedy's decode time per token over calm's, same prompts, both continuing the same shared prefills."""
    base, method = time_per_token_ms(greedy), time_per_token_ms(calm)
    return base / method if base and method else None


def avg_exit_layer(generations: Sequence[Generation]) -> float | None:
    """Mean exit layer of the tokens whose exit the rule decided (all but each output's first token)."""
    layers = [layer for g in generations for layer in g.exit_layers[1:]]
    return sum(layers) / len(layers) if layers else None


def mean_prefill_ms(generations: Sequence[Generation]) -> float:
    return 1000.0 * sum(g.prefill_time_s for g in generations) / max(len(generations), 1)


# ------------------------------------------------------------------------------------------ the stage


def _risk(settings: CalibrateConfig, calm: Generation, greedy: Generation) -> float:
    if settings.risk == "textual":
        return textual_risk(calm.text, greedy.text)
    return token_mismatch_risk(calm.tokens, greedy.tokens)


def _quality(task: CalibrationTask, generations: Sequence[Generation]) -> float | None:
    if task.score is None:
        return None
    return sum(task.score(i, g.text) for i, g in enumerate(generations)) / len(generations)


Setting = tuple[str, str]  # (measure, kv_strategy)


def fit_setting(
    gens: Generations, task: CalibrationTask, settings: CalibrateConfig, setting: Setting
) -> tuple[dict[str, Any], dict[float, CalibrationResult]]:
    """One (task, measure, kv_strategy) on the calibration split: its curve, and the LTT fit per delta."""
    measure, kv_strategy = setting
    thresholds = list(settings.thresholds)
    cal = range(len(task.calibration))
    greedy_cal = [gens.get(task, "calibration", i, None) for i in cal]
    calm_cal = [[gens.get(task, "calibration", i, (measure, kv_strategy, t)) for i in cal] for t in thresholds]
    risks = [[_risk(settings, c, g) for c, g in zip(row, greedy_cal, strict=True)] for row in calm_cal]
    fits = {delta: calibrate_threshold(thresholds, risks, delta, settings.epsilon) for delta in settings.deltas}
    curve = {
        "task": task.name, "measure": measure, "kv_strategy": kv_strategy, "thresholds": thresholds,
        "calibration_mean_risk": [sum(r) / len(r) for r in risks],
        "pvalues": {str(delta): list(fit.pvalues) for delta, fit in fits.items()},
        "avg_exit_layer": [avg_exit_layer(row) for row in calm_cal],
        "speedup_vs_greedy": [speedup(greedy_cal, row) for row in calm_cal],
        "time_per_token_ms": [time_per_token_ms(row) for row in calm_cal],
        "greedy_time_per_token_ms": time_per_token_ms(greedy_cal),
    }
    return curve, fits


def check_on_test(
    gens: Generations, task: CalibrationTask, settings: CalibrateConfig, setting: Setting,
    fits: dict[float, CalibrationResult],
) -> list[dict[str, Any]]:
    """The chosen threshold of every delta, checked on the test split (one result per delta)."""
    measure, kv_strategy = setting
    test = range(len(task.test))
    greedy_test = [gens.get(task, "test", i, None) for i in test]
    results = []
    for delta, fit in fits.items():
        calm_test = [gens.get(task, "test", i, (measure, kv_strategy, fit.threshold)) for i in test]
        test_risk = sum(_risk(settings, c, g) for c, g in zip(calm_test, greedy_test, strict=True)) / len(test)
        certified = fit.index >= 0
        results.append({
            "task": task.name, "measure": measure, "kv_strategy": kv_strategy, "delta": delta,
            "epsilon": settings.epsilon, "threshold": fit.threshold, "threshold_index": fit.index,
            "certified": certified,
            "pvalue": fit.pvalues[fit.index] if certified else None,
            # The p-value a zero-risk threshold would get: above epsilon, n is too small to certify anything.
            "best_possible_pvalue": hoeffding_bentkus_pvalue(0.0, fit.n, delta),
            "min_num_calibration": min_calibration_size(delta, settings.epsilon),
            "calibration_mean_risk": fit.mean_risks[fit.index] if certified else 0.0,
            "test_risk": test_risk,
            "risk_ok": test_risk <= delta,
            "avg_exit_layer": avg_exit_layer(calm_test),
            "speedup_vs_greedy": speedup(greedy_test, calm_test),
            "time_per_token_ms": time_per_token_ms(calm_test),
            "greedy_time_per_token_ms": time_per_token_ms(greedy_test),
            "quality": {
                "metric": task.quality_metric or None,
                "calm": _quality(task, calm_test), "greedy": _quality(task, greedy_test),
            },
            "num_calibration": len(task.calibration), "num_test": len(task.test),
        })
    return results


def calibrate_model(
    model: EarlyExitModel,
    tasks: Sequence[CalibrationTask],
    settings: CalibrateConfig,
    classifier_file: str = "",
    progress: bool = False,
    store: GenerationStore | None = None,
) -> dict[str, Any]:
    """The stage for one model: ``num_layers``, ``risk``, ``risk_definition``, ``speedup_measures``, ``results``,
    ``curves``, ``greedy_time_per_token_ms``, ``prefill_time_ms`` and ``generations`` (made / reused counts).

    ``results`` has one entry per (task, measure, kv_strategy, delta); ``curves`` one per (task, measure,
    kv_strategy) with the calibration-split mean risk, p-values (per delta), mean exit layer and speed-up
    at every threshold; ``greedy_time_per_token_ms`` the baseline's decode time per token per task and split,
    ``prefill_time_ms`` the mean shared prefill per task and split. ``store`` keeps generations across runs.
    """
    check_thresholds(settings.thresholds)
    check_exit_layers("calibrate.min_exit_layer", [settings.min_exit_layer], model.num_layers)
    if not tasks:
        raise ExitbenchError("calibrate: no tasks given")
    if "classifier" in settings.measures and not classifier_file:
        raise ExitbenchError("calibrate: measure 'classifier' needs a trained classifier file")
    for task in tasks:
        task.check()
    gens = Generations(model, settings, classifier_file, store)
    curves: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    greedy: dict[str, dict[str, float | None]] = {}
    prefill_ms: dict[str, dict[str, float]] = {}
    settings_list = [(m, k) for m in settings.measures for k in settings.kv_strategies]
    keys = [(m, k, t) for m, k in settings_list for t in settings.thresholds]
    for task in tasks:
        # Side by side: each example runs greedy and every calm setting back to back, before the next one.
        examples = range(len(task.calibration))
        for i in tqdm(examples, desc=f"calibrate {task.name}", unit="example", leave=False, disable=not progress):
            gens.make_side_by_side(task, "calibration", i, keys)
        fitted = {setting: fit_setting(gens, task, settings, setting) for setting in settings_list}
        chosen = sorted({(*setting, fit.threshold) for setting, (_, fits) in fitted.items() for fit in fits.values()})
        for i in range(len(task.test)):
            gens.make_side_by_side(task, "test", i, chosen)
        for setting, (curve, fits) in fitted.items():
            curves.append(curve)
            results.extend(check_on_test(gens, task, settings, setting, fits))
        baseline = {split: [gens.get(task, split, i, None) for i in range(len(prompts))]
                    for split, prompts in (("calibration", task.calibration), ("test", task.test))}
        greedy[task.name] = {split: time_per_token_ms(runs) for split, runs in baseline.items()}
        prefill_ms[task.name] = {split: mean_prefill_ms(runs) for split, runs in baseline.items()}
    return {
        "num_layers": model.num_layers,
        "risk": settings.risk,
        "risk_definition": risk_definition(settings.risk),
        "speedup_measures": SPEEDUP_MEASURES,
        "results": results,
        "curves": curves,
        "greedy_time_per_token_ms": greedy,
        "prefill_time_ms": prefill_ms,
        "generations": {"made": gens.store.made, "reused": len(gens.store.reused)},
    }


# ------------------------------------------------------------------------------ files, models, classifier


def model_dir_or_error(models_dir: Path, name: str) -> Path:
    path = models_dir / name
    if not (path / "config.json").exists():
        stage = "prepare_model" if name == "base" else "train"
        raise ExitbenchError(
            f"calibrate: model '{name}' not found at {path}; it is made by `dvc repro {stage}` "
            "(or remove it from calibrate.models)"
        )
    return path


def read_task_rows(task: Task, data_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """The rows of every split the task's calibration and test prompts draw on."""
    splits = {task.split, *task.context_splits}
    if task.name in CALIBRATION_SPLIT:
        splits.add(CALIBRATION_SPLIT[task.name])
    rows = {}
    for split in sorted(splits):
        path = data_dir / task.name / f"{split}.jsonl"
        if not path.exists():
            raise ExitbenchError(f"calibrate: {path} not found; run `dvc repro prepare_data` (is '{task.name}' "
                                 "in data.tasks?)")
        rows[split] = list(read_jsonl(path))
    return rows


def encoded_task(task: Task, rows: dict[str, list[dict[str, Any]]], tokenizer: Any, settings: CalibrateConfig
                 ) -> CalibrationTask:
    """A :class:`CalibrationTask` from a real task: its prompts, stop rule, decoding and primary metric."""
    from exitbench.prompts import encode_prompt, stop_rule

    calibration, test = calibration_samples(task, rows, settings.num_calibration, settings.num_test)

    def decode(ids: Sequence[int]) -> str:
        return task.postprocess(tokenizer.decode(list(ids), skip_special_tokens=True))

    def score(index: int, text: str) -> float:
        return float(task.score(test[index], text).get(task.primary_metric, math.nan))

    return CalibrationTask(
        name=task.name,
        calibration=[encode_prompt(tokenizer, s.prompt, False) for s in calibration],
        test=[encode_prompt(tokenizer, s.prompt, False) for s in test],
        decode=decode, stop=stop_rule(tokenizer, task), score=score, quality_metric=task.primary_metric,
    )


def own_greedy_sequences(
    model: EarlyExitModel, prompts: Sequence[Sequence[int]], max_new_tokens: int, stop: StopRule | None = None
) -> list[list[int]]:
    """Each prompt followed by the model's own greedy output: CALM §3.5 trains its exit classifier on the
    frozen model's generations (oracle label ``1[argmax at layer i == argmax at the last layer]``), so the
    states it learns from are those decoding visits, not those of gold text."""
    method = build_method("autoregressive", model)
    return [[*prompt, *method.generate(prompt, max_new_tokens, stop).tokens] for prompt in prompts]


def train_stage_classifier(
    model: EarlyExitModel, tokenizer: Any, data_dir: Path, settings: CalibrateConfig, seed: int, path: Path
) -> Path:
    """CALM's early-exit classifier for this model, trained on its own greedy outputs for TOPv2 train prompts
    (never calibration/test rows)."""
    from exitbench.training.corpora import topv2_examples

    examples, _ = topv2_examples(data_dir, tokenizer, seq_len=64, limit=CLASSIFIER_SEQUENCES, seed=seed)
    eos = getattr(tokenizer, "eos_token_id", None)
    stop = StopRule(eos_token_ids=frozenset({eos})) if isinstance(eos, int) else None
    prompts = [list(e.tokens[: e.prompt_len]) for e in examples]
    sequences = own_greedy_sequences(model, prompts, settings.max_new_tokens, stop)
    layers = sorted(candidate_layers(model.num_layers, settings.min_exit_layer, settings.exit_every)
                    - {model.num_layers}) or list(range(1, model.num_layers))
    state = train_exit_classifier(model, sequences, layers, CLASSIFIER_STEPS, CLASSIFIER_LR, seed)
    return save_exit_classifier(state, path)


def generation_store(store_dir: Path, name: str, model_dir: Path, cfg: Config, device: str) -> GenerationStore:
    """``<store_dir>/<name>/generations.jsonl``, keyed by the model's identity, dtype, device, seed and threads."""
    context = {
        "model": model_identity(model_dir), "code": decoding_code_identity(), "dtype": cfg.base.dtype, "device": device,
        "seed": cfg.base.seed, "threads": torch.get_num_threads(),
    }
    return GenerationStore(store_dir / name / "generations.jsonl", context)


def remove_stale_reports(out_dir: Path, models: Sequence[str]) -> list[Path]:
    """Delete ``<out>/<name>.json`` of models no longer calibrated (the folder persists between runs, and the
    report reads every file in it); their generations stay, for when they come back. Returns the deleted."""
    stale = [path for path in sorted(out_dir.glob("*.json")) if path.stem not in models]
    for path in stale:
        path.unlink()
    return stale


def run_calibrate_stage(
    cfg: Config, models_dir: Path, data_dir: Path, out_dir: Path, classifiers_dir: Path, store_dir: Path
) -> list[dict[str, Any]]:
    """The whole stage: every model in ``calibrate.models`` -> ``<out>/<model>.json``; returns its results.

    Finished generations go to ``<store_dir>/<model>/generations.jsonl`` as they are made (a working store
    outside the results, like training checkpoints); a rerun reuses them.
    """
    settings = cfg.calibrate
    check_thresholds(settings.thresholds)
    model_dirs = {name: model_dir_or_error(models_dir, name) for name in settings.models}  # fail before any work
    tasks = [build_task(name, TaskSettings(cfg.base.seed)) for name in settings.tasks]
    require_isolation(settings.tasks)
    rows = {task.name: read_task_rows(task, data_dir) for task in tasks}
    remove_stale_reports(out_dir, settings.models)
    out_dir.mkdir(parents=True, exist_ok=True)  # the stage's outputs, even when no model is calibrated
    store_dir.mkdir(parents=True, exist_ok=True)
    summary = []
    for name, model_dir in model_dirs.items():
        model = load_early_exit_model(model_dir, cfg.base.dtype, cfg.base.device)
        # checked here as well as in calibrate_model: training the classifier comes first
        check_exit_layers("calibrate.min_exit_layer", [settings.min_exit_layer], model.num_layers)
        tokenizer = load_tokenizer(model_dir)
        classifier = ""
        if "classifier" in settings.measures:
            path = classifiers_dir / f"{name}.pt"
            classifier = str(train_stage_classifier(model, tokenizer, data_dir, settings, cfg.base.seed, path))
        encoded = [encoded_task(task, rows[task.name], tokenizer, settings) for task in tasks]
        store = generation_store(store_dir, name, model_dir, cfg, str(model.device))
        report = calibrate_model(model, encoded, settings, classifier, progress=True, store=store)
        report = {
            "model": name, **report, "settings": settings.model_dump(mode="json"),
            "classifier_file": classifier or None,
            "provenance": {
                **provenance(stage_view(cfg, "calibrate"), model.device, cfg.base.dtype),
                "num_parameters": model.num_parameters,
                "projection": model.projection,
            },
        }
        atomic_write_json(out_dir / f"{name}.json", report)
        summary.extend({"model": name, **row} for row in report["results"])
        del model
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return summary


def summary_line(row: dict[str, Any]) -> str:
    """One printable line per result row (for the CLI)."""
    exit_layer = row["avg_exit_layer"]
    shown = f"{exit_layer:.1f}" if exit_layer is not None else "-"
    speed = f"{row['speedup_vs_greedy']:.2f}x" if row["speedup_vs_greedy"] is not None else "-"
    return (
        f"{row['model']:>10} {row['task']:>9} {row['measure']:>10} {row['kv_strategy']:>9} delta={row['delta']}: "
        f"lambda={row['threshold']:.2f} test risk={row['test_risk']:.3f} ({'ok' if row['risk_ok'] else 'OVER'}) "
        f"exit layer={shown} speed-up={speed}"
    )
