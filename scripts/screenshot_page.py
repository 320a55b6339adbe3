"""Screenshots of results/index.html in headless Chromium, for the README: the verdicts (the page's top) and
one task's table. Needs Debian's `chromium` (apt-get install chromium); run after `dvc repro`:

    python scripts/screenshot_page.py                # -> results/screenshots/{verdicts,topv2_table}.png
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from exitbench.errors import ExitbenchError
from exitbench.report.browser import render, screenshot, section_screenshot


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--page", type=Path, default=Path("results/index.html"))
    parser.add_argument("--out", type=Path, default=Path("results/screenshots"))
    parser.add_argument("--task-table", default="quality-speed-and-exactness-per-task-topv2",
                        help="the id of the heading above the task's table (see the page's headings)")  # fmt: skip
    args = parser.parse_args(argv)
    try:
        rendered = render(args.page)
        missing = [src for src, loaded in rendered.images().items() if loaded != "yes"]
        if missing:
            print(f"screenshot_page: {len(missing)} images did not load: {', '.join(missing)}")
        made = [
            screenshot(args.page, args.out / "verdicts.png", height=1100),
            section_screenshot(args.page, args.task_table, args.out / "topv2_table.png"),
        ]
    except (ExitbenchError, OSError) as err:
        print(f"error: screenshot_page: {err}", file=sys.stderr)
        return 2
    print(f"screenshot_page: {', '.join(map(str, made))} ({len(rendered.table_rows())} tables rendered)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
