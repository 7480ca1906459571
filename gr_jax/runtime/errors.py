"""The base of the library's expected failures (bad configuration, data or files; training that cannot go on).
Entry points turn any `UserError` — and `ValueError` / `OSError` — into one message and exit code 2, with no
traceback; the message itself says what to change."""

from __future__ import annotations


class UserError(Exception):
    """A failure caused by the input or the environment, not by a bug; its message names the fix."""
