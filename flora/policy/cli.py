"""``flora policy bench`` and ``flora policy train``."""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path

import typer

from flora.cli_common import JsonOpt, StrictOpt, finish_step, report_output
from flora.policy.recipes import recipe_names

policy_app = typer.Typer(
    help="Flow-matching action expert with training-time RTC.",
    no_args_is_help=True,
    rich_markup_mode=None,
)


class DelayDist(StrEnum):
    """Distribution of training-time RTC delays."""

    exp = "exp"
    uniform = "uniform"


# The shipped recipes, as choices ``--help`` lists.
Recipe = StrEnum("Recipe", {n: n for n in recipe_names()})


@policy_app.command("bench")
def bench(
    quick: bool = typer.Option(False, "--quick", help="Tiny run (CI): mechanics, not numbers."),
    out: Path | None = typer.Option(
        None, "--out", help="Output dir (default <home>/policy_bench)."
    ),
    rollouts: int | None = typer.Option(None, "--rollouts", help="Rollouts per point."),
    docs: bool = typer.Option(
        False, "--docs", help="Also write the plot and table into docs/ (full runs)."
    ),
    seed: int = typer.Option(0, "--seed"),
    threads: int = typer.Option(
        0, "--threads", help="torch CPU threads (0: torch default; 1 is faster on a busy box)."
    ),
    env: str = typer.Option(
        "pursuit", "--env", help="pursuit (home-made sim) or kinetix (needs `make kinetix`)."
    ),
    levels: str | None = typer.Option(
        None,
        "--levels",
        help="Kinetix levels, comma-separated (--env kinetix; default l/grasp_easy).",
    ),
    json_out: JsonOpt = None,
) -> None:
    """Simulated RTC benchmark (synchronous, naive async, inference-time RTC, training-time
    RTC, soft-overlap variant; d = 0..4; 95% Wilson intervals)."""
    if env == "kinetix":
        spec = levels if levels is not None else "l/grasp_easy"
        _kinetix_bench([lv.strip() for lv in spec.split(",") if lv.strip()])
    elif env != "pursuit":
        raise typer.BadParameter(f"unknown env {env!r}", param_hint="--env")
    elif levels is not None:  # it was ignored, and a full pursuit run started instead
        raise typer.BadParameter("levels are Kinetix's: pass --env kinetix", param_hint="--levels")
    with report_output(json_out) as rep:
        rep.emit(_bench(quick, out, rollouts, docs, seed, threads))


def _kinetix_bench(levels: list[str]) -> None:
    """``--env kinetix``: checks the extra and the cached experts, then stops (issue 14: demos,
    BC and the protocol on Kinetix are not wired yet; see docs/policy.md#kinetix)."""
    from flora.policy.bench import check_kinetix_ready
    from flora.settings import get_settings

    try:
        check_kinetix_ready(levels, get_settings().home)
    except (FileNotFoundError, RuntimeError, ValueError) as e:
        raise typer.BadParameter(str(e), param_hint="--levels") from None
    typer.echo(
        "experts found, but demonstrations, BC and the RTC protocol on Kinetix are not "
        "implemented yet (issue 14)",
        err=True,
    )
    raise typer.Exit(2)


def _bench_out(quick: bool) -> Path:
    from flora.settings import get_settings

    return get_settings().home / ("policy_bench_quick" if quick else "policy_bench")


def _bench(
    quick: bool, out: Path | None, rollouts: int | None, docs: bool, seed: int, threads: int
) -> dict:
    from flora.policy.bench import BenchConfig, rate_table, run_bench, write_docs, write_outputs

    cfg = BenchConfig.quick() if quick else BenchConfig()
    cfg.seed = seed
    cfg.threads = threads
    if rollouts is not None:
        cfg.rollouts = rollouts
    out = out or _bench_out(quick)
    results = run_bench(cfg, log=typer.echo)
    paths = write_outputs(results, out)
    typer.echo(rate_table(results))
    wrote = ", ".join(map(str, paths.values()))
    typer.echo(f"total {results['total_seconds']:.0f} s; wrote {wrote}")
    if docs:
        root = Path(__file__).resolve().parents[2]  # the repository (editable install)
        written = write_docs(
            results, root / "docs" / "benchmarks.md", root / "docs" / "img" / "policy_rtc.png"
        )
        # the raw results behind the docs table are committed beside it
        raw = root / "docs" / "results" / "policy_rtc.json"
        raw.parent.mkdir(parents=True, exist_ok=True)
        raw.write_text(json.dumps(results, indent=2))
        written.append(raw)
        typer.echo(f"updated {', '.join(map(str, written))}")
    return results


