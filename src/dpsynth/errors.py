"""User-facing errors: the CLI prints their message as one line and exits non-zero."""


class DpsynthError(Exception):
    """A problem the user can fix; the message names the input and the fix."""


def warn_user(message: str) -> None:
    """A setting that runs but may not mean what it seems: one `warning:` line on the terminal (stderr)."""
    import sys

    print(f"warning: {message}", file=sys.stderr)
