"""What every stage entry point shares: one-line errors instead of tracebacks, and thread settings."""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch

from exitbench.errors import ExitbenchError


def run_stage(main: Callable[[], None]) -> None:
    """Run a stage's ``main``; a user-fixable :class:`ExitbenchError` becomes one line and exit code 2."""
    try:
        main()
    except ExitbenchError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    except KeyboardInterrupt:
        print("interrupted: partial results are kept; re-run the stage to resume", file=sys.stderr)
        raise SystemExit(130) from None


def set_threads(threads: int) -> int:
    """Set torch's intra-op threads (0 = leave torch's default, all cores); return the count in use."""
    if threads > 0:
        torch.set_num_threads(threads)
    return torch.get_num_threads()
