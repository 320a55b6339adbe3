"""requirements/cpu.lock.txt: it satisfies pyproject.toml (CI runs the same check), a broken lock fails with one
line naming the package and the fix, the GPU subset leaves out torch and what only torch needs, and every
result's provenance records the lock's sha256. Fast, no network."""

from __future__ import annotations

import hashlib
import importlib.util
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from exitbench import provenance as prov

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "check_lock.py"
LOCK = ROOT / "requirements" / "cpu.lock.txt"

_spec = importlib.util.spec_from_file_location("check_lock", SCRIPT)
check_lock = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("check_lock", check_lock)  # dataclasses look their module up there
_spec.loader.exec_module(check_lock)


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


def entry(name: str, version: str, *via: str, hashed: bool = True) -> str:
    lines = [f"{name}=={version}" + (" \\" if hashed else "")]
    if hashed:
        lines.append("    --hash=sha256:" + hashlib.sha256(name.encode()).hexdigest())
    lines += [f"    # via {via[0]}"] if len(via) == 1 else ["    # via", *[f"    #   {v}" for v in via]]
    return "\n".join(lines)


def broken(tmp_path: Path, old: str, new: str) -> Path:
    text = LOCK.read_text()
    assert old in text, f"the lock has no '{old}' to break"
    path = tmp_path / "cpu.lock.txt"
    path.write_text(text.replace(old, new, 1))
    return path


def pinned(name: str) -> str:
    return check_lock.parse_lock(LOCK.read_text())[name].version


def test_real_lock_satisfies_pyproject():
    proc = run()
    assert proc.returncode == 0, proc.stderr
    assert "satisfies every requirement" in proc.stdout and not proc.stderr


def test_real_lock_is_fully_pinned_and_hashed_cpu_only():
    pins = check_lock.parse_lock(LOCK.read_text())
    assert len(pins) > 50
    assert all(pin.hashes and all(h.startswith("sha256:") for h in pin.hashes) for pin in pins.values())
    assert pins["torch"].version.endswith("+cpu")
    assert not [key for key in pins if check_lock.CUDA_ONLY.match(key)]
    assert "exitbench" not in pins


def test_a_pin_outside_pyproject_range_is_one_line_naming_package_and_fix(tmp_path):
    lock = broken(tmp_path, f"\ntransformers=={pinned('transformers')} ", "\ntransformers==4.57.1 ")
    proc = run("--lock", str(lock))
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "transformers==4.57.1" in lines[0] and "transformers>=5.0,<6" in lines[0]
    assert "bash scripts/update_lock.sh --upgrade-package transformers" in lines[0]


def test_a_missing_pin_and_a_missing_hash_are_reported(tmp_path):
    text = LOCK.read_text()
    entries = check_lock.read_entries(text)
    accelerate = next(lines for _, lines in entries if lines[0].startswith("accelerate=="))
    text = text.replace("\n".join(accelerate) + "\n", "")
    pyyaml = next(lines for _, lines in entries if lines[0].lower().startswith("pyyaml=="))
    text = text.replace("\n".join(pyyaml), f"pyyaml=={pinned('pyyaml')}\n    # via exitbench (pyproject.toml)")
    lock = tmp_path / "cpu.lock.txt"
    lock.write_text(text)
    proc = run("--lock", str(lock))
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 2, proc.stderr
    assert "no pin for accelerate" in proc.stderr and "accelerate>=1.0" in proc.stderr
    assert f"pyyaml=={pinned('pyyaml')} without --hash" in proc.stderr
    assert all("bash scripts/update_lock.sh" in line for line in lines)


def test_a_cuda_package_in_the_cpu_lock_is_an_error(tmp_path):
    lock = tmp_path / "cpu.lock.txt"
    lock.write_text(LOCK.read_text() + entry("nvidia-cublas-cu12", "12.8.4.1", "torch") + "\n")
    proc = run("--lock", str(lock))
    assert proc.returncode == 1 and "nvidia-cublas-cu12" in proc.stderr and "CUDA" in proc.stderr


def test_unparsable_lock_and_missing_lock(tmp_path):
    lock = tmp_path / "cpu.lock.txt"
    lock.write_text("torch>=2.4 \\\n    --hash=sha256:00\n")
    proc = run("--lock", str(lock))
    assert proc.returncode == 1 and "not an exact pin" in proc.stderr and "update_lock.sh" in proc.stderr
    proc = run("--lock", str(tmp_path / "absent.txt"))
    assert proc.returncode == 1 and "is missing" in proc.stderr


def test_parse_via_forms():
    text = "\n".join([
        "# header",
        entry("a", "1.0", "b"),
        entry("b", "2.0", "c", "exitbench (pyproject.toml)"),
        entry("c", "3.0", "-r requirements/cpu.in"),
        "",
        "# The following packages are considered to be unsafe in a requirements file:",
        entry("setuptools", "80.0", "c"),
    ]) + "\n"
    pins = check_lock.parse_lock(text)
    assert [(p.name, p.version, p.via) for p in pins.values()] == [
        ("a", "1.0", ["b"]), ("b", "2.0", ["c", "exitbench (pyproject.toml)"]),
        ("c", "3.0", ["-r requirements/cpu.in"]), ("setuptools", "80.0", ["c"])]
    with pytest.raises(check_lock.LockError, match="pinned twice"):
        check_lock.parse_lock(text + entry("A", "1.1", "b") + "\n")
    with pytest.raises(check_lock.LockError, match="no place"):
        check_lock.parse_lock("-e .\n" + text)


