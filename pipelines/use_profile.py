"""Switch the active profile in params.yaml (`python pipelines/use_profile.py smoke`), then `dvc repro`.

Only the `profile:` line changes; `configure` then rewrites the resolved configs, and DVC re-runs exactly
the stages whose effective settings differ.
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
    parser.add_argument("--params", default="params.yaml")
    args = parser.parse_args()
    path = Path(args.params)
    config.load(path, profile=args.profile)  # validates the name and the merged values first
    text = path.read_text()
    new_text, count = re.subn(r"(?m)^profile:.*$", f"profile: {args.profile}", text, count=1)
    if count != 1:
        raise ExitbenchError(f"{path}: no top-level 'profile:' line to change; add 'profile: {args.profile}'")
    atomic_write_text(path, new_text)
    print(f"profile: {args.profile} (in {path}); now run `dvc repro`")


if __name__ == "__main__":
    run_stage(main)
