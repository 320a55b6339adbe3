"""The README's "Adding a method" example runs as printed, and behaves as static early exit."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from exitbench.decoding import REGISTRY, build_method

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_method_example_registers_and_matches_early_exit(tiny_model):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    example = next(b for b in blocks if "@register" in b)
    REGISTRY.pop("top2_exit", None)
    exec(compile(example, "README.md", "exec"), {"__name__": "readme_example"})
    try:
        prompt = torch.randint(3, 128, (8,), generator=torch.Generator().manual_seed(5)).tolist()
        ours = build_method("top2_exit", tiny_model, {"exit_layer": 2}).generate(prompt, 12).tokens
        reference = build_method("early_exit", tiny_model, {"exit_layer": 2}).generate(prompt, 12).tokens
        assert ours == reference
    finally:
        REGISTRY.pop("top2_exit", None)
