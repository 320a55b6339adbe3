"""GPU check: every registered decoding method on random-weight Llamas of real shapes, in one command.

What it checks, per shape (``1b``: Llama-3.2-1B-like, 16 layers, hidden 2048, 32/8 heads, vocab 128256,
tied embeddings; ``7b``: Llama-2-7B, 32 layers, hidden 4096, 32/32 heads, vocab 32000; ``tiny``: 4 layers,
hidden 64, vocab 256, for a CPU dry run):

- every method in :data:`exitbench.decoding.REGISTRY` whose options can be set generically runs on the same
  seeded random prompts (``1b``/``7b``: 3 prompts of 64-256 tokens, 32 new tokens; ``tiny``: 2 prompts of
  8-16 tokens, 8 new tokens; ``--prompts`` and ``--new-tokens`` change them), with exit layers E = L/4 and
  L/2, d = 4 drafted tokens, CALM threshold 0.1 (low, so that random models exit early; the row's note gives
  the mean exit layer);
  ``speculative`` drafts with a second random model of L/4 layers (same vocabulary). A method whose options
  have no generic value is listed with the reason it was skipped; one that raises is listed as failed;
- exactness against greedy (``autoregressive``): prompts with any token mismatch and the first divergence.
  Methods whose class says ``exact`` must show 0 in float32; in bfloat16 rounding can flip an argmax, so
  mismatches there are reported, not treated as failures;
- speed: time per token (median over prompts, prefill included, after an untimed round over every prompt;
  methods interleaved per prompt; ``DecodingMethod.generate`` synchronises CUDA), the speed-up vs greedy (ratio of
  total times per token), the acceptance rate and tokens per round;
- the cost model's step costs (:func:`exitbench.bench.measure_step_costs`) at each E: ``c_draft`` (one
  E-layer draft step) and ``c_verify`` (one forward over d + 1 positions through layers E..L-1, and through
  all L layers for peers that re-run them), both relative to one full greedy step; self-speculation rows also
  carry the speed-up the cost model predicts from their measured acceptance rate.

Random weights make acceptance rates (and so speed-ups of drafting methods) those of random models, not of
trained ones; greedy's time per token and the step costs are the numbers that carry over to real checkpoints.

Run (one GPU, under 10 minutes; ``--max-minutes`` stops starting new shapes once exceeded)::

    python scripts/gpu_check.py                                                  # 1b and 7b, cuda, bfloat16
    python scripts/gpu_check.py --shapes tiny --device cpu --dtype float32       # dry run on a CPU

Outputs: ``<out>/<shape>.json`` (default ``results/gpu``) with one row per method variant (``status`` ok,
skipped or failed, with ``reason``), the step costs and a provenance block; a markdown table per shape on
stdout. Exit code 1 when a method failed or an exact method mismatched greedy in float32; 2 on a usage error.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import itertools
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

from exitbench.bench import SHARED_VERIFY, measure_step_costs  # noqa: E402
from exitbench.cli import run_stage, set_threads  # noqa: E402
from exitbench.cost_model import predict_speedup  # noqa: E402
from exitbench.data.io import atomic_write_json  # noqa: E402
from exitbench.decoding import REGISTRY, DecodeResult, DecodingMethod, StopRule, build_method  # noqa: E402
from exitbench.errors import ExitbenchError  # noqa: E402
from exitbench.models.tiny import random_llama  # noqa: E402
from exitbench.models.view import EarlyExitModel  # noqa: E402
from exitbench.prompts import first_divergence  # noqa: E402
from exitbench.provenance import provenance  # noqa: E402

BASELINE = "autoregressive"
NUM_SPECULATIONS = 4
CALM_THRESHOLD = 0.1  # low, so that random models do exit early and CALM's cache filling runs
MIN_CONFIDENCE = 0.3  # adaptive self-speculation's draft floor (random weights: mostly single steps)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
SHORT_KEYS = {"exit_layer": "E", "num_speculations": "d"}


@dataclass(frozen=True)
class Shape:
    """A random Llama's shape and the workload decoded on it."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    num_prompts: int
    min_prompt_len: int
    max_prompt_len: int
    max_new_tokens: int

    @property
    def exit_layers(self) -> tuple[int, ...]:
        """E = L/4 and L/2 (deduplicated, at least 1)."""
        return tuple(sorted({max(1, self.num_layers // 4), max(1, self.num_layers // 2)}))

    @property
    def draft_layers(self) -> int:
        """Layers of the separate random draft model that ``speculative`` uses."""
        return max(1, self.num_layers // 4)


SHAPES = {
    "tiny": Shape("tiny", 4, 64, 4, 2, 256, 256, True, 2, 8, 16, 8),
    "1b": Shape("1b", 16, 2048, 32, 8, 8192, 128256, True, 3, 64, 256, 32),
    "7b": Shape("7b", 32, 4096, 32, 32, 11008, 32000, False, 3, 64, 256, 32),
}


@dataclass(frozen=True)
class Variant:
    """One registered method with generic options; ``reason`` set when it cannot run here."""

    method: str
    label: str
    options: tuple[tuple[str, Any], ...] = ()
    reason: str = ""


def generic_values(shape: Shape) -> dict[str, tuple[Any, ...]]:
    """The values tried for option names every method may share."""
    return {
        "exit_layer": shape.exit_layers,
        "num_speculations": (NUM_SPECULATIONS,),
        "threshold": (CALM_THRESHOLD,),
        "min_confidence": (MIN_CONFIDENCE,),
        # Draft & Verify's draft: every other layer of the upper half skipped (a quarter of the layers)
        "skip_layers": ([*range(shape.num_layers // 2, shape.num_layers, 2)],),
    }


def plan_variants(shape: Shape) -> list[Variant]:
    """Greedy first, then every other registered method at each combination of generic option values."""
    generic = generic_values(shape)
    variants = []
    for name in [BASELINE, *sorted(set(REGISTRY) - {BASELINE})]:
        fields = REGISTRY[name].Options.model_fields
        missing = [key for key, info in fields.items() if info.is_required() and key not in generic]
        if missing:
            variants.append(Variant(name, name, reason=f"option(s) {', '.join(missing)} have no generic value"))
            continue
        keys = [key for key in fields if key in generic]
        for combo in itertools.product(*(generic[key] for key in keys)):
            options = tuple(zip(keys, combo, strict=True))
            parts = [f"{SHORT_KEYS.get(key, key)}={value}" for key, value in options]
            if getattr(REGISTRY[name], "needs_draft", False):
                parts.append(f"draft_layers={shape.draft_layers}")
            variants.append(Variant(name, f"{name}[{','.join(parts)}]" if parts else name, options))
    return variants


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Temporarily make ``dtype`` torch's default, so a model is created in it (no float32 copy first)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def build_model(shape: Shape, num_layers: int, device: torch.device, dtype: torch.dtype, seed: int) -> EarlyExitModel:
    """A seeded random Llama of ``shape`` with ``num_layers`` layers, created directly on ``device``."""
    with torch.device(device), default_dtype(dtype):
        lm = random_llama(
            num_layers=num_layers,
            hidden_size=shape.hidden_size,
            vocab_size=shape.vocab_size,
            num_heads=shape.num_heads,
            num_kv_heads=shape.num_kv_heads,
            intermediate_size=shape.intermediate_size,
            seed=seed,
            dtype=dtype,
            tie_word_embeddings=shape.tie_word_embeddings,
        )
    return EarlyExitModel(lm)


def random_prompts(shape: Shape, seed: int) -> list[list[int]]:
    """``num_prompts`` seeded prompts of random lengths; ids 3.. avoid the pad, BOS and EOS ids (0, 1, 2)."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(shape.min_prompt_len, shape.max_prompt_len + 1, (shape.num_prompts,), generator=generator)
    return [torch.randint(3, shape.vocab_size, (int(n),), generator=generator).tolist() for n in lengths]


def build_methods(
    variants: Sequence[Variant], model: EarlyExitModel, draft: EarlyExitModel
) -> tuple[dict[str, DecodingMethod], dict[str, str]]:
    """The methods that can be built, by label, and the reasons for those that cannot."""
    methods, skipped = {}, {}
    for variant in variants:
        if variant.reason:
            skipped[variant.label] = variant.reason
            continue
        needs_draft = getattr(REGISTRY[variant.method], "needs_draft", False)
        try:
            methods[variant.label] = build_method(
                variant.method, model, dict(variant.options), draft_model=draft if needs_draft else None
            )
        except ExitbenchError as err:
            skipped[variant.label] = str(err)
    return methods, skipped


def one_line(err: BaseException) -> str:
    """An exception as one short line, for a result row."""
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text[:300]}"


def time_interleaved(
    methods: dict[str, DecodingMethod], prompts: Sequence[Sequence[int]], max_new_tokens: int, bar: tqdm
) -> tuple[dict[str, list[DecodeResult]], dict[str, str]]:
    """Results per label and prompt (an untimed round over every prompt first; then methods interleaved per
    prompt), and failures.

    The untimed round covers every prompt, not only the first: on a GPU the first matrix product of a new
    shape (a new prompt length) costs far more than the next, and it would fall on whichever method meets the
    prompt first (seen on an H200 in bfloat16: greedy at 51 ms/token, prompt lookup at 10 ms on the same tokens).
    A method that raises is dropped from later prompts and its error kept: on a user's GPU a failing method
    is a finding of the check, not a reason to lose the other methods' numbers.
    """
    stop = StopRule()
    failed: dict[str, str] = {}
    active = dict(methods)
    results: dict[str, list[DecodeResult]] = {label: [] for label in methods}
    for index, prompt in enumerate([*prompts, *prompts]):  # the first round: untimed, discarded
        timed = index >= len(prompts)
        for label, method in list(active.items()):
            torch.manual_seed(0)
            try:
                result = method.generate(prompt, max_new_tokens, stop)
            except Exception as err:  # a failing method is a finding (see the docstring)
                failed[label] = one_line(err)
                del active[label]
                continue
            finally:
                bar.update()
            if timed:
                results[label].append(result)
    return {label: runs for label, runs in results.items() if label in active}, failed


def measure_costs(model: EarlyExitModel, context: Sequence[int], shape: Shape, bar: tqdm) -> list[dict[str, Any]]:
    """Step costs at each exit layer, verifying from E (self-speculation) and from layer 0 (peers)."""
    rows = []
    for exit_layer in shape.exit_layers:
        shared = measure_step_costs(model, context, exit_layer, NUM_SPECULATIONS, verify_from_exit=True)
        bar.update()
        full = measure_step_costs(model, context, exit_layer, NUM_SPECULATIONS, verify_from_exit=False)
        bar.update()
        rows.append({
            "exit_layer": exit_layer,
            "num_speculations": NUM_SPECULATIONS,
            "full_step_ms": 1000.0 * shared.full_step_s,
            "c_draft": shared.c_draft,
            "c_verify": shared.c_verify,
            "c_verify_all_layers": full.c_verify * full.full_step_s / shared.full_step_s,
        })
    return rows


def total_ms_per_token(runs: Sequence[DecodeResult]) -> float:
    """Total seconds / total tokens over prompts, in milliseconds."""
    return 1000.0 * sum(r.wall_time_s for r in runs) / max(sum(r.num_tokens for r in runs), 1)


def summarize(variant: Variant, runs: list[DecodeResult], greedy: list[DecodeResult]) -> dict[str, Any]:
    """One method row: exactness against greedy, time per token, speed-up, acceptance."""
    divergences = [first_divergence(r.tokens, g.tokens) for r, g in zip(runs, greedy, strict=True)]
    drafted, rounds = sum(r.num_drafted for r in runs), sum(r.num_rounds for r in runs)
    exits = [layer for r in runs for layer in r.exit_layers]
    return {
        **variant_fields(variant),
        "status": "ok",
        "reason": "",
        "num_mismatched": sum(d is not None for d in divergences),
        "first_divergence": min((d for d in divergences if d is not None), default=None),
        "time_per_token_ms": statistics.median(r.time_per_token_ms for r in runs),
        "speedup_vs_greedy": total_ms_per_token(greedy) / total_ms_per_token(runs),
        "acceptance_rate": sum(r.num_accepted for r in runs) / drafted if drafted else None,
        "tokens_per_round": sum(r.num_tokens for r in runs) / rounds if rounds else None,
        "num_prompts": len(runs),
        "mean_new_tokens": statistics.mean(r.num_tokens for r in runs),
        "mean_exit_layer": statistics.mean(exits) if exits else None,
    }


def variant_fields(variant: Variant) -> dict[str, Any]:
    options = dict(variant.options)
    return {
        "method": variant.method,
        "label": variant.label,
        "options": options,
        "exit_layer": options.get("exit_layer"),
        "num_speculations": options.get("num_speculations"),
        "exact_claimed": REGISTRY[variant.method].exact,
    }


def add_prediction(row: dict[str, Any], costs: list[dict[str, Any]]) -> None:
    """The cost model's speed-up for a self-speculation row, from its acceptance rate and measured costs."""
    cost = next((c for c in costs if c["exit_layer"] == row["exit_layer"]), None)
    rate = row.get("acceptance_rate")
    if row["method"] not in SHARED_VERIFY or cost is None or rate is None:
        return
    predicted = predict_speedup(min(max(rate, 0.0), 1.0), row["num_speculations"], cost["c_draft"], cost["c_verify"])
    row.update(alpha=predicted["alpha"], predicted_speedup=predicted["predicted_speedup"])


def check_shape(shape: Shape, device: torch.device, dtype: torch.dtype, seed: int, bar: tqdm) -> dict[str, Any]:
    """Decode, compare and time every method on one shape; the result file's content (less provenance)."""
    bar.set_postfix_str(f"building {shape.name}")
    model = build_model(shape, shape.num_layers, device, dtype, seed)
    draft = build_model(shape, shape.draft_layers, device, dtype, seed + 1)
    prompts = random_prompts(shape, seed)
    variants = plan_variants(shape)
    methods, skipped = build_methods(variants, model, draft)
    bar.set_postfix_str(f"decoding {shape.name}")
    results, failed = time_interleaved(methods, prompts, shape.max_new_tokens, bar)
    bar.set_postfix_str(f"costs {shape.name}")
    costs = measure_costs(model, prompts[0], shape, bar)
    greedy = results.get(BASELINE)
    rows = []
    for variant in variants:
        if variant.label in results and greedy is not None:
            rows.append(summarize(variant, results[variant.label], greedy))
            add_prediction(rows[-1], costs)
            continue
        reason = skipped.get(variant.label) or failed.get(variant.label) or f"greedy ({BASELINE}) failed"
        status = "skipped" if variant.label in skipped else "failed"
        rows.append({**variant_fields(variant), "status": status, "reason": reason})
    return {
        "shape": asdict(shape) | {"exit_layers": list(shape.exit_layers), "draft_layers": shape.draft_layers},
        "num_parameters": model.num_parameters,
        "prompt_lengths": [len(p) for p in prompts],
        "seed": seed,
        "rows": rows,
        "costs": costs,
    }


def fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def markdown(result: dict[str, Any], dtype: str) -> str:
    """The shape's method rows and step costs as markdown tables."""
    shape = result["shape"]
    lines = [
        f"### {shape['name']} ({shape['num_layers']} layers, hidden {shape['hidden_size']}, {dtype}, "
        f"{len(result['prompt_lengths'])} prompts x {shape['max_new_tokens']} new tokens)",
        "",
        "| method | exact claimed | mismatched prompts | first divergence | ms/token | speed-up vs greedy "
        "| acceptance | tokens/round | note |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        note = row["reason"] if row["status"] != "ok" else ""
        if row.get("predicted_speedup") is not None:
            note = f"predicted speed-up {row['predicted_speedup']:.2f}"
        if row.get("mean_exit_layer") is not None:
            note = f"mean exit layer {row['mean_exit_layer']:.1f}"
        cells = [row["label"], "yes" if row["exact_claimed"] else "no", fmt(row.get("num_mismatched")),
                 fmt(row.get("first_divergence")), fmt(row.get("time_per_token_ms")),
                 fmt(row.get("speedup_vs_greedy")), fmt(row.get("acceptance_rate")),
                 fmt(row.get("tokens_per_round")), f"{row['status']}: {note}" if row["status"] != "ok" else note]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "| E | d | full step ms | c_draft | c_verify (E..L) | c_verify (0..L) |", "|---|---|---|---|---|---|"]
    for cost in result["costs"]:
        lines.append(
            f"| {cost['exit_layer']} | {cost['num_speculations']} | {cost['full_step_ms']:.3f} | {cost['c_draft']:.3f} "
            f"| {cost['c_verify']:.3f} | {cost['c_verify_all_layers']:.3f} |"
        )
    return "\n".join(lines)


def problems(result: dict[str, Any], dtype: str) -> list[str]:
    """What makes the check fail: a failed method, or an exact method that mismatched greedy in float32."""
    found = []
    for row in result["rows"]:
        if row["status"] == "failed":
            found.append(f"{result['shape']['name']}: {row['label']} failed ({row['reason']})")
        elif dtype == "float32" and row["exact_claimed"] and row.get("num_mismatched"):
            found.append(f"{result['shape']['name']}: {row['label']} is exact but mismatched greedy in float32")
    return found


def resolve_device(name: str) -> torch.device:
    """The torch device; a one-line error when CUDA is asked for and absent."""
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ExitbenchError("--device cuda: CUDA is not available on this machine; use --device cpu "
                             "(e.g. --shapes tiny --device cpu --dtype float32 for a dry run)")
    return device


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--shapes", default="1b,7b", help=f"comma-separated, of {', '.join(SHAPES)}")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    parser.add_argument("--out", default="results/gpu", help="directory for <shape>.json")
    parser.add_argument("--max-minutes", type=float, default=8.0, help="start no shape after the first past this")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--prompts", type=int, default=0, help="prompts per shape (0: the shape's own)")
    parser.add_argument("--new-tokens", type=int, default=0, help="new tokens per prompt (0: the shape's own)")
    return parser.parse_args(argv)


def parse_shapes(text: str) -> list[Shape]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in SHAPES]
    if unknown or not names:
        raise ExitbenchError(f"--shapes: unknown shape(s) {', '.join(unknown) or '(none)'}; known: {', '.join(SHAPES)}")
    return [SHAPES[name] for name in names]


def main(argv: Sequence[str] | None = None) -> None:
    """Run the check on each shape, write ``<out>/<shape>.json`` and print the tables."""
    args = parse_args(argv)
    shapes, device, dtype = parse_shapes(args.shapes), resolve_device(args.device), DTYPES[args.dtype]
    workload = {"num_prompts": args.prompts, "max_new_tokens": args.new_tokens}
    shapes = [replace(shape, **{key: value for key, value in workload.items() if value > 0}) for shape in shapes]
    set_threads(args.threads)
    start = time.perf_counter()
    found: list[str] = []
    total = sum(len(plan_variants(s)) * 2 * s.num_prompts + 2 * len(s.exit_layers) for s in shapes)
    with tqdm(total=total, desc="gpu_check", unit="step", file=sys.stderr) as bar:
        for index, shape in enumerate(shapes):
            minutes = (time.perf_counter() - start) / 60
            if index > 0 and minutes > args.max_minutes:
                left = ", ".join(s.name for s in shapes[index:])
                tqdm.write(f"time budget of {args.max_minutes:g} min exceeded after {minutes:.1f} min: "
                           f"not starting {left}", file=sys.stderr)
                break
            result = check_shape(shape, device, dtype, args.seed, bar)
            config_view = {"gpu_check": result["shape"], "seed": args.seed}
            result["provenance"] = provenance(config_view, device, args.dtype)
            path = atomic_write_json(Path(args.out) / f"{shape.name}.json", result)
            tqdm.write(f"{markdown(result, args.dtype)}\n\nwrote {path}\n")
            found += problems(result, args.dtype)
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
    if found:
        print("\n".join(["check failed:", *found]), file=sys.stderr)
        raise SystemExit(1)


if __name__ == "__main__":
    run_stage(main)
