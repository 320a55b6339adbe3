"""A method's stored generations are keyed by its own code: adding or changing another method keeps them."""

from __future__ import annotations

import shutil
from pathlib import Path

from exitbench.decoding import method_class
from exitbench.identity import PACKAGE, code_identity, method_code_identity, source_closure


def _copy(tmp_path: Path) -> Path:
    root = tmp_path / "exitbench"
    shutil.copytree(PACKAGE, root, ignore=shutil.ignore_patterns("__pycache__"))
    return root


def _ids(root: Path) -> dict[str, str]:
    names = ("self_speculative", "prompt_lookup")
    return {name: code_identity(root / "decoding" / f"{name}.py", root) for name in names}


def test_a_method_closure_holds_what_it_imports_and_nothing_else():
    names = {str(p.relative_to(PACKAGE)) for p in source_closure(PACKAGE / "decoding" / "prompt_lookup.py")}
    assert {"decoding/prompt_lookup.py", "decoding/draft_verify.py", "decoding/steps.py", "models/view.py"} <= names
    # the shared draft-verify loop, not the other drafting methods: they are proposers beside it
    assert not {"decoding/speculative.py", "decoding/self_speculative.py", "decoding/early_exit.py",
                "decoding/calm.py", "decoding/__init__.py"} & names
    expected = code_identity(PACKAGE / "decoding" / "prompt_lookup.py")
    assert method_code_identity(method_class("prompt_lookup")) == expected


def test_adding_a_method_or_changing_another_keeps_a_methods_identity(tmp_path):
    root = _copy(tmp_path)
    before = _ids(root)
    (root / "decoding" / "top2_exit.py").write_text("from exitbench.decoding.base import register\n")
    init = root / "decoding" / "__init__.py"
    init.write_text(init.read_text() + "from exitbench.decoding import top2_exit  # noqa: F401\n")
    assert _ids(root) == before
    lookup = root / "decoding" / "prompt_lookup.py"
    lookup.write_text(lookup.read_text() + "\n# changed\n")
    after = _ids(root)
    assert after["self_speculative"] == before["self_speculative"]
    assert after["prompt_lookup"] != before["prompt_lookup"]


def test_changing_shared_code_changes_every_method_built_on_it(tmp_path):
    root = _copy(tmp_path)
    before = _ids(root)
    steps = root / "decoding" / "steps.py"
    steps.write_text(steps.read_text() + "\n# changed\n")
    after = _ids(root)
    assert all(after[name] != before[name] for name in before)
    view = root / "models" / "view.py"
    again = _ids(root)
    view.write_text(view.read_text() + "\n# changed\n")
    assert all(_ids(root)[name] != again[name] for name in again)