def test_export_without_leaves_out_only_what_only_the_root_needs():
    text = "\n".join([
        entry("torch", "2.13.0+cpu", "-r requirements/cpu.in", "exitbench (pyproject.toml)"),
        entry("sympy", "1.14.0", "torch"),
        entry("mpmath", "1.3.0", "sympy"),
        entry("filelock", "3.0", "torch", "transformers"),
        entry("transformers", "5.0", "exitbench (pyproject.toml)"),
        entry("numpy", "2.0", "exitbench (pyproject.toml)", "torch"),
    ]) + "\n"
    out, left_out = check_lock.export_without(text, {"torch"})
    assert left_out == {"torch", "sympy", "mpmath"}
    assert set(check_lock.parse_lock(out)) == {"filelock", "transformers", "numpy"}
    assert all(pin.hashes for pin in check_lock.parse_lock(out).values())


def test_export_without_torch_on_the_real_lock(tmp_path):
    out = tmp_path / "gpu.txt"
    proc = run("--without", "torch", "--export", str(out))
    assert proc.returncode == 0, proc.stderr
    kept = check_lock.parse_lock(out.read_text())
    full = check_lock.parse_lock(LOCK.read_text())
    assert "torch" not in kept and "sympy" not in kept  # sympy: only torch needs it
    assert {"transformers", "accelerate", "filelock", "typing-extensions"} <= set(kept)
    assert {key: pin.version for key, pin in kept.items()} == {
        key: full[key].version for key in kept}  # same pins, same hashes
    assert all(pin.hashes == full[key].hashes for key, pin in kept.items())


def test_installed_check_names_missing_and_other_versions(tmp_path):
    pytest_version = metadata.version("pytest")
    lock = tmp_path / "cpu.lock.txt"
    lock.write_text("\n".join([entry("pytest", pytest_version, "x"), entry("no-such-package-xyz", "1.0", "x"),
                               entry("pluggy", "0.0.1", "pytest")]) + "\n")
    errors, extra = check_lock.check_installed(lock, set())
    assert len(errors) == 2
    assert "no-such-package-xyz==1.0" in errors[0] and "not installed" in errors[0]
    assert "pluggy" in errors[1] and "pins 0.0.1" in errors[1]
    assert any(line.startswith("torch ") for line in extra)  # installed, not in this lock
    errors, extra = check_lock.check_installed(lock, {"pytest"})  # pluggy: only pytest needs it here
    assert len(errors) == 1 and not any(line.startswith(("pluggy ", "iniconfig ")) for line in extra)


def test_provenance_records_the_lock_sha256(tmp_path):
    block = prov.environment_lock(ROOT)
    assert block["file"] == "requirements/cpu.lock.txt"
    assert block["sha256"] == hashlib.sha256(LOCK.read_bytes()).hexdigest()
    assert isinstance(block["mismatched"], list)
    assert prov.environment_lock(tmp_path) is None
    other = tmp_path / "other"
    (other / "requirements").mkdir(parents=True)
    (other / "requirements" / "cpu.lock.txt").write_text(
        entry("pytest", "0.0.1", "x") + "\n" + entry("pluggy", metadata.version("pluggy"), "x") + "\n")
    assert prov.environment_lock(other)["mismatched"] == [f"pytest {metadata.version('pytest')} (lock 0.0.1)"]


def test_every_provenance_block_carries_the_lock(monkeypatch):
    monkeypatch.chdir(ROOT)
    block = prov.provenance({"profile": "smoke"})
    assert block["environment_lock"]["sha256"] == hashlib.sha256(LOCK.read_bytes()).hexdigest()


def test_a_run_rewriting_its_own_outputs_leaves_the_commit_clean_and_code_changes_do_not(tmp_path):
    def git(*args: str) -> None:
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    for path in ("dvc.lock", "results/eval/x.json", ".dvc/config", "exitbench/code.py", "sub/dvc.lock"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("v1\n")
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "c")
    clean = prov.git_commit(tmp_path)
    assert len(clean) == 40
    for path in ("dvc.lock", "results/eval/x.json", ".dvc/config"):
        (tmp_path / path).write_text("v2\n")
    assert prov.git_commit(tmp_path) == clean
    assert prov.git_commit(tmp_path / "results") == clean  # from a subfolder too
    (tmp_path / "sub/dvc.lock").write_text("v2\n")  # only the top-level outputs are the run's
    assert prov.git_commit(tmp_path) == clean + "+dirty"
    (tmp_path / "sub/dvc.lock").write_text("v1\n")
    (tmp_path / "exitbench/code.py").write_text("v2\n")
    assert prov.git_commit(tmp_path) == clean + "+dirty"
