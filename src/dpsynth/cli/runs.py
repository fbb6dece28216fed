"""`dpsynth run` and `dpsynth demo`: execute or resume a run of any method and print what it produced."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from importlib.resources import files
from pathlib import Path

import typer
from rich.console import Console, RenderableType
from rich.measure import Measurement
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from dpsynth.config import RunConfig
from dpsynth.errors import DpsynthError
from dpsynth.runs.config import load_config, parse_config

console = Console(stderr=False)
PIPED_MAX_WIDTH = 400  # a table printed to a file or pipe is as wide as its contents, up to this


def _print_whole(renderable: RenderableType) -> None:
    """Print a table without cutting it. A terminal fits it to its window (cells wrap); a file or pipe has no
    window, and rich's default 80 columns would cut a wide table, so it gets the table's natural width."""
    if console.is_terminal:
        console.print(renderable)
        return
    natural = Measurement.get(console, console.options.update_width(PIPED_MAX_WIDTH), renderable).maximum
    width = console.width
    console.width = max(width, min(natural, PIPED_MAX_WIDTH))
    try:
        console.print(renderable)
    finally:
        console.width = width


def run(
    config: Path | None = typer.Argument(None, help="Run configuration (YAML)."),
    out: Path | None = typer.Option(None, "--out", "-o", help="Run directory (default: runs/ and the start time)."),
    resume: Path | None = typer.Option(None, "--resume", help="Continue the run in this directory."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the privacy plan and the requests, tokens and "
                                 "cost the run will ask for; release nothing, send nothing, write nothing."),
) -> None:
    """Run a method (WASP by default) on your private data, or resume an interrupted run.

    CONFIG: the run config (YAML: data, task, generators, the method's section, privacy; README, "Use it on your
    data"). Not the data file itself: the config's data.private names that."""
    if dry_run:
        if config is None or resume is not None:
            raise DpsynthError("--dry-run plans a new run: give CONFIG (not --resume)")
        dry_run_report(load_config(config))
        return
    if resume is not None:
        if config is not None:
            raise DpsynthError("give either CONFIG or --resume RUN_DIR, not both")
        _execute(None, resume)
        return
    if config is None:
        raise DpsynthError("give a config file (dpsynth run CONFIG.yaml) or --resume RUN_DIR")
    _execute(load_config(config), out or _default_dir())


def demo(
    out: Path | None = typer.Option(None, "--out", "-o", help="Run directory (default: runs/demo, with --wasp "
                                    "runs/demo-wasp)."),
    n: int | None = typer.Option(None, "--n", help="Override the number of synthetic samples."),
    wasp: bool = typer.Option(False, "--wasp", help="Run WASP on Rotten Tomatoes instead (M=100, eps=4)."),
) -> None:
    """The demo: zero-shot SMS messages from two local PLMs, labels corrected by one DP release (eps=4).

    Two local PLMs write SMS messages zero-shot and one DP release of 100 private messages corrects their labels;
    prints the gain over the same texts without the private data. --wasp: WASP on Rotten Tomatoes instead."""
    import yaml

    raw = yaml.safe_load(files("dpsynth.configs").joinpath("demo_wasp.yaml" if wasp else "demo.yaml").read_text())
    if n is not None:
        raw[raw.get("method", "wasp")]["n"] = n
    config = parse_config(raw, "demo config")
    from dpsynth.fs import RunDir
    from dpsynth.runs.engine import holds_a_run

    out = out or Path("runs/demo-wasp" if wasp else "runs/demo")
    if holds_a_run(out):
        # a resume runs the saved config: one of other settings (the other demo, another --n) would be run instead
        saved = load_config(RunDir(out).config, other_methods="drop")
        if saved.model_dump(mode="json") != config.model_dump(mode="json"):
            raise DpsynthError(f"{out} holds an earlier run of other settings (the other demo, or another --n): "
                               "give another --out, or delete it")
        console.print(f"[yellow]{out} holds an earlier demo run: resuming it[/yellow]")
        _execute(None, out)
    else:
        _execute(config, out)


def _default_dir() -> Path:
    return Path("runs") / datetime.now().strftime("%Y%m%d-%H%M%S")


def _execute(config: RunConfig | None, run_dir: Path) -> None:
    from dpsynth.runs.engine import Run

    with progress_bars() as (progress, report):
        runner = Run.resume(run_dir, progress=report) if config is None else Run.create(
            config, run_dir, progress=report
        )
        console.print(f"run directory: {run_dir}")
        try:
            result = runner.execute()
        except KeyboardInterrupt:
            progress.stop()
            typer.echo(
                f"interrupted: finished iterations and every generation are saved; "
                f"continue with `dpsynth run --resume {run_dir}`",
                err=True,
            )
            raise typer.Exit(130) from None
    try:
        _print_summary(run_dir, result)
    except KeyboardInterrupt:
        typer.echo(f"interrupted while printing the summary; the run had finished: its outputs are in {run_dir}",
                   err=True)
        raise typer.Exit(130) from None


@contextmanager
def progress_bars() -> Iterator[tuple[Progress, Callable[[str, int, int], None]]]:
    """One bar per phase of a run; the callback is the engine's `progress`. The bars appear with the first report:
    an error found before it (a bad config, a model that cannot be had) stays the one line on the terminal."""
    progress = Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console,
        transient=False,
    )
    tasks: dict[str, TaskID] = {}

    def report(what: str, done: int, total: int) -> None:
        if not tasks:
            progress.start()
        # "phase: details" updates one bar per phase (e.g. the DP training's epsilon so far)
        phase = what.split(": ", 1)[0] if what.startswith("DP ") else what
        if phase not in tasks:
            tasks[phase] = progress.add_task(what, total=total)
        progress.update(tasks[phase], completed=done, total=max(total, done), description=what)

    try:
        yield progress, report
    finally:
        if tasks:
            progress.stop()


