"""Adding a method re-runs its own evaluation stage and nothing else (README "Adding a method"), on a workspace
where the pipeline has run: CI runs this after the smoke profile's `dvc repro`:

    EXITBENCH_RAN_WORKSPACE=$PWD python -m pytest tests/test_add_method.py

The test follows the README's recipe in that workspace (a module, a params.yaml entry, the stage's name in
dvc.yaml), asserts what `dvc status` and `dvc repro` do, then puts it back as it was. Without the
variable it is skipped: a workspace whose every stage is up to date takes a full `dvc repro` to make.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

WORKSPACE = os.environ.get("EXITBENCH_RAN_WORKSPACE")
NAME = "top2_exit"
MODULE = '''"""The README's example method: greedy decoding from an early exit."""

from pydantic import Field

from exitbench.decoding.base import DecodeResult, DecodingMethod, MethodOptions, StopRule, register
from exitbench.decoding.steps import draft_hidden, finish, greedy, new_cache_for, prefill


class Top2ExitOptions(MethodOptions):
    exit_layer: int = Field(..., ge=1)


@register
class Top2Exit(DecodingMethod):
    name = "top2_exit"
    Options = Top2ExitOptions

    def _generate(self, prompt_ids: list[int], max_new_tokens: int, stop: StopRule) -> DecodeResult:
        model, exit_layer = self.model, self.options.exit_layer
        cache = new_cache_for(model, len(prompt_ids), max_new_tokens)
        tokens = [greedy(prefill(model, cache, prompt_ids, last_layer=exit_layer))]
        while len(tokens) < max_new_tokens and stop.cut(tokens, len(tokens) - 1) is None:
            hidden = draft_hidden(model, cache, [tokens[-1]], len(prompt_ids) + len(tokens) - 1, exit_layer)
            tokens.append(greedy(model.logits(hidden)))
        return DecodeResult(tokens=finish(tokens, max_new_tokens, stop), wall_time_s=0.0)
'''


def readme_module() -> str:
    """The README's example module, which this test adds (so the recipe it documents is the one tested)."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    found = re.search(r"```python\n# exitbench/decoding/top2_exit.py\n(.*?)```", readme, re.S)
    assert found, "README.md lost its 'Adding a method' example"
    return found.group(1)


def test_the_readme_example_is_the_module_this_test_adds():
    body = MODULE.split('"""\n\n', 1)[1]
    assert readme_module().strip() == body.strip()


def _dvc(root: Path, *args: str) -> str:
    done = subprocess.run(["dvc", *args], cwd=root, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, f"dvc {' '.join(args)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.mark.slow
@pytest.mark.skipif(not WORKSPACE, reason="needs EXITBENCH_RAN_WORKSPACE: a workspace after `dvc repro` (CI sets it)")
def test_adding_a_method_reruns_its_own_stage_only():
    root = Path(WORKSPACE).resolve()
    assert not _dvc(root, "status", "--json").strip("{}\n "), "the workspace is not up to date; run `dvc repro` first"
    touched = {path: (root / path).read_text() for path in ("params.yaml", "dvc.yaml", "dvc.lock")}
    module = root / "exitbench" / "decoding" / f"{NAME}.py"
    made = [module, root / "results" / "eval" / NAME, root / "build" / "config" / "evaluate" / f"{NAME}.json",
            root / "build" / "config" / "evaluate" / f"{NAME}.code.json"]
    try:
        module.write_text(MODULE)
        params = touched["params.yaml"]
        entry = re.search(r"^evaluate:\n(?:.*\n)*?  methods:\n", params, re.M)
        assert entry, "params.yaml has no evaluate.methods"
        added = f"    {NAME}: {{exit_layer: 2}}\n"
        (root / "params.yaml").write_text(params[: entry.end()] + added + params[entry.end() :])
        pipeline = touched["dvc.yaml"]
        assert "    foreach: [early_exit," in pipeline
        listed = pipeline.replace("    foreach: [early_exit,", f"    foreach: [{NAME}, early_exit,")
        (root / "dvc.yaml").write_text(listed)

        changed = set(json.loads(_dvc(root, "status", "--json")))
        assert changed == {"configure", f"evaluate@{NAME}"}, changed

        log = _dvc(root, "repro")
        ran = set(re.findall(r"Running stage '([^']+)'", log))
        assert ran == {"configure", f"evaluate@{NAME}", "report", "check", "page"}, ran
        summaries = sorted((root / "results" / "eval" / NAME).glob("*/*/*.json"))
        assert summaries, "the new stage wrote no summary"
        for path in summaries:
            summary = json.loads(path.read_text())
            assert summary["method"] == NAME and summary["speed"]["speedup_vs_greedy"] is not None
            assert all("reference_decode" in json.loads(line)
                       for line in path.with_suffix(".jsonl").read_text().splitlines())
        assert NAME in (root / "results" / "README.md").read_text()
    finally:
        for path in made:
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)
        for path, text in touched.items():
            (root / path).write_text(text)
        subprocess.run(["dvc", "repro"], cwd=root, capture_output=True, timeout=1800)  # configs, report: as they were
