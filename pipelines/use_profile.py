"""Switch the active profile (and experiment) in params.yaml, then `dvc repro`.

    python pipelines/use_profile.py smoke
    python pipelines/use_profile.py paper --experiment layerskip_topv2_llama32_1b

Only the `profile:`, `experiment:`, `results_root:` and `models_root:` lines change (a twin's results go to
results/twins/<experiment> and its models to models/twins/<experiment>, so it never overwrites another run's,
and a twin can take another's trained models: `from_twin`); `configure` then rewrites the resolved configs, and
DVC re-runs exactly the stages whose effective settings or outputs differ.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from exitbench import config
from exitbench.cli import run_stage
from exitbench.data.io import atomic_write_text
from exitbench.errors import ExitbenchError


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("profile", help=f"one of: {', '.join(config.PROFILES)}")
    parser.add_argument("--experiment", default="", help="one of params.yaml's experiments (profile paper)")
    parser.add_argument("--params", default="params.yaml")
    args = parser.parse_args()
    path = Path(args.params)
    config.load(path, profile=args.profile, experiment=args.experiment)  # validates the names and merged values
    text = path.read_text()
    new_text, count = re.subn(r"(?m)^profile:.*$", f"profile: {args.profile}", text, count=1)
    if count != 1:
        raise ExitbenchError(f"{path}: no top-level 'profile:' line to change; add 'profile: {args.profile}'")
    line = f'experiment: "{args.experiment}"'
    new_text, count = re.subn(r"""(?m)^experiment:[ \t]*("[^"\n]*"|'[^'\n]*'|[^\s#]*)""", line, new_text, count=1)
    if count != 1:
        new_text = re.sub(r"(?m)^(profile:.*)$", rf"\1\n{line}", new_text, count=1)
    root = config.results_root_for(args.profile, args.experiment)
    new_text = set_root(new_text, "results_root", root, after="experiment")
    new_text = set_root(new_text, "models_root", config.models_root_for(args.profile, args.experiment),
                        after="results_root")
    atomic_write_text(path, new_text)
    chosen = f", experiment {args.experiment}" if args.experiment else ""
    print(f"profile: {args.profile}{chosen}, results in {root}/ (in {path}); now run `dvc repro`")


def set_root(text: str, key: str, value: str, after: str) -> str:
    """``key: value`` in place of the top-level ``key:`` line, or as a new line after the ``after:`` line."""
    new_text, count = re.subn(rf"(?m)^{key}:[ \t]*[^\s#]*", f"{key}: {value}", text, count=1)
    return new_text if count == 1 else re.sub(rf"(?m)^({after}:.*)$", rf"\1\n{key}: {value}", text, count=1)


if __name__ == "__main__":
    run_stage(main)
