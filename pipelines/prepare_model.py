"""Stage `prepare_model`: fetch the configured model, save it as safetensors, and build the draft model.

    python pipelines/prepare_model.py --config build/config/prepare_model.json \
        --out models/base --draft-out models/draft
"""

from __future__ import annotations

import argparse
import time

import torch

from exitbench.cli import run_stage, set_threads
from exitbench.config import load_stage
from exitbench.models.sources import prepare_model


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="build/config/prepare_model.json", help="resolved stage config")
    parser.add_argument("--out", default="models/base", help="directory for the prepared model")
    parser.add_argument("--draft-out", default="models/draft", help="directory for the truncated draft model")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    cfg = load_stage(args.config)
    set_threads(cfg.base.threads)
    torch.manual_seed(cfg.base.seed)
    base, draft = prepare_model(cfg.model, args.out, args.draft_out)
    draft_text = f"; draft {draft['num_layers']} layers -> {args.draft_out}" if draft else ""
    print(
        f"prepare_model: {base['source']['kind']} -> {args.out} ({base['architecture']}, {base['num_layers']} layers, "
        f"{base['num_parameters'] / 1e6:.1f}M params, {base['dtype']}){draft_text} "
        f"in {time.perf_counter() - started:.1f}s"
    )


if __name__ == "__main__":
    run_stage(main)
