"""User-facing errors: one paragraph, exit code 2, no traceback unless --debug.

raise UserError("configs/x.yaml: teachers[0].path: 'foo' does not exist; give a local path.")
"""

from __future__ import annotations


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
