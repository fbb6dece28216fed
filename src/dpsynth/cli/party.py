"""`dpsynth party-ledger FILE`: what a deployed data party has spent, read from its own ledger."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import typer

from dpsynth.errors import DpsynthError


def party_ledger(
    path: Path = typer.Argument(..., help="The party's ledger (default location: DATA.privacy-ledger.json, beside "
                                "the data file)."),
    delta: float | None = typer.Option(None, "--delta", help="Report epsilon at this delta (default: the "
                                          "ledger's own)."),
) -> None:
    """Answers the party has given (per release) and the epsilon they spend together, with the RDP cross-check."""
    from dpsynth.privacy.accountant import account
    from dpsynth.privacy.ledger import PrivacyLedger

    if not path.is_file():
        raise DpsynthError(f"{path}: no party ledger here (a party writes it with its first answer)")
    try:
        ledger = PrivacyLedger.load(path)
    except (ValueError, KeyError) as err:
        raise DpsynthError(f"{path}: not a party ledger ({str(err).splitlines()[0]})") from err
    at = ledger.delta if delta is None else delta
    if not 0 < at < 1:
        raise DpsynthError(f"--delta must be in (0, 1) (got {at:g})")
    per_release = Counter(e.name.rsplit("/answer", 1)[0] for e in ledger.events)
    # answers charged under the party's trusted-parties cap carry "(counted T of the M shares claimed)"
    capped = Counter(e.name.rsplit("/answer", 1)[0] for e in ledger.events if "(counted " in e.name)
    for release, answers in per_release.items():
        cap = f" ({capped[release]} charged at fewer shares than the server claimed)" if capped[release] else ""
        typer.echo(f"{release}: {answers} answer{'s' * (answers > 1)}{cap}")
    for name in ledger.non_private_releases:
        typer.echo(f"{name}: WITHOUT NOISE")
    if ledger.non_private_releases:
        typer.echo("epsilon: inf (NOT DP: the party answered without noise)")
        return
    if not ledger.events:
        typer.echo("epsilon: 0 (no answers)")
        return
    spent = account(ledger.events, at, ledger.adjacency)
    typer.echo(f"epsilon: {spent.epsilon:.4f} at delta {at:g} (RDP cross-check {spent.epsilon_rdp:.4f}); "
               f"the party's budget: {ledger.epsilon_budget:g}")
