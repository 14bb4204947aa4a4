"""``flora reward outcome|dense|rubric`` and ``flora eval reward``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from flora.cli_common import (
    Backend,
    JsonOpt,
    Report,
    RewardMode,
    StrictOpt,
    failure_dicts,
    finish_step,
    make_backend_or_usage_error,
    parse_episodes,
    print_metrics,
    report_output,
    settings_with_backend,
    status_line,
    step_exit_code,
)


def _backend(model: Path | None, oracle_root: Path | None, choice: Backend | None = None):
    """Backend from ``--model`` (in-process transformers), ``--oracle``, or settings."""
    if oracle_root is not None:
        from flora.reward.oracle import GroundTruthRewardBackend

        return GroundTruthRewardBackend(oracle_root)
    s = settings_with_backend(choice)
    if model is not None:
        from flora.backends.transformers_backend import TransformersBackend

        return TransformersBackend(model, device=s.device)
    b = make_backend_or_usage_error(s)
    if b is None:
        raise typer.BadParameter(
            "the rewarder needs a VLM backend: pass --model DIR, --backend transformers|openai "
            "or set FLORA_BACKEND (the kinematic baseline has no rewarder)",
            param_hint="--backend",
        )
    return b


def _out(out: Path | None) -> Path:
    from flora.settings import get_settings

    return out or get_settings().outputs_dir


def _report(res) -> None:
    """Human summary of one step (stdout, or stderr under ``--json -``); failures on stderr."""
    s = res.summary()
    typer.echo(
        f"{s['table']}: {s['written']} episodes written, {s['skipped']} skipped, "
        f"{s['failures']} failures, {s['rows']} rows, valid={s['valid']} "
        f"-> {res.root / s['table']}"
    )
    for f in res.failures[:20]:
        typer.echo(f"  FAILED {f.episode_id} {f.item}: {f.reason}", err=True)
    if len(res.failures) > 20:
        typer.echo(
            f"  … {len(res.failures) - 20} more in {res.root / s['table'] / '_failures'}", err=True
        )


def _table_rows(res) -> int:
    """Rows of the whole table after the run (a resumed run's skipped episodes count)."""
    return int(getattr(res.validation, "row_count", 0) or 0) if res.validation else 0


def _valid(res) -> bool:
    return res.validation is None or bool(res.validation.success)


def _payload(res) -> dict[str, Any]:
    return {
        **res.summary(),
        "table_dir": str(res.root / res.table),
        "table_rows": _table_rows(res),
        "run_id": res.run_id,
        "written_episodes": list(res.written),
        "skipped_episodes": list(res.skipped),
        "failures": failure_dicts(res.failures),
        "validation": res.validation.to_dict() if hasattr(res.validation, "to_dict") else None,
    }


def _finish(rep: Report, res, strict: bool) -> None:
    """Print a step's result and exit with the documented status (docs/cli.md)."""
    _report(res)
    finish_step(rep, _payload(res), rows=_table_rows(res), failed=len(res.failures), strict=strict,
                valid=_valid(res))  # fmt: skip


DatasetArg = Annotated[
    Path, typer.Argument(exists=True, help="Dataset root (LeRobot v3.0/v2.1, mp4 folder).")
]
OutOpt = Annotated[Path | None, typer.Option(help="Table root (default: FLORA_HOME/outputs).")]
ModelOpt = Annotated[
    Path | None,
    typer.Option(exists=True, help="Local VLM checkpoint (else --backend / FLORA_BACKEND)."),
]
BackendOpt = Annotated[
    Backend | None, typer.Option("--backend", help="VLM backend (default: FLORA_BACKEND).")
]
OracleOpt = Annotated[
    bool, typer.Option("--oracle", help="Answer from the dataset's ground truth (toy world).")
]
EpisodesOpt = Annotated[str | None, typer.Option(help="Comma-separated episode indices.")]
AttemptsOpt = Annotated[int, typer.Option(min=1, help="Bounded attempts per item.")]


def register(app: typer.Typer, eval_app: typer.Typer) -> None:
    """Add ``flora reward …`` to ``app`` and ``flora eval reward`` to ``eval_app``."""
    reward_app = typer.Typer(help="Outcome, dense and rubric rewards from one rewarder.",
                             no_args_is_help=True, rich_markup_mode=None)  # fmt: skip
    app.add_typer(reward_app, name="reward")

    def add_mode(mode: str, doc: str) -> None:
        # outcome and dense take the same options; one command body serves both.
        def cmd(
            dataset: DatasetArg,
            out: OutOpt = None,
            model: ModelOpt = None,
            backend: BackendOpt = None,
            oracle: OracleOpt = False,
            episodes: EpisodesOpt = None,
            max_attempts: AttemptsOpt = 3,
            json_out: JsonOpt = None,
            strict: StrictOpt = False,
        ) -> None:
            from flora.reward.run import reward_dataset

            with report_output(json_out) as rep:
                b = _backend(model, dataset if oracle else None, backend)
                res = reward_dataset(mode, dataset, b, _out(out),
                                     episodes=parse_episodes(episodes),
                                     max_attempts=max_attempts)  # fmt: skip
                _finish(rep, res, strict)

        cmd.__doc__ = doc
        reward_app.command(mode)(cmd)

    exit_doc = (
        "\n\nExit 0 when every episode was scored, 3 when some failed (1 with --strict), 1 "
        "when no row was written or the table failed its suite."
    )
    add_mode("outcome", "Outcome rewards (table outcome)." + exit_doc)
    add_mode("dense", "Dense labels per 0.5 s group (table dense_labels)." + exit_doc)

    @reward_app.command("rubric")
    def rubric_cmd(
        dataset: DatasetArg,
        rubric: Annotated[
            Path, typer.Option(exists=True, help="Rubric YAML/JSON (maxima sum to 1).")
        ],
        out: OutOpt = None,
        model: ModelOpt = None,
        backend: BackendOpt = None,
        oracle: OracleOpt = False,
        episodes: EpisodesOpt = None,
        max_attempts: AttemptsOpt = 3,
        json_out: JsonOpt = None,
        strict: StrictOpt = False,
    ) -> None:
        """Rubric rewards for one user rubric (table rubric).

        Exit 0 when every episode was scored, 3 when some failed (1 with --strict), 1 when
        no row was written or the table failed its suite.
        """
        from flora.reward.rubric import RubricError, load_rubric
        from flora.reward.run import rubric_dataset

        try:
            rub = load_rubric(rubric)
        except RubricError as e:
            raise typer.BadParameter(str(e), param_hint="--rubric") from e
        with report_output(json_out) as rep:
            b = _backend(model, dataset if oracle else None, backend)
            res = rubric_dataset(dataset, b, _out(out), rub, episodes=parse_episodes(episodes),
                                 max_attempts=max_attempts)  # fmt: skip
            _finish(rep, res, strict)

    @eval_app.command("reward")
    def eval_reward(
        dataset: DatasetArg,
        out: OutOpt = None,
        model: ModelOpt = None,
        backend: BackendOpt = None,
        oracle: Annotated[
            bool, typer.Option(help="Answer from ground truth (upper bound).")
        ] = False,
        modes: Annotated[
            str, typer.Option(help="Comma-separated subset of: outcome, dense, rubric.")
        ] = "outcome,dense,rubric",
        episodes: EpisodesOpt = None,
        max_attempts: AttemptsOpt = 3,
        track: Annotated[bool, typer.Option(help="Log to MLflow.")] = True,
        json_out: JsonOpt = None,
        strict: StrictOpt = False,
    ) -> None:
        """Score the rewarder: toy-world ground truth, or a RoboRewardBench-layout folder.

        Failed items of the steps behind the metrics count as failed items. Without
        --json the metrics are printed as one JSON line last.
        """
        from flora.reward.benchmark import (
            is_roborewardbench,
            log_benchmark,
            run_roborewardbench,
            run_toy_benchmark,
        )

        try:
            mode_list = [RewardMode(m.strip()).value for m in modes.split(",") if m.strip()]
        except ValueError:
            raise typer.BadParameter(
                f"{modes!r}: choose from {', '.join(m.value for m in RewardMode)}",
                param_hint="--modes",
            ) from None
        rrb = is_roborewardbench(dataset)
        if oracle and rrb:
            raise typer.BadParameter("--oracle needs a toy-world dataset with ground_truth/")
        with report_output(json_out) as rep:
            b = _backend(model, dataset if oracle else None, backend)
            root = _out(out) / "eval_reward"
            if rrb:
                result = run_roborewardbench(dataset, b, root, max_attempts=max_attempts)
            else:
                result = run_toy_benchmark(
                    dataset, b, root, modes=mode_list, episodes=parse_episodes(episodes),
                    max_attempts=max_attempts,
                )  # fmt: skip
            print_metrics(f"flora eval reward - {dataset.name} ({getattr(b, 'name', '')})",
                          result.metrics)  # fmt: skip
            for res in result.steps.values():
                _report(res)
            payload: dict[str, Any] = {
                "metrics": result.metrics,
                "steps": {k: _payload(v) for k, v in result.steps.items()},
            }
            if track:
                params = {"dataset": str(dataset), "backend": getattr(b, "name", ""),
                          "model_version": getattr(b, "model_version", ""),
                          "layout": "roborewardbench" if rrb else "toy_world", "modes": modes,
                          "max_attempts": max_attempts}  # fmt: skip
                run_id = log_benchmark(result, params)
                typer.echo(f"MLflow run {run_id}")
                payload["mlflow_run_id"] = run_id
            steps = list(result.steps.values())
            rows = sum(_table_rows(s) for s in steps)
            failed = sum(len(s.failures) for s in steps)
            valid = all(_valid(s) for s in steps)
            code = step_exit_code(rows=rows, failed=failed, strict=strict, valid=valid)
            rep.emit({**payload, "exit_code": code})
            if code:
                typer.echo(status_line(code, rows=rows, failed=failed, valid=valid), err=True)
            if not rep.to_stdout:  # the metrics as one JSON line, last (scripts read it)
                typer.echo(json.dumps(result.metrics, sort_keys=True, default=float))
            raise typer.Exit(code)
