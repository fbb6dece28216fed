"""User-facing errors: the CLI prints their message as one line and exits non-zero."""


class DpsynthError(Exception):
    """A problem the user can fix; the message names the input and the fix."""


def warn_user(message: str) -> None:
    """A setting that runs but may not mean what it seems: one `warning:` line on the terminal (stderr)."""
    import sys

    print(f"warning: {message}", file=sys.stderr)


def require(module: str, extra: str, needed_for: str) -> None:
    """An optional package a setting needs, looked for before anything is spent: a missing one is one line naming
    the extra that installs it (not a traceback after a run has paid for its generations)."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise DpsynthError(f"{needed_for} needs the package '{module}': pip install 'dpsynth[{extra}]'")
