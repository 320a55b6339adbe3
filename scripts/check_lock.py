"""Checks requirements/cpu.lock.txt, the pinned CPU environment that scripts/setup.sh installs exactly.

    python scripts/check_lock.py                 # every requirement of pyproject.toml ([project.dependencies]
                                                 # and the dev extra) is pinned, inside its range, with hashes
    python scripts/check_lock.py --installed     # this interpreter's packages are exactly the lock's
    python scripts/check_lock.py --without torch --export FILE
                                                 # the lock less torch and what only torch needs (GPU set-up)

Each problem is one line naming the package and the fix; the exit status is 1 when there is any. Reading the
lock and ``--export`` need only the standard library (set-up runs them before anything is installed); the
pyproject check needs ``packaging``, which the lock installs.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOCK = "requirements/cpu.lock.txt"
UPDATE = "bash scripts/update_lock.sh"
# pip freeze leaves these out too: the installer's own tools, and the project (installed editable on top).
NOT_LOCKED = {"pip", "setuptools", "wheel", "distribute", "exitbench"}
# A CUDA build of torch pulls these; the CPU wheel needs none, so in the CPU lock they mean a wrong torch.
CUDA_ONLY = re.compile(r"^(nvidia-.*|triton|pytorch-triton.*|cuda-.*)$")
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([^\s;]+)\s*(?:;\s*(.+))?$")
_FORBIDDEN_OPTIONS = {"-e", "--editable", "-r", "--requirement", "-c", "--constraint"}


class LockError(ValueError):
    """A lock file that is not a list of ``name==version [; marker] --hash=...`` entries."""


def canonical(name: str) -> str:
    """PEP 503 normalised name (``PyYAML`` and ``pyyaml``, ``typing_extensions`` and ``typing-extensions``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass
class Pin:
    name: str  # as written
    version: str
    marker: str | None
    hashes: list[str] = field(default_factory=list)
    via: list[str] = field(default_factory=list)  # pip-compile's "# via" parents, as written

    @property
    def key(self) -> str:
        return canonical(self.name)


def read_entries(text: str, source: str = LOCK) -> list[tuple[int, list[str]]]:
    """The lock's entries: (first line number, raw lines) of each pin with its hash and ``# via`` lines."""
    entries: list[tuple[int, list[str]]] = []
    continuing = in_via = False
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if continuing:
            entries[-1][1].append(line)
            continuing = stripped.endswith("\\")
        elif stripped and not stripped.startswith("#"):
            in_via = False
            if stripped.startswith("-"):  # an option line (--find-links ...): set-up relies on pip's own config
                option = stripped.split()[0].split("=")[0]
                if option in _FORBIDDEN_OPTIONS:
                    raise LockError(f"{source}:{number}: '{option}' has no place in a hashed lock")
                continue
            entries.append((number, [line]))
            continuing = stripped.endswith("\\")
        elif entries and stripped.startswith("# via"):
            entries[-1][1].append(line)
            in_via = stripped == "# via"
        elif entries and in_via and stripped.startswith("#   "):
            entries[-1][1].append(line)
        else:
            in_via = False
    if continuing:
        raise LockError(f"{source}:{entries[-1][0]}: the last entry ends with a line continuation")
    return entries


def parse_entry(number: int, lines: list[str], source: str = LOCK) -> Pin:
    """One entry: ``name==version [; marker] \\ --hash=sha256:... # via parent, ...``."""
    code = " ".join(line.strip().rstrip("\\") for line in lines if not line.strip().startswith("#"))
    tokens = code.split()
    hashes = [token.split("=", 1)[1] for token in tokens if token.startswith("--hash=")]
    spec = " ".join(token for token in tokens if not token.startswith("--"))
    match = _PIN.match(spec)
    if not match:
        raise LockError(f"{source}:{number}: '{spec}' is not an exact pin (name==version)")
    via: list[str] = []
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("# via"):
            via += [parent.strip() for parent in stripped[len("# via"):].split(",") if parent.strip()]
        elif stripped.startswith("#   "):
            via.append(stripped[1:].strip())
    return Pin(match[1], match[2], match[3], hashes, via)


def parse_lock(text: str, source: str = LOCK) -> dict[str, Pin]:
    """The pins of a pip-compile style lock, by canonical name."""
    pins: dict[str, Pin] = {}
    for number, lines in read_entries(text, source):
        pin = parse_entry(number, lines, source)
        if pin.key in pins:
            raise LockError(f"{source}:{number}: {pin.name} is pinned twice")
        pins[pin.key] = pin
    return pins


def only_needed_by(pins: dict[str, Pin], roots: set[str]) -> set[str]:
    """``roots`` and, to a fixed point, every pin whose ``# via`` parents are all in that set.

    A parent that is a file (``-r requirements/cpu.in``, ``exitbench (pyproject.toml)``) is never left out, so
    a package the project asks for itself stays even when torch needs it too.
    """
    gone = {canonical(root) for root in roots}
    changed = True
    while changed:
        changed = False
        for key, pin in pins.items():
            if key in gone or not pin.via or any(p.startswith("-") or "(" in p for p in pin.via):
                continue
            if {canonical(parent.split()[0]) for parent in pin.via} <= gone:
                gone.add(key)
                changed = True
    return gone


def export_without(text: str, roots: set[str], source: str = LOCK) -> tuple[str, set[str]]:
    """The lock's text less ``roots`` and what only they need, and the names left out."""
    pins = parse_lock(text, source)
    gone = only_needed_by(pins, roots)
    left_out = sorted(pins[key].name for key in gone if key in pins)
    kept = ["\n".join(lines) for number, lines in read_entries(text, source)
            if parse_entry(number, lines, source).key not in gone]
    header = f"# {source} less {', '.join(left_out) or 'nothing'} (written by scripts/check_lock.py --without)\n"
    return header + "\n".join(kept) + "\n", set(left_out)


def check_pyproject(pyproject: Path, lock: Path) -> list[str]:
    """One line per requirement of [project.dependencies] and the dev extra that the lock does not meet."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    from packaging.requirements import Requirement
    from packaging.version import InvalidVersion, Version

    name = _display(lock)
    try:
        pins = parse_lock(lock.read_text(), name)
    except FileNotFoundError:
        return [f"error: {name} is missing; create it: {UPDATE}"]
    except LockError as exc:
        return [f"error: {exc}; regenerate it: {UPDATE}"]
    project = tomllib.loads(pyproject.read_text())["project"]
    wanted = [*project.get("dependencies", []), *project.get("optional-dependencies", {}).get("dev", [])]
    errors = []
    for line in wanted:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue  # not for this platform (the lock is for this one)
        pin = pins.get(canonical(req.name))
        if pin is None:
            errors.append(f"error: {name} has no pin for {req.name} (pyproject.toml requires '{line}'); "
                          f"add it: {UPDATE}")
            continue
        try:
            ok = req.specifier.contains(Version(pin.version), prereleases=True)
        except InvalidVersion:
            ok = False
        if not ok:
            errors.append(f"error: {name} pins {pin.name}=={pin.version}, outside pyproject.toml's '{line}'; "
                          f"update it: {UPDATE} --upgrade-package {req.name}")
    for pin in pins.values():
        if not pin.hashes:
            errors.append(f"error: {name} pins {pin.name}=={pin.version} without --hash; regenerate it: {UPDATE}")
        if CUDA_ONLY.match(pin.key):
            errors.append(f"error: {name} pins {pin.name}=={pin.version}, a CUDA-only package (torch resolved to "
                          f"a CUDA build); pin the CPU wheel in requirements/cpu.in and regenerate: {UPDATE}")
    return errors


def check_installed(lock: Path, without: set[str]) -> tuple[list[str], list[str]]:
    """Differences between this interpreter's packages and the lock (``without`` left aside), one line each:
    pins missing or at another version, and packages the lock does not name (extra)."""
    from importlib import metadata

    name = _display(lock)
    pins = parse_lock(lock.read_text(), name)
    aside = only_needed_by(pins, without) if without else set()
    installed: dict[str, tuple[str, str]] = {}
    for dist in metadata.distributions():
        dist_name = dist.metadata["Name"]
        if dist_name:
            installed.setdefault(canonical(dist_name), (dist_name, dist.version))
    theirs = _installed_closure(without) if without else set()  # e.g. a CUDA torch's nvidia-* and triton
    errors, extra = [], []
    for key, pin in sorted(pins.items()):
        have = installed.get(key)
        if key in aside:
            continue
        if have is None:
            errors.append(f"error: {pin.name}=={pin.version} ({name}) is not installed; run: bash scripts/setup.sh")
        elif not _same_version(have[1], pin.version):
            errors.append(f"error: {pin.name} {have[1]} is installed but {name} pins {pin.version}; "
                          f"run: bash scripts/setup.sh")
    for key, (dist_name, version) in sorted(installed.items()):
        if key not in pins and key not in NOT_LOCKED and key not in aside | theirs:
            extra.append(f"{dist_name} {version} is installed but not in {name}; uninstall it "
                         f"(pip uninstall {dist_name}) or add it to pyproject.toml and run {UPDATE}")
    return errors, extra


def _installed_closure(roots: set[str]) -> set[str]:
    """The installed packages that ``roots`` need, directly or not (from their installed metadata)."""
    from importlib import metadata

    from packaging.requirements import Requirement

    seen: set[str] = set()
    todo = [canonical(root) for root in roots]
    while todo:
        key = todo.pop()
        if key in seen:
            continue
        seen.add(key)
        try:
            requires = metadata.distribution(key).requires or []
        except metadata.PackageNotFoundError:
            continue
        for line in requires:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(canonical(req.name))
    return seen


def _same_version(a: str, b: str) -> bool:
    try:
        from packaging.version import Version

        return Version(a) == Version(b)
    except Exception:  # packaging absent or not a PEP 440 version: compare as written
        return a == b


def _display(path: Path) -> str:
    try:
        return path.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return str(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--lock", type=Path, default=ROOT / LOCK)
    parser.add_argument("--pyproject", type=Path, default=ROOT / "pyproject.toml")
    parser.add_argument("--installed", action="store_true", help="compare this interpreter's packages with the lock")
    parser.add_argument("--allow-extra", action="store_true",
                        help="with --installed: packages the lock does not name are warnings, not errors")
    parser.add_argument("--without", action="append", default=[], metavar="NAME",
                        help="leave NAME and what only it needs aside (repeatable)")
    parser.add_argument("--export", type=Path, metavar="FILE", help="write the lock less --without to FILE")
    args = parser.parse_args(argv)
    try:
        if args.export:
            text, left_out = export_without(args.lock.read_text(), set(args.without), _display(args.lock))
            args.export.write_text(text)
            print(f"[lock] {args.export}: {_display(args.lock)} less {', '.join(sorted(left_out)) or 'nothing'}")
            return 0
        if args.installed:
            errors, extra = check_installed(args.lock, set(args.without))
            if args.allow_extra:
                for line in extra:
                    print(f"warning: {line}", file=sys.stderr)
            else:
                errors += [f"error: {line}" for line in extra]
            ok = f"the installed packages are exactly {_display(args.lock)}"
            if args.without:
                ok += f" (less {', '.join(args.without)} and what only it needs)"
            if extra:
                ok = f"every pin of {_display(args.lock)} is installed at its version ({len(extra)} more packages)"
        else:
            errors = check_pyproject(args.pyproject, args.lock)
            ok = f"{_display(args.lock)} satisfies every requirement of {_display(args.pyproject)} (and the dev extra)"
    except (LockError, OSError) as exc:
        errors = [f"error: {exc}"]
    for line in errors:
        print(line, file=sys.stderr)
    if not errors:
        print(f"[lock] {ok}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
