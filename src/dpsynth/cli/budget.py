"""`dpsynth budget`: plan a run's privacy before spending anything.

It builds the run's plan with the same code as `dpsynth run` (`dpsynth.runs.planning`): the
method's releases, the DP label histogram and the SecAgg+ delta reserve, so the epsilon it
prints is the one the finished run reports. Give a whole run config (`--config run.yaml`),
or a method name with the flags below; `--option key=value` sets any other method option.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import typer
from click.core import ParameterSource

from dpsynth.errors import DpsynthError
from dpsynth.methods.registry import method_class, method_names
from dpsynth.privacy.accountant import Adjacency, epsilon_tight, primary_accountant, scope_groups
from dpsynth.runs.config import load_config
from dpsynth.runs.planning import PrivacyPlan, plan_for_method, plan_privacy


def budget(
    ctx: typer.Context,
    method: str | None = typer.Argument(None, help="A method (wasp, augpe, ...); or give --config."),
    config: str | None = typer.Option(None, "--config", help="Plan exactly this run config."),
    epsilon: float | None = typer.Option(None, "--epsilon", help="Target epsilon: prints the noise to use."),
    sigma: float | None = typer.Option(None, "--sigma", help="Vote noise per release: prints the epsilon."),
    delta: float = typer.Option(1e-5, "--delta"),
    iterations: int | None = typer.Option(None, "--iterations", "-T",
                                             help="All iterations, including zero-shot iteration 0."),
    q: int | None = typer.Option(None, "--q", help="WASP's Top-Q."),
    option: list[str] = typer.Option([], "--option", help="Any method option as key=value (repeatable)."),
    label_proportions: str | None = typer.Option(None, "--label-proportions", help="uniform or dp."),
    max_records_per_user: int = typer.Option(
        1, "--max-records-per-user", help="Person-level DP: records one person may contribute (a run needs "
        "data.person_column)."),
    parties: int = typer.Option(1, "--parties", help="Federated: number of data parties (secure aggregation)."),
    min_parties: int | None = typer.Option(None, "--min-parties", help="Fewest parties a round may finish with."),
    adjacency: Adjacency = typer.Option(Adjacency.ADD_REMOVE, "--adjacency"),
    resample_sigma: float | None = typer.Option(None, "--resample-sigma",
                                                   help="Add a resampling stage with this histogram sigma."),
    resample_share: float | None = typer.Option(None, "--resample-share",
                                                   help="Add a resampling stage with this share of epsilon."),
    relabel_sigma: float | None = typer.Option(None, "--relabel-sigma",
                                                  help="Add a DP label-correction stage with this sigma on its sums."),
    relabel_share: float | None = typer.Option(None, "--relabel-share",
                                                  help="Add a DP label-correction stage with this share of epsilon."),
) -> None:
    """Calibrate the noise for a target epsilon, or compute the epsilon of a vote sigma.

    METHOD: augpe, dpft, dpga, fedgen, fusegen, popri, wasp or zero-shot (with its options below); or give
    --config RUN.yaml to plan exactly that run."""
    if config is not None:
        given = [_flag(ctx, name) for name in ctx.params if name != "config" and
                 ctx.get_parameter_source(name) not in (ParameterSource.DEFAULT, None)]
        if given:  # before: ignored silently, and the config's plan printed as if they had been applied
            raise DpsynthError(f"with --config the budget comes from the config's privacy section and the run from "
                               f"the config: drop {', '.join(given)}")
        print_plan(plan_privacy(load_config(Path(config))), None)
        return
    if method is None:
        raise DpsynthError(f"give a method ({', '.join(method_names())}) or --config RUN.yaml")
    method_class(method)  # one-line error for an unknown name
    if (epsilon is None) == (sigma is None):
        raise DpsynthError("give exactly one of --epsilon (to get the noise) or --sigma (to get epsilon)")
    for flag, value in (("--epsilon", epsilon), ("--sigma", sigma)):
        # not NaN either: a NaN sigma would print zero privacy loss
        if value is not None and not value > 0:
            raise DpsynthError(f"{flag} must be > 0 (got {value})")
    if parties < 1:
        raise DpsynthError(f"--parties must be at least 1 (got {parties})")
    options: dict = {}
    if iterations is not None:
        options["iterations"] = iterations
    if q is not None:
        options["q"] = q
    for item in option:
        key, sep, raw = item.partition("=")
        if not sep:
            raise DpsynthError(f"--option {item}: use key=value")
        options[key.strip()] = raw.strip()
    plan = plan_for_method(method, epsilon=epsilon if epsilon is not None else math.inf, delta=delta,
                           options=options, adjacency=adjacency.value, max_records_per_user=max_records_per_user,
                           label_proportions=label_proportions, parties=parties, min_parties=min_parties,
                           resample=_stage(resample_sigma, resample_share),
                           relabel=_stage(relabel_sigma, relabel_share))
    print_plan(plan, sigma)


def _flag(ctx: typer.Context, name: str) -> str:
    """How the user wrote parameter `name`: its first option string, or its name in capitals for an argument."""
    param = next(p for p in ctx.command.params if p.name == name)
    return param.opts[0] if param.opts and param.opts[0].startswith("-") else name.upper()


def _stage(sigma: float | None, share: float | None) -> dict | None:
    """A final stage's noise setting from its two flags (None: no such stage)."""
    if sigma is None and share is None:
        return None
    return {k: v for k, v in (("sigma", sigma), ("share", share)) if v is not None}


