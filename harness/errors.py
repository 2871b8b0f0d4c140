"""User-facing errors: one paragraph, exit code 2, no traceback unless --debug.

raise UserError("configs/x.yaml: teachers[0].path: 'foo' does not exist; give a local path.")
"""

from __future__ import annotations

import signal
from typing import Any


class UserError(Exception):
    """Bad input the user can fix: the message says which file, row or field, and what to do."""

    exit_code = 2


class LockedError(UserError):
    """Another cotgap process holds the results directory."""


class Interrupted(BaseException):
    """SIGINT or SIGTERM reached cotgap. A BaseException, like KeyboardInterrupt, so no `except
    Exception` stops it on its way out (locks are released, children stopped, on the way); unlike
    KeyboardInterrupt, the command-line framework does not turn it into a return value."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def stop_on_signals() -> None:
    """From now on SIGINT and SIGTERM raise `Interrupted`, once: the first signal starts the stop,
    and the ones after it do nothing. Ctrl-C reaches a whole process group and cotgap then
    SIGTERMs its workers, so a worker often gets both; a second interrupt raised inside the
    clean-up of the first, or in an atexit finaliser as the interpreter exits, would cut the
    clean-up short and print a traceback for a stop that went well. A process that hangs after
    the first signal is still stopped: its parent SIGKILLs what outlives a grace period."""
    _STOPPING.clear()
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)


_STOPPING: set[int] = set()  # the signal that started the stop, once one has


def _interrupt(signum: int, frame: Any) -> None:
    # The handler stays installed and ignores the later signals itself: switching to SIG_IGN here
    # makes CPython report a signal already pending ("Signal 15 ignored due to race condition")
    # with a traceback, the very thing this avoids.
    if _STOPPING:
        return
    _STOPPING.add(signum)
    raise Interrupted(signum)
