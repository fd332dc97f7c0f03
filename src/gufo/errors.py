"""Errors that the CLI turns into one line and an exit code (see DESIGN: 1 failed, 2 bad input)."""


class GufoError(Exception):
    """A failure the user can act on; the message is printed as one line."""

    exit_code = 1


class BadInputError(GufoError):
    """Bad file, flag or field: exit code 2."""

    exit_code = 2


class CheckFailedError(GufoError):
    """A check (validation, comparison, allowance) failed: exit code 1."""

    exit_code = 1