def print_plan(plan: PrivacyPlan, vote_sigma: float | None) -> None:
    cfg = plan.config
    schedule = plan.schedule
    typer.echo(f"method: {plan.method.name}; {len(schedule.releases)} noisy releases: "
               f"{_names(schedule)}")
    typer.echo(f"unit of privacy: {plan.assumptions().unit}; adjacency {cfg.privacy.adjacency.value}")
    if schedule.is_empty:
        typer.echo("this configuration releases nothing private: epsilon 0")
        return
    start = time.perf_counter()
    knobs = plan.calibrate() if vote_sigma is None else _with_sigma(plan, vote_sigma)
    took = time.perf_counter() - start
    description = plan.describe(knobs)
    given = None if vote_sigma is None else next(k.name for k in schedule.knobs if k.free)
    for k in description["knobs"]:
        sens = (f", {k.get('sensitivity_label', 'sensitivity')} {k['sensitivity']:.5f}"
                if k["sensitivity"] is not None else "")
        how = "given: --sigma" if k["name"] == given else k["how"]  # the user's own value, not calibrated
        typer.echo(f"{k['name']}: {k['value']:.4f} on {k['releases']} release(s){sens} [{how}] - "
                   f"{k['description']}")
    if vote_sigma is None:
        typer.echo(f"  (calibrated by bisection on the accountant in {took:.2g} s)")
    paper = description.get("paper_formula")
    if paper:
        ratio = paper["value"] / knobs[paper["knob"]]
        typer.echo(f"paper's {paper['knob']}: {paper['value']:.3f} [{paper['description']}]")
        typer.echo(f"  true epsilon at the paper's value: {paper['epsilon_of_paper_value']:.3f}; "
                   f"paper / tight = {ratio:.2f}x")
    spent = plan.epsilon_of(knobs)
    rdp = plan.epsilon_rdp_of(knobs) if all(v > 0 for v in knobs.values()) else None  # not of a part of the run
    events = plan.schedule.events(knobs) if all(v > 0 for v in knobs.values()) else []
    accountant = primary_accountant(events, short=True) if events else "PLD"
    reserve = cfg.privacy.delta - plan.accounting_delta
    typer.echo(f"epsilon spent: {spent:.4f} at delta={cfg.privacy.delta:g}"
               + (f" (accountant delta {plan.accounting_delta:g} + SecAgg+ clipping reserve {reserve:.3g})"
                  if reserve else "")
               + (f" ({accountant}; RDP cross-check {rdp:.4f})" if rdp is not None else f" ({accountant})"))
    groups = scope_groups(events) if events else {}
    if len(groups) > 1:
        per_group = ", ".join(f"{name} {epsilon_tight(events, plan.accounting_delta, cfg.privacy.adjacency):.4f}"
                              for name, events in groups.items())
        typer.echo(f"  per group of records: {per_group} (disjoint groups compose in parallel: each sees the "
                   "releases of all records and its own)")
    parties, fewest = plan.parties
    if parties > 1:
        shares: dict[str, float] = {}
        for row in description["knobs"]:
            if not row["releases"] or row["party_value"] is None:
                continue
            shares[row["name"]] = row["party_value"]
            how = ("the full noise (local DP-SGD)" if row["party_value"] == row["value"] > 0 else
                   "its share; the sum carries the full noise when enough parties answer")
            typer.echo(f"federated: each party adds {row['name']} {row['party_value']:.3f}, {how}")
        typer.echo(f"  (shares sized for {fewest} surviving parties of {parties}); shares are private only under "
                   f"secure aggregation: a server seeing single parties' vectors gets epsilon "
                   f"{plan.epsilon_of({**knobs, **shares}):.3f}")


def _with_sigma(plan: PrivacyPlan, sigma: float) -> dict[str, float]:
    """The knobs with `sigma` on the plan's one calibrated knob. A plan with another knob to size (a share of
    epsilon, a second calibrated knob) has no epsilon to size it from here: refused (its knobs came out 0 and the
    epsilon printed was inf, beside an RDP figure of the other releases alone)."""
    free = [k.name for k in plan.schedule.knobs if k.free]
    shared = [k.name for k in plan.schedule.knobs if k.share is not None]
    if not free:
        raise DpsynthError("--sigma needs a schedule with a calibrated noise knob")
    if shared or len(free) > 1:
        others = ", ".join(free[1:] + shared)
        raise DpsynthError(f"--sigma sets {free[0]} only, and this plan also sizes {others} from epsilon: give "
                           "--epsilon instead, or plan a run config whose noise is all fixed with --config")
    return plan.calibrate() | {free[0]: sigma}


def _names(schedule) -> str:
    counts: dict[str, int] = {}
    for r in schedule.releases:
        counts[r.kind] = counts.get(r.kind, 0) + 1
    return ", ".join(f"{k} x{n}" for k, n in counts.items())
