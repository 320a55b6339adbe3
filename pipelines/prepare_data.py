"""CLI of the ``prepare_data`` stage: normalise the evaluation datasets into ``data/``.

    EXITBENCH_DATA_MIRROR=/path/to/mirror python pipelines/prepare_data.py \
        --config build/config/prepare_data.json --out data

Prints one summary line per (task, split); a user-fixable problem prints ``error: <message>`` on
stderr and exits with status 2.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from exitbench.config import load_stage
from exitbench.data.prepare import MANIFEST_NAME, prepare_data, summary_lines
from exitbench.data.sources import MIRROR_ENV, mirror_from_env
from exitbench.errors import ExitbenchError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=Path("build/config/prepare_data.json"),
                        help="the stage's resolved config (written by the configure stage)")
    parser.add_argument("--out", type=Path, default=Path("data"), help="output directory")
    args = parser.parse_args(argv)

    start = time.perf_counter()
    try:
        config = load_stage(args.config)
        manifest = prepare_data(config.data, args.out, mirror_from_env())
    except ExitbenchError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for line in summary_lines(manifest):
        print(line)
    mirror = manifest["mirror"] or f"none ({MIRROR_ENV} unset)"
    print(f"prepare_data: done in {time.perf_counter() - start:.1f}s; mirror: {mirror}; "
          f"manifest: {args.out / MANIFEST_NAME}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
