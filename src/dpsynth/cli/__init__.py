"""The `dpsynth` command line: thin wrappers over the library; user errors print one line."""

from __future__ import annotations

import errno
import signal
import sys

import click
import typer

from dpsynth.cli.audit import audit
from dpsynth.cli.bench import bench
from dpsynth.cli.budget import budget
from dpsynth.cli.datasets import datasets
from dpsynth.cli.evaluate import evaluate
from dpsynth.cli.export import export
from dpsynth.cli.options import options
from dpsynth.cli.party import party_ledger
from dpsynth.cli.report import report
from dpsynth.cli.runs import demo, run
from dpsynth.errors import DpsynthError
from dpsynth.llm.quiet import set_verbose

_typer_app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",  # a docstring's wrapped lines join into one paragraph, as in the source
    help="Differentially private synthetic text from several language models.",
)


def _print_version(value: bool) -> None:
    if value:
        from dpsynth import __version__

        typer.echo(f"dpsynth {__version__}")
        raise typer.Exit()


@_typer_app.callback()
def _main(
    verbose: bool = typer.Option(
        False, "--verbose", "-v",
        help="Keep the model libraries' own output (llama.cpp load logs, transformers progress bars).",
    ),
    show_version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                      help="Print dpsynth's version and exit."),
) -> None:
    """Differentially private synthetic text from several language models."""
    set_verbose(verbose)


_typer_app.command("budget")(budget)
_typer_app.command("run")(run)
_typer_app.command("demo")(demo)
_typer_app.command("eval")(evaluate)
_typer_app.command("bench")(bench)
_typer_app.command("audit")(audit)
_typer_app.command("report")(report)
_typer_app.command("export")(export)
_typer_app.command("options")(options)
_typer_app.command("datasets")(datasets)
_typer_app.command("party-ledger")(party_ledger)


# click 8.2+ raises this for a bare `dpsynth` (it shows the help); older clicks print the help themselves
_NO_ARGS_IS_HELP: type[click.ClickException] | tuple[()] = getattr(click.exceptions, "NoArgsIsHelpError", ())


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def app() -> None:
    """Entry point: user errors become one clear line and exit code 2. SIGTERM (a scheduler's or `kill`'s
    stop) unwinds like Ctrl-C, so cleanup runs: an audit deletes its copy of the private data, a run
    releases its directory (SIGKILL cannot be caught; resuming the audit removes the copy then)."""
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        code = _typer_app(standalone_mode=False)
    except _NO_ARGS_IS_HELP as err:
        err.show()
        sys.exit(err.exit_code)
    except click.ClickException as err:
        typer.echo(f"error: {usage_message(err)}", err=True)
        sys.exit(err.exit_code)
    except click.Abort:
        typer.echo("Aborted.", err=True)
        sys.exit(1)
    except DpsynthError as err:
        typer.echo(f"error: {err}", err=True)
        sys.exit(2)
    except OSError as err:
        message = file_system_message(err)
        if message is None:
            raise
        typer.echo(f"error: {message}", err=True)
        sys.exit(2)
    if isinstance(code, int):
        sys.exit(code)


def usage_message(err: click.ClickException) -> str:
    """Click's own errors (an unknown option or command, a bad or missing value) as one line that says where
    the help is, instead of click's usage line, hint line and framed box."""
    message = err.format_message().replace("\n", " ").strip()
    ctx = getattr(err, "ctx", None)
    if isinstance(err, click.UsageError) and ctx is not None:
        return f"{message} (see `{ctx.command_path} --help`)"
    return message


_FIXES = {
    errno.EACCES: "dpsynth may not write there: choose a folder you can write to (-o for a run, DPSYNTH_CACHE for "
                  "the cache) or fix its permissions",
    errno.EPERM: "dpsynth may not write there: choose a folder you can write to (-o, DPSYNTH_CACHE)",
    errno.EROFS: "the file system is read-only: choose a writable folder (-o for a run, DPSYNTH_CACHE for the cache)",
    errno.ENOTDIR: "part of this path is a file, not a folder: choose another path",
    errno.ENOENT: "this path does not exist and cannot be made here (e.g. a special or missing mount): choose "
                  "another path",
    errno.EISDIR: "this path is a folder where dpsynth needs a file: choose another path",
    errno.EEXIST: "a file is in the way of a folder dpsynth needs: move it or choose another path",
    errno.ENAMETOOLONG: "a name in this path is too long for the file system: choose a shorter one",
    errno.ENOSPC: "the disk is full: free some space, then resume the run (`dpsynth run --resume DIR`)",
    errno.EDQUOT: "the disk quota is used up: free some space, then resume the run (`dpsynth run --resume DIR`)",
}


def file_system_message(err: OSError) -> str | None:
    """One line for a file-system condition the user can fix (permissions, read-only mounts, a file in the
    way, names too long, a full disk), naming the path; None for anything else (a bug stays a traceback)."""
    fix = _FIXES.get(err.errno or -1)
    if fix is None:
        return None
    where = err.filename if err.filename is not None else "a file dpsynth writes"
    return f"{where}: {err.strerror or type(err).__name__}; {fix}"