def _print_summary(run_dir: Path, result: dict) -> None:
    metrics = result["metrics"]
    console.rule(f"dpsynth: {metrics['method']} run finished")
    console.print(f"outputs: {run_dir}/synthetic.jsonl (and .parquet), README.md (the dataset card), privacy.json, "
                  "metrics.json, run.log, checkpoints/")
    console.print("[bold]privacy[/bold]")
    for line in result["summary"]:
        console.print(f"  {line}")
    table = Table(title="samples and weights per PLM per iteration")
    table.add_column("iteration", overflow="fold")
    plms = list(metrics["samples_per_plm"])
    for k in plms:
        table.add_column(f"{k}: kept (dropped) / weight", overflow="fold")
    for it in [i for i in metrics["iterations"] if "generated" in i]:
        row = [str(it["iteration"])]
        for k in plms:
            g = it["generated"].get(k, {"kept": 0, "dropped": {}})
            weight = it.get("weights_used", {}).get(k)  # only WASP weights its PLMs
            row.append(f"{g['kept']} ({sum(g['dropped'].values())})" + (f" / {weight:.3f}" if weight else ""))
        table.add_row(*row)
    _print_whole(table)
    for line in signal_lines(metrics["iterations"]):
        console.print(line)
    for line in resample_lines(metrics["iterations"]):
        console.print(line)
    for line in relabel_lines(metrics["iterations"]):
        console.print(line)
    for k, u in metrics["usage"].items():
        cost = f", cost {u['cost']:.4f}" if u.get("cost") is not None else ""
        console.print(
            f"  {k}: {metrics['samples_per_plm'][k]} samples; {u['prompt_tokens']} prompt + "
            f"{u['completion_tokens']} completion tokens; {u['cached']} of {u['requests']} requests from cache{cost}"
        )
    ev = metrics.get("evaluation")
    if ev:
        console.print(f"[bold]downstream accuracy on the real test split[/bold] ({ev['classifier']}):")
        titles = {"zero_shot": "zero-shot (iteration 0, no private data)",
                  "before_resampling": "before resampling (the method's own final set)",
                  "before_relabelling": "before relabelling (the same texts, the labels they were asked for)",
                  "stage3": "stage 3 alone (every candidate of the fine-tuned model, before refinement)",
                  "stage3_uniform": "a uniform draw from stage 3 of the refined set's size (refinement's control)"}
        stages = [name for name in ("relabel", "resample") if any(name in it for it in metrics["iterations"])]
        titles[metrics["method"]] = f"the final set ({' + '.join([metrics['method'], *stages])})"
        for key in [k for k in ev if k != "classifier"]:
            s, title = ev[key], titles.get(key, f"{key} (all iterations)")
            console.print(f"  {title}: accuracy {s['accuracy']:.4f}, macro-F1 {s['macro_f1']:.4f} "
                          f"(trained on {s['train_size']}, tested on {s['test_size']})")
        for line in gain_lines(run_dir, metrics["method"], ev):
            console.print(line)
    fed = metrics.get("federated")
    if fed:
        console.print(
            f"federated: {fed['parties']} parties ({fed['aggregation']}, {fed['partition']}), sigma per party "
            f"{fed['sigma_per_party']:.4f}; per party {fed['download_bytes_per_party'] / 1e3:.1f} kB down, "
            f"{fed['upload_bytes_per_party'] / 1e3:.1f} kB up; aggregation {fed['aggregation_seconds']:.1f}s "
            f"over {len(fed['rounds'])} rounds")
        for kind, g in (fed.get("by_round_kind") or {}).items():
            per_party = g["download_bytes_per_party"] / 1e3
            console.print(f"  {kind} rounds: {g['rounds']}; per asked party {per_party:.1f} kB "
                          f"down, {g['upload_bytes_per_party'] / 1e3:.1f} kB up")
    t = metrics["timings"]
    share = 1 - t["generator_calls"] / t["wall"] if t["wall"] else 0.0
    console.print(f"wall time {t['wall']:.1f}s; generator calls {t['generator_calls']:.1f}s "
                  f"({share:.1%} of the time outside generator calls)")


