"""``flora reward outcome|dense|rubric`` and ``flora eval reward``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from flora.cli_common import parse_episodes, print_metrics


def _backend(model: Path | None, oracle_root: Path | None):
    """Backend from ``--model`` (in-process transformers), ``--oracle``, or settings."""
    if oracle_root is not None:
        from flora.reward.oracle import GroundTruthRewardBackend

        return GroundTruthRewardBackend(oracle_root)
    if model is not None:
        from flora.backends.transformers_backend import TransformersBackend
        from flora.settings import get_settings

        return TransformersBackend(model, device=get_settings().device)
    from flora.backends import make_backend

    b = make_backend()
    if b is None:
        raise typer.BadParameter(
            "the rewarder needs a VLM backend: pass --model DIR or set FLORA_BACKEND="
            "transformers|openai (the kinematic baseline has no rewarder)"
        )
    return b


def _out(out: Path | None) -> Path:
    from flora.settings import get_settings

    return out or get_settings().outputs_dir


def _report(res) -> None:
    from rich.console import Console

    c = Console()
    s = res.summary()
    c.print(f"[bold]{s['table']}[/bold]: {s['written']} episodes written, {s['skipped']} "
            f"skipped, {s['failures']} failures, {s['rows']} rows, valid={s['valid']} "
            f"-> {res.root / s['table']}")  # fmt: skip
    for f in res.failures[:20]:
        c.print(f"  [red]FAILED[/red] {f.episode_id} {f.item}: {f.reason}")
    if len(res.failures) > 20:
        c.print(f"  … {len(res.failures) - 20} more in {res.root / s['table'] / '_failures'}")


def _finish(res) -> None:
    """Print a step's result; exit 1 when its table failed validation."""
    _report(res)
    raise typer.Exit(0 if res.validation is None or res.validation.success else 1)


DatasetArg = Annotated[Path, typer.Argument(help="Dataset root (LeRobot v3.0/v2.1, mp4 folder).")]
OutOpt = Annotated[Path | None, typer.Option(help="Table root (default: FLORA_HOME/outputs).")]
ModelOpt = Annotated[
    Path | None, typer.Option(help="Local VLM checkpoint (else FLORA_BACKEND settings).")
]
EpisodesOpt = Annotated[str | None, typer.Option(help="Comma-separated episode indices.")]
AttemptsOpt = Annotated[int, typer.Option(help="Bounded attempts per item.")]


def register(app: typer.Typer, eval_app: typer.Typer) -> None:
    """Add ``flora reward …`` to ``app`` and ``flora eval reward`` to ``eval_app``."""
    reward_app = typer.Typer(help="Outcome, dense and rubric rewards from one rewarder.",
                             no_args_is_help=True)  # fmt: skip
    app.add_typer(reward_app, name="reward")

    def add_mode(mode: str, doc: str) -> None:
        # outcome and dense take the same options; one command body serves both.
        def cmd(
            dataset: DatasetArg,
            out: OutOpt = None,
            model: ModelOpt = None,
            episodes: EpisodesOpt = None,
            max_attempts: AttemptsOpt = 3,
        ) -> None:
            from flora.reward.run import reward_dataset

            _finish(reward_dataset(mode, dataset, _backend(model, None), _out(out),
                                   episodes=parse_episodes(episodes),
                                   max_attempts=max_attempts))  # fmt: skip

        cmd.__doc__ = doc
        reward_app.command(mode)(cmd)

    add_mode("outcome", "Outcome rewards (table ``outcome``).")
    add_mode("dense", "Dense labels per 0.5 s group (table ``dense_labels``).")

    @reward_app.command("rubric")
    def rubric_cmd(
        dataset: DatasetArg,
        rubric: Annotated[Path, typer.Option(help="Rubric YAML/JSON (maxima sum to 1).")],
        out: OutOpt = None,
        model: ModelOpt = None,
        episodes: EpisodesOpt = None,
        max_attempts: AttemptsOpt = 3,
    ) -> None:
        """Rubric rewards for one user rubric (table ``rubric``)."""
        from flora.reward.rubric import RubricError, load_rubric
        from flora.reward.run import rubric_dataset

        try:
            rub = load_rubric(rubric)
        except RubricError as e:
            raise typer.BadParameter(str(e), param_hint="--rubric") from e
        _finish(rubric_dataset(dataset, _backend(model, None), _out(out), rub,
                               episodes=parse_episodes(episodes),
                               max_attempts=max_attempts))  # fmt: skip

    @eval_app.command("reward")
    def eval_reward(
        dataset: DatasetArg,
        out: OutOpt = None,
        model: ModelOpt = None,
        oracle: Annotated[
            bool, typer.Option(help="Answer from ground truth (upper bound).")
        ] = False,
        modes: Annotated[str, typer.Option(help="Comma-separated: outcome,dense,rubric.")] = (
            "outcome,dense,rubric"
        ),
        episodes: EpisodesOpt = None,
        max_attempts: AttemptsOpt = 3,
        track: Annotated[bool, typer.Option(help="Log to MLflow.")] = True,
    ) -> None:
        """Score the rewarder: toy-world ground truth, or a RoboRewardBench-layout folder."""
        from rich.console import Console

        from flora.reward.benchmark import (
            is_roborewardbench,
            log_benchmark,
            run_roborewardbench,
            run_toy_benchmark,
        )

        rrb = is_roborewardbench(dataset)
        if oracle and rrb:
            raise typer.BadParameter("--oracle needs a toy-world dataset with ground_truth/")
        backend = _backend(model, dataset if oracle else None)
        root = _out(out) / "eval_reward"
        if rrb:
            result = run_roborewardbench(dataset, backend, root, max_attempts=max_attempts)
        else:
            result = run_toy_benchmark(
                dataset, backend, root, modes=[m.strip() for m in modes.split(",") if m.strip()],
                episodes=parse_episodes(episodes), max_attempts=max_attempts,
            )  # fmt: skip
        print_metrics(f"flora eval reward — {dataset.name} ({getattr(backend, 'name', '')})",
                      result.metrics)  # fmt: skip
        for res in result.steps.values():
            _report(res)
        if track:
            params = {"dataset": str(dataset), "backend": getattr(backend, "name", ""),
                      "model_version": getattr(backend, "model_version", ""),
                      "layout": "roborewardbench" if rrb else "toy_world", "modes": modes,
                      "max_attempts": max_attempts}  # fmt: skip
            run_id = log_benchmark(result, params)
            Console().print(f"MLflow run {run_id}")
        typer.echo(json.dumps(result.metrics, sort_keys=True))
