"""One exception type for every user-facing failure: a single line naming the problem and the fix."""

from __future__ import annotations


class ExitbenchError(Exception):
    """A problem the user can fix (bad config, missing data or checkpoint, malformed row).

    Pipeline entry points catch it and print its message as one line, with no traceback.
    """
