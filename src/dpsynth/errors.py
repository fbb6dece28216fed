"""User-facing errors: the CLI prints their message as one line and exits non-zero."""


class DpsynthError(Exception):
    """A problem the user can fix; the message names the input and the fix."""