@policy_app.command("train")
def train(
    ctx: typer.Context,
    dataset: Path | None = typer.Option(
        None,
        "--dataset",
        exists=True,
        help="LeRobot dataset root (default: FLORA_DATASET, the toy world).",
    ),
    out: Path | None = typer.Option(None, "--out", help="Checkpoint dir (default <home>/policy)."),
    events: Path | None = typer.Option(
        None,
        "--events",
        exists=True,
        help="Captions table (Parquet file or table dir). Default: the "
        "engine's captions/events table under <home>/outputs when it has captions.",
    ),
    captions: bool = typer.Option(
        True, "--captions/--no-captions", help="Condition on curated captions when present."
    ),
    epochs: int = typer.Option(20, "--epochs", min=1),
    rtc_epochs: int | None = typer.Option(
        None, "--rtc-epochs", min=0, help="Training-time RTC for the last N epochs (default: all)."
    ),
    horizon: int = typer.Option(16, "--horizon", min=2, help="Chunk length H (>= 2)."),
    max_delay: int = typer.Option(
        5, "--max-delay", min=1, help="Training delays in [0, max_delay); below --horizon."
    ),
    delay_dist: DelayDist = typer.Option(
        DelayDist.exp, "--delay-dist", help="Training delay distribution."
    ),
    hidden: int = typer.Option(128, "--hidden", min=1),
    depth: int = typer.Option(4, "--depth", min=1),
    batch_size: int = typer.Option(256, "--batch-size", min=1),
    lr: float = typer.Option(5e-4, "--lr"),
    image_features: bool = typer.Option(False, "--image-features/--no-image-features"),
    no_mlflow: bool = typer.Option(False, "--no-mlflow", help="Do not log to MLflow."),
    run_id: str | None = typer.Option(None, "--run-id", help="Reopen this MLflow run."),
    seed: int = typer.Option(0, "--seed"),
    recipe: Recipe | None = typer.Option(
        None,
        "--recipe",
        help="Named recipe; explicit options override its fields.",
    ),
    max_steps: int | None = typer.Option(
        None, "--max-steps", min=1, help="Stop after this many optimiser steps (overrides epochs)."
    ),
    json_out: JsonOpt = None,
    strict: StrictOpt = False,
) -> None:
    """Train the DiT action expert with training-time RTC on a LeRobot dataset.

    Episodes that cannot be read are left out and count as failed items (exit 3, or 1
    with --strict); exit 1 when no episode was usable.
    """
    from flora.policy.lerobot import (
        PolicyConfigError,
        PolicyTrainConfig,
        find_caption_table,
        train_policy,
    )
    from flora.policy.recipes import load_recipe
    from flora.settings import get_settings

    try:
        base = load_recipe(recipe.value) if recipe else {}
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--recipe") from None
    # options the user typed (typer ships its own click, so compare the source by name)
    given = {k for k in ctx.params if getattr(ctx.get_parameter_source(k), "name", "") != "DEFAULT"}

    s = get_settings()
    if events is None and captions:
        events = find_caption_table(s.outputs_dir)
        if events is not None:
            typer.echo(f"conditioning on curated captions from {events}")
    if not captions:
        events = None
    options = {
        "epochs": epochs,
        "rtc_epochs": rtc_epochs,
        "horizon": horizon,
        "max_delay": max_delay,
        "delay_dist": delay_dist.value,
        "hidden": hidden,
        "depth": depth,
        "batch_size": batch_size,
        "lr": lr,
        "image_features": image_features,
        "seed": seed,
        "max_steps": max_steps,
    }
    # recipe fields first, then every option the user actually typed
    merged = {**options, **base, **{k: v for k, v in options.items() if k in given}}
    try:  # checked on the merged values: a recipe's horizon can clash with a typed option
        cfg = PolicyTrainConfig(
            dataset=dataset or s.dataset,
            out=out or s.home / "policy",
            events=events,
            mlflow=not no_mlflow,
            run_id=run_id,
            **merged,
        )
    except PolicyConfigError as e:
        raise typer.BadParameter(str(e), param_hint=f"--{e.field.replace('_', '-')}") from None
    except ValueError as e:  # every field comes from an option or the recipe: usage
        raise typer.BadParameter(str(e)) from None
    with report_output(json_out) as rep:
        summary = train_policy(cfg)
        if json_out is None:
            typer.echo(json.dumps(summary, indent=2))
        if summary["failures"]:
            typer.echo(
                f"{len(summary['failures'])} episode(s) left out (see summary.json)", err=True
            )
        finish_step(
            rep,
            summary,
            rows=int(summary.get("episodes", 0)),
            failed=len(summary["failures"]),
            strict=strict,
        )


def register(app: typer.Typer, eval_app: typer.Typer) -> None:
    """Add the ``policy`` command group to the root CLI."""
    app.add_typer(policy_app, name="policy")
