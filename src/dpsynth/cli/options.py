"""`dpsynth options [SECTION]`: what a run config accepts, from the config models (docs/config.md is the same)."""

from __future__ import annotations

import textwrap

import typer


def options(
    section: str | None = typer.Argument(None, help="A config section: data, generators, privacy, augpe, ..."),
) -> None:
    """List a run config's sections, or every option of one with what it accepts, its default and its meaning.

    SECTION: a config section (`data`, `generators`, `privacy`, a method such as `augpe`, or `run` for the top-level
    keys); without it, the sections are listed. docs/config.md holds all of them.
    """
    from dpsynth.runs.options_reference import reference
    from dpsynth.runs.options_reference import section as find_section

    if section is None:
        for s in reference():
            typer.echo(f"{s.name:<12} {textwrap.shorten(s.summary, 100) if s.summary else ''}")
        typer.echo("\n`dpsynth options SECTION` lists a section's options.")
        return
    found = find_section(section)
    typer.echo(f"{found.name}: {found.summary}\n" if found.summary else f"{found.name}:\n")
    for o in found.options:
        typer.echo(f"  {o.key}: {o.kind} = {o.default}")
        typer.echo(textwrap.fill(o.description, width=96, initial_indent="      ", subsequent_indent="      "))
