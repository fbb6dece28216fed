"""`dpsynth options [SECTION]`: what a run or bench config accepts, from the config models; docs/config.md is the
same reference (`dpsynth options --markdown > docs/config.md` rewrites it)."""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from dpsynth.runs.options_reference import SectionReference

TITLE = "Config reference"
INTRO = ("Every option a run config (`dpsynth run`) and a bench config (`dpsynth bench`) accept, generated from the "
         "config models: `dpsynth options [SECTION]` prints the same, and `dpsynth options --markdown > "
         "docs/config.md` rewrites this file. README, \"Use it on your data\", shows a whole run config and "
         "configs/bench_*.yaml whole bench configs; a method's page in docs/ says why its defaults are what they are.")


def all_sections() -> list[SectionReference]:
    """The run config's sections, then the bench config's."""
    from dpsynth.bench.options import bench_reference
    from dpsynth.runs.options_reference import reference

    return reference() + bench_reference()


def options(
    section: str | None = typer.Argument(None, help="A config section: data, generators, privacy, augpe, ..."),
    as_markdown: bool = typer.Option(False, "--markdown", help="Print every section as docs/config.md has them."),
) -> None:
    """List the config sections, or every option of one with what it accepts, its default and its meaning.

    SECTION: a run config section (`data`, `generators`, `privacy`, a method such as `augpe`, or `run` for the
    top-level keys) or a bench config's (`bench`, `bench.variants`); without it, the sections are listed.
    docs/config.md holds all of them.
    """
    from dpsynth.runs.options_reference import markdown
    from dpsynth.runs.options_reference import section as find_section

    sections = all_sections()
    if as_markdown:
        typer.echo(markdown(sections, TITLE, INTRO))
        return
    if section is None:
        for s in sections:
            typer.echo(f"{s.name:<15} {textwrap.shorten(s.summary, 100)}")
        typer.echo("\n`dpsynth options SECTION` lists a section's options.")
        return
    found = find_section(section, sections)
    typer.echo(f"{found.name}: {found.summary}\n")
    for o in found.options:
        typer.echo(f"  {o.key}: {o.kind} = {o.default}")
        typer.echo(textwrap.fill(o.description, width=96, initial_indent="      ", subsequent_indent="      "))
