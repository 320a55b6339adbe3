"""Every library module a stage imports is a dependency of that stage in dvc.yaml, so editing it reruns the stage.

Modules that cannot change a stage's numbers (errors, provenance stamps, atomic writes, a docstring-only package
marker, the config schema, whose effect reaches stages through ``build/config``) are exempt, listed below.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
EXEMPT = {
    "exitbench/__init__.py",
    "exitbench/config.py",
    "exitbench/errors.py",
    "exitbench/provenance.py",
    "exitbench/cli.py",
    "exitbench/data/io.py",
    "exitbench/data/__init__.py",
}


def module_file(name: str) -> Path | None:
    """The file of an ``exitbench`` module or package, or None for anything else."""
    if name != "exitbench" and not name.startswith("exitbench."):
        return None
    base = ROOT.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.exists():
            return candidate
    return None


def runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node of ``tree`` except those under ``if TYPE_CHECKING:`` (imports for annotations only never run)."""
    nodes, todo = [], [tree]
    while todo:
        node = todo.pop()
        nodes.append(node)
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))
    return nodes


def imported_files(path: Path) -> set[Path]:
    """``exitbench`` files ``path`` imports, directly or through other ``exitbench`` modules."""
    seen: set[Path] = set()
    todo = [path]
    while todo:
        tree = ast.parse(todo.pop().read_text())
        names: list[str] = []
        for node in runtime_nodes(tree):
            if isinstance(node, ast.Import):
                names += [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.append(node.module)
                names += [f"{node.module}.{alias.name}" for alias in node.names]
        for name in names:
            parts = name.split(".")
            for depth in range(1, len(parts) + 1):  # a package's __init__ runs on import of its modules
                found = module_file(".".join(parts[:depth]))
                if found is not None and found not in seen:
                    seen.add(found)
                    todo.append(found)
    return seen


def stage_scripts() -> list[tuple[str, Path, list[str]]]:
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    found = []
    for name, stage in stages.items():
        body = stage.get("do", stage)
        script = next(word for word in body["cmd"].split() if word.startswith("pipelines/"))
        deps = [dep if isinstance(dep, str) else next(iter(dep)) for dep in body.get("deps", [])]
        found.append((name, ROOT / script, deps))
    return found


STAGES = stage_scripts()


@pytest.mark.parametrize(("stage", "script", "deps"), STAGES, ids=[name for name, _, _ in STAGES])
def test_stage_depends_on_every_module_it_imports(stage, script, deps):
    assert script.relative_to(ROOT).as_posix() in deps, f"{stage}: its own script is not a dependency"
    missing = []
    for file in sorted(imported_files(script)):
        relative = file.relative_to(ROOT).as_posix()
        if relative in EXEMPT:
            continue
        if not any(relative == dep or relative.startswith(dep.rstrip("/") + "/") for dep in deps):
            missing.append(relative)
    assert not missing, f"dvc.yaml stage '{stage}' imports {missing} but does not list them as deps"


def test_configure_depends_on_the_whole_params_file():
    """A key no `params:` entry lists (a typo, a new top-level section) still reruns configure, which rejects it."""
    deps = next(deps for name, _, deps in STAGES if name == "configure")
    assert "params.yaml" in deps


def test_configure_depends_on_every_methods_code():
    """configure writes each method's code identity (build/config/evaluate/<method>.code.json, what its evaluate stage
    depends on): it must re-run whenever a file of any method's source closure changes."""
    from exitbench.decoding import REGISTRY
    from exitbench.identity import source_closure

    deps = next(deps for name, _, deps in STAGES if name == "configure")
    missing = set()
    for cls in REGISTRY.values():
        for file in source_closure(Path(inspect.getfile(cls))):
            relative = file.relative_to(ROOT).as_posix()
            if not any(relative == dep or relative.startswith(dep.rstrip("/") + "/") for dep in deps):
                missing.add(relative)
    assert not missing, f"configure does not depend on {sorted(missing)}, which methods' code identities cover"


def test_every_registered_method_has_an_evaluate_stage():
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    from exitbench.decoding import REGISTRY

    staged = {"autoregressive", *stages["evaluate"]["foreach"]}
    assert staged == set(REGISTRY), (staged - set(REGISTRY), set(REGISTRY) - staged)


def test_a_method_module_that_fails_to_import_is_one_line_and_leaves_the_others(tmp_path):
    """A broken method module: the package still imports, the other methods work, and asking for the broken one
    names its module and error in one line (configure and its own stage stop there; the others run)."""
    import subprocess
    import sys

    broken = ROOT / "exitbench" / "decoding" / "zz_broken_method.py"
    broken.write_text("raise RuntimeError('half-written module')\n")
    try:
        code = (
            "from exitbench.decoding import REGISTRY, method_class\n"
            "assert 'self_speculative' in REGISTRY\n"
            "method_class('zz_broken_method@2')\n"
        )
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    finally:
        broken.unlink()
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode != 0
    assert "zz_broken_method.py failed to import (RuntimeError: half-written module)" in last, last