# the reference set a run's final set is paired with: what the same run would have released without its last step
GAIN_REFERENCES = {"before_relabelling": "the same texts with the labels they were asked for (no private data)",
                   "zero_shot": "the zero-shot samples of iteration 0 (no private data)"}


def gain_lines(run_dir: Path, method: str, evaluation: dict) -> list[str]:
    """The final set's macro-F1 gain over the run's own no-private-data reference, paired by test example, with a
    95% interval over the test examples (one run, one seed: it covers test-set sampling only; the seed-to-seed
    spread needs a bench)."""
    from dpsynth.bench.stats import paired_f1_difference
    from dpsynth.data.public import load_test

    key = next((k for k in GAIN_REFERENCES if k in evaluation), None)
    final = evaluation.get(method)
    if key is None or final is None or "predicted" not in final:
        return []
    test = load_test(load_config(run_dir / "config.yaml", other_methods="drop"))
    if test is None:
        return []
    d = paired_f1_difference({0: final["predicted"]}, {0: evaluation[key]["predicted"]}, list(test.labels),
                             draws=1000)
    return [f"[bold]gain from the private data[/bold]: macro-F1 {100 * d['difference']:+.2f} points "
            f"[{100 * d['low']:+.2f}, {100 * d['high']:+.2f}] over {GAIN_REFERENCES[key]}",
            "  (95% interval over the test examples of this one run; the spread over seeds needs a bench: "
            "docs/results.md)"]


def relabel_lines(iterations: list[dict]) -> list[str]:
    """The label-correction stage: how many samples moved where, and how much each label trusted its private
    centroid (blend scoring)."""
    stage = next((it["relabel"] for it in iterations if "relabel" in it), None)
    if stage is None:
        return []
    moved = ", ".join(f"{n} to {label}" for label, n in stage["moved_to"].items())
    line = (f"[bold]label correction[/bold] ({stage['scoring']}): {stage['moved']} of {stage['samples']} samples "
            f"moved ({moved})")
    shares = stage.get("private_reliability")
    if shares:
        line += "; share of each label's score from its noisy private centroid: " + ", ".join(
            f"{label} {a:.2f}" for label, a in shares.items())
    return [line]


