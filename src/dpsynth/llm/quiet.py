"""Third-party chatter off by default: llama.cpp's C-level log lines, transformers' and the Hugging Face hub's
progress bars and info logs. `dpsynth --verbose` (or DPSYNTH_VERBOSE=1) keeps them.

The switch is an environment variable so that it reaches every process of a run (Flower simulation
workers too) and is read before transformers or huggingface_hub are imported (both read their
settings at import). A user's own TRANSFORMERS_VERBOSITY / HF_HUB_DISABLE_PROGRESS_BARS always win.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator

VERBOSE_ENV = "DPSYNTH_VERBOSE"
QUIET_ENV = {"HF_HUB_DISABLE_PROGRESS_BARS": "1", "TRANSFORMERS_VERBOSITY": "error",
             "TQDM_DISABLE": "1"}  # e.g. transformers' GGUF de-quantising bar, a bare tqdm


def verbose() -> bool:
    return os.environ.get(VERBOSE_ENV, "").strip().lower() not in ("", "0", "false", "no")


def set_verbose(on: bool) -> None:
    """Called by the CLI before any model library is imported: keep (`on`, or DPSYNTH_VERBOSE=1 already set)
    or silence third-party output."""
    if on:
        os.environ[VERBOSE_ENV] = "1"
    if verbose():
        return
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)


def quiet_transformers() -> None:
    """The same through transformers' own API, for a library that was already imported (unless verbose)."""
    if verbose():
        return
    from transformers.utils import logging as hf_logging

    if "TRANSFORMERS_VERBOSITY" not in os.environ:
        hf_logging.set_verbosity_error()
    if "HF_HUB_DISABLE_PROGRESS_BARS" not in os.environ:
        hf_logging.disable_progress_bar()


@contextlib.contextmanager
def python_stderr_quiet() -> Iterator[None]:
    """Python-level stderr muted while the block runs (unless verbose): for progress bars a library prints
    with a tqdm that was imported before the quiet environment was set (TQDM_DISABLE is read at import)."""
    if verbose():
        yield
        return
    import io

    with contextlib.redirect_stderr(io.StringIO()):
        yield


@contextlib.contextmanager
def c_stderr_captured() -> Iterator[list[str]]:
    """Send the C-level stderr (fd 2) to a temporary file while the block runs (unless verbose).

    The yielded list receives the captured lines when the block ends, so a failure can quote the C
    library's own reason. Python's sys.stderr is flushed first; fd 2 is restored after.
    """
    lines: list[str] = []
    if verbose():
        yield lines
        return
    fd = 2  # where C libraries write, whatever Python's sys.stderr is
    if sys.stderr is not None:
        sys.stderr.flush()
    try:
        saved = os.dup(fd)
    except OSError:  # no stderr at all
        yield lines
        return
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), fd)
        try:
            yield lines
        finally:
            os.dup2(saved, fd)
            os.close(saved)
            sink.seek(0)
            lines.extend(sink.read().decode("utf-8", errors="replace").splitlines())
