"""scripts/compare_records.py pairs a new settings key's records with an old key's, prompt by prompt."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "compare_records.py"


def record(key: str, sample: str, tokens: list[int], rounds: int) -> str:
    decode = {
        "num_rounds": rounds,
        "num_drafted": 4,
        "num_accepted": 2,
        "acceptance_histogram": [1, 1],
        "layer_calls": {"verify_forwards": rounds},
    }
    return json.dumps({"settings_key": key, "sample_id": sample, "tokens": tokens, "decode": decode})


def write(folder: Path, lines: list[str]) -> None:
    path = folder / "prompt_lookup" / "layerskip" / "topv2" / "prompt_lookup.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


def run(old: Path, new: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), str(old), str(new)], capture_output=True, text=True)


def test_equal_generations_pass_and_a_changed_one_fails(tmp_path):
    old, new = tmp_path / "old", tmp_path / "new"
    before = [record("a", "s1", [1, 2, 3], 2), record("a", "s2", [4, 5], 1)]
    write(old, before)
    write(new, [*before, record("b", "s1", [1, 2, 3], 2), record("b", "s2", [4, 5], 1)])
    same = run(old, new)
    assert same.returncode == 0 and "2 prompts, tokens equal 2, round counters equal 2" in same.stdout
    write(new, [*before, record("b", "s1", [1, 2, 3], 3), record("b", "s2", [4, 6], 1)])
    changed = run(old, new)
    assert changed.returncode == 1 and "2 prompts, tokens equal 1, round counters equal 1" in changed.stdout