def resample_lines(iterations: list[dict]) -> list[str]:
    """The resampling stage: what it kept, and the paper's rule for K read from the noisy histogram."""
    stage = next((it["resample"] for it in iterations if "resample" in it), None)
    if stage is None:
        return []
    line = (f"[bold]resampling[/bold]: {stage['kept']} of {stage['before']} samples over {stage['bins']} "
            f"(label, cluster) bins, {stage['duplicated']} drawn twice")
    ratio = stage.get("votes_per_bin_over_noise")
    if ratio is None:
        return [line]
    advice = (f"; about {ratio:.1f} noise scales of votes per bin (noisy estimate)" +
              (f": below 3, the histogram is mostly noise; use clusters <= {stage['suggested_clusters']}"
               if ratio < 3 else ""))
    return [line + advice]


def signal_lines(iterations: list[dict]) -> list[str]:
    """Per release: how much of it stands out of its noise, and plain advice when it is mostly noise."""
    lines, weak = [], False
    for it in iterations:
        for name, d in (it.get("releases") or {}).items():
            if d.get("above_3_noise") is None:
                continue
            lines.append(f"  {name}: {d['entries']} entries, {100 * d['above_3_noise']:.1f}% above 3 noise scales, "
                         f"largest {d['max_over_noise']:.1f} noise scales")
            weak |= d["above_3_noise"] < 0.02 and d["entries"] > 20
    if not lines:
        return []
    head = ["[bold]signal to noise of the private releases[/bold] (from noisy values only; pure noise gives ~0.1%):"]
    if weak:
        lines.append("  most entries are noise: use fewer candidates per release (smaller N per iteration), more "
                     "private records, a larger epsilon, or votes summed over clusters of candidates")
    return head + lines


def dry_run_report(config: RunConfig) -> None:
    """The privacy plan (as `budget --config`), then per generator the requests and an upper bound on tokens
    and cost: completions at max_tokens, prompts at the method's longest (the n_ctx check's bound)."""
    from dpsynth.cli.budget import print_plan
    from dpsynth.data.public import task_for
    from dpsynth.runs.build import check_before_start
    from dpsynth.runs.planning import plan_privacy

    plan = plan_privacy(config)
    check_before_start(plan)  # the data and task problems a run would meet: still nothing released or sent
    typer.echo("dry run: nothing is released, no request is sent, no directory is made")
    print_plan(plan, None)
    method = plan.method
    labels = len(task_for(config).labels)
    try:
        total = method.planned_requests(labels)
    except NotImplementedError as err:
        typer.echo(f"requests: not estimated ({err})")
        return
    max_tokens = int(getattr(config.options(), "max_tokens", 64))
    prompt = max(method.context_tokens(config) - max_tokens, 1)
    k = len(config.generators)
    typer.echo(f"generator requests: {total} in all (before re-asks of dropped or duplicate samples; the token and "
               "cost bounds below are for these)"
               + ("; split equally here" + (f", {method.name}'s weights move them between PLMs as it runs"
                                             if method.reweights_plms else "") if k > 1 else ""))
    for g in config.generators:
        n = -(-total // k)
        line = (f"  {g.display_name} ({g.kind}: {g.model}): about {n} requests; at most {n * prompt} prompt + "
                f"{n * max_tokens} completion tokens")
        if g.price_per_prompt_token is not None or g.price_per_completion_token is not None:
            cost = n * (prompt * (g.price_per_prompt_token or 0.0) + max_tokens * (g.price_per_completion_token or 0.0))
            line += f"; cost at most {cost:.4g}"
        caps = [f"{name} {value:g}" for name, value in (("max_requests", g.max_requests), ("max_total_tokens",
                g.max_total_tokens), ("max_cost", g.max_cost)) if value is not None]
        if caps:
            line += f" (caps: {', '.join(caps)})"
        typer.echo(line)
