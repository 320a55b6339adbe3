"""Stage `probe_layers`: per-layer readability of one prepared model through the shared exit head.

    python pipelines/probe_layers.py --config build/config/probe_layers.json --model-dir models/base \
        --name base --data data --out results/probe/base.json
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from exitbench.cli import run_stage, set_threads
from exitbench.config import load_stage, stage_view
from exitbench.data.io import atomic_write_json
from exitbench.models.load import load_early_exit_model, load_tokenizer
from exitbench.models.sources import absent_role
from exitbench.probe import PROBE_TEXTS, load_topv2_pairs, probe_prompt_target, probe_texts
from exitbench.provenance import provenance

SHOWN_LAYERS = (4, 8, 12, 15, 20, 25)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="build/config/probe_layers.json", help="resolved stage config")
    parser.add_argument("--model-dir", required=True, help="a prepared model directory")
    parser.add_argument("--name", required=True, help="the model's name in the results")
    parser.add_argument("--data", default="", help="prepared data root; adds TOPv2 eval rows")
    parser.add_argument("--out", required=True, help="output JSON")
    args = parser.parse_args(argv)

    cfg = load_stage(args.config)
    set_threads(cfg.base.threads)
    absent = absent_role(args.model_dir)
    if absent is not None or args.name not in cfg.probe.models:
        why = absent["why"] if absent else f"'{args.name}' is not in probe.models ({', '.join(cfg.probe.models)})"
        atomic_write_json(Path(args.out), {"model": args.name, "skipped": why})
        print(f"probe_layers: {args.name} skipped: {why} -> {args.out}")
        return
    pairs = load_topv2_pairs(Path(args.data) / "topv2" / "eval.jsonl", cfg.probe.topv2_rows) if args.data else []
    model = load_early_exit_model(args.model_dir, cfg.base.dtype, cfg.base.device)
    tokenizer = load_tokenizer(args.model_dir)
    results = probe_texts(model, tokenizer, dict(PROBE_TEXTS), cfg.probe.max_tokens)
    if pairs:
        results.update(probe_prompt_target(model, tokenizer, pairs, "topv2", cfg.probe.max_tokens))

    report = {
        "model": args.name,
        "model_dir": str(args.model_dir),
        "num_layers": model.num_layers,
        "max_tokens": cfg.probe.max_tokens,
        "layers": list(range(1, model.num_layers + 1)),
        "texts": results,
        "provenance": provenance(stage_view(cfg, "probe_layers"), model.device, cfg.base.dtype),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f".{out.name}.partial-{os.getpid()}")
    partial.write_text(json.dumps(report, indent=2) + "\n")
    os.replace(partial, out)

    shown = [layer for layer in SHOWN_LAYERS if layer <= model.num_layers] or [model.num_layers]
    curves = "; ".join(
        f"{kind} " + " ".join(f"{entry['top1_agreement'][layer - 1]:.2f}" for layer in shown)
        for kind, entry in results.items()
    )
    print(f"probe_layers: {args.name} ({model.num_layers} layers) top-1 agreement at layers {shown}: {curves} -> {out}")


if __name__ == "__main__":
    run_stage(main)
