"""The results page in a real browser: headless Chromium (Debian's ``chromium``) renders ``results/index.html``
from the file system, for a screenshot or for the DOM after the page's scripts ran (which images loaded, how many
rows each table has, where each section starts).

Only the command-line switches of Chromium itself are used (``--dump-dom``, ``--screenshot``): no driver, no
browser download. The switches keep it offline and quiet (no background networking, no first-run, a fresh
profile per call) and let it run as root (``--no-sandbox``: the page is our own file, never a remote one).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from exitbench.errors import ExitbenchError

CANDIDATES = ("chromium", "chromium-browser", "google-chrome")
SWITCHES = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--virtual-time-budget=5000",  # the page's scripts and image loads finish before the DOM or picture is taken
)
WIDTH = 1400
MAX_HEIGHT = 40000  # the tallest screenshot taken (a section further down is cut there)


def find_chromium() -> str | None:
    """The browser's path (``EXITBENCH_CHROMIUM`` first), or None where none is installed."""
    wanted = os.environ.get("EXITBENCH_CHROMIUM")
    return shutil.which(wanted) if wanted else next(filter(None, map(shutil.which, CANDIDATES)), None)


def _run(page: Path, *args: str) -> str:
    browser = find_chromium()
    if browser is None:
        raise ExitbenchError("no Chromium found: install Debian's `chromium` (apt-get install chromium) or set "
                             "EXITBENCH_CHROMIUM to a Chrome/Chromium binary")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="exitbench-chromium-") as profile:
        done = subprocess.run(
            [browser, *SWITCHES, f"--user-data-dir={profile}", *args, Path(page).resolve().as_uri()],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
    if done.returncode != 0:
        raise ExitbenchError(f"{browser} failed on {page} (exit {done.returncode}): {done.stderr.strip()[-400:]}")
    return done.stdout


@dataclass(frozen=True)
class Rendered:
    """What the browser made of the page: its DOM after the scripts ran."""

    dom: str

    def table_rows(self) -> list[int]:
        """Body rows of each table, in page order."""
        return [body.count("<tr") for body in re.findall(r"<tbody>(.*?)</tbody>", self.dom, flags=re.S)]

    def images(self) -> dict[str, str]:
        """Each image's src -> "yes" (it loaded and has pixels) or "no"."""
        found = {}
        for tag in re.findall(r"<img\b[^>]*>", self.dom):
            src, loaded = re.search(r'src="([^"]*)"', tag), re.search(r'data-loaded="([^"]*)"', tag)
            found[src.group(1) if src else ""] = loaded.group(1) if loaded else "no"
        return found

    def section_top(self, heading_id: str) -> int | None:
        """Where the heading with that id starts on the page, in CSS pixels (None: no such heading)."""
        match = re.search(rf'<h[1-6][^>]*\bid="{re.escape(heading_id)}"[^>]*>', self.dom)
        top = match and re.search(r'data-y="(\d+)"', match.group(0))
        return int(top.group(1)) if top else None

    def next_section_top(self, heading_id: str) -> int | None:
        """Where the first heading after that one starts (the section's end)."""
        start = self.section_top(heading_id)
        tops = sorted(int(y) for y in re.findall(r'<h[1-6][^>]*\bdata-y="(\d+)"', self.dom))
        return next((y for y in tops if start is not None and y > start), None)


def render(page: Path, width: int = WIDTH) -> Rendered:
    """The page's DOM after its scripts ran in headless Chromium at ``width`` pixels."""
    return Rendered(_run(page, f"--window-size={width},900", "--dump-dom"))


def screenshot(page: Path, out: Path, width: int = WIDTH, height: int = 900) -> Path:
    """A PNG of the page's top ``width`` x ``height`` pixels."""
    out.parent.mkdir(parents=True, exist_ok=True)
    _run(page, f"--window-size={width},{height}", f"--screenshot={Path(out).resolve()}")
    if not out.exists():
        raise ExitbenchError(f"Chromium wrote no screenshot of {page} to {out}")
    return out


def section_screenshot(
    page: Path, heading_id: str, out: Path, width: int = WIDTH, height: int = 1400, margin: int = 8
) -> Path:
    """A PNG of one section: from the heading with that id to the next heading, at most ``height`` pixels
    (and at most :data:`MAX_HEIGHT` from the page's top)."""
    from PIL import Image  # matplotlib's dependency: only this function needs it

    rendered = render(page, width)
    top = rendered.section_top(heading_id)
    if top is None:
        raise ExitbenchError(f"{page} has no heading with id '{heading_id}'")
    start = max(0, top - margin)
    end = min(rendered.next_section_top(heading_id) or start + height, start + height, MAX_HEIGHT)
    screenshot(page, out, width, end + margin)
    with Image.open(out) as whole:
        part = whole.crop((0, start, width, end))
    part.save(out)
    return out
