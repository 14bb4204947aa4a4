"""``flora segment DATASET`` and ``flora eval segment`` commands."""

from __future__ import annotations

from pathlib import Path

import typer

from flora.cli_common import (
    Backend,
    JsonOpt,
    Profile,
    StrictOpt,
    echo_failures,
    finish_step,
    make_backend_or_usage_error,
    parse_episodes,
    print_metrics,
    report_output,
    settings_with_backend,
)


def register(app: typer.Typer, eval_app: typer.Typer) -> None:
    """Add the segmentation commands to the root CLI."""

    @app.command("segment")
    def segment(
        dataset: Path = typer.Argument(
            ..., exists=True, help="Dataset root (LeRobot v3.0/v2.1 or mp4)."
        ),
        out: Path | None = typer.Option(
            None, "--out", help="Table root (default: <FLORA_HOME>/outputs); writes events/."
        ),
        profile: Profile = typer.Option(Profile.standard, "--profile", help="Window profile."),
        shift: bool = typer.Option(True, "--shift/--no-shift", help="Shifted refinement pass."),
        backend: Backend | None = typer.Option(
            None, "--backend", help="VLM backend (default: FLORA_BACKEND)."
        ),
        run_id: str | None = typer.Option(None, "--run-id", help="Run id stored on every row."),
        episodes: str = typer.Option("", "--episodes", help="Comma-separated indices (all)."),
        overwrite: bool = typer.Option(False, "--overwrite", help="Redo finished episodes."),
        max_attempts: int = typer.Option(3, "--max-attempts", min=1, help="Parse retries."),
        json_out: JsonOpt = None,
        strict: StrictOpt = False,
    ) -> None:
        """Segment a dataset into the events table (backend from --backend or FLORA_BACKEND).

        Exit 0 when every window parsed, 3 when some failed (1 with --strict), 1 when no
        event was written.
        """
        from flora.segment.run import segment_dataset

        with report_output(json_out) as rep:
            s = settings_with_backend(backend)
            vlm = make_backend_or_usage_error(s)
            res = segment_dataset(
                dataset,
                out or s.outputs_dir,
                vlm,
                run_id,
                profile=profile.value,
                shift=shift,
                episodes=parse_episodes(episodes),
                max_attempts=max_attempts,
                overwrite=overwrite,
            )
            typer.echo(
                f"{len(res.processed)} episodes segmented, {len(res.skipped)} skipped, "
                f"{len(res.events)} events in {res.table_dir} (run {res.run_id})"
            )
            echo_failures(res.failures)
            finish_step(
                rep,
                {"table": "events", **res.to_dict()},
                rows=len(res.events),
                failed=len(res.failures),
                strict=strict,
            )

    @eval_app.command("segment")
    def eval_segment(
        events: Path = typer.Option(
            ..., "--events", exists=True, help="events table (root, dir or file)."
        ),
        dataset: Path = typer.Option(
            ..., "--dataset", exists=True, help="Dataset root with ground_truth/."
        ),
        run_id: str | None = typer.Option(None, "--run-id", help="Only rows of this run."),
        mlflow: bool = typer.Option(True, "--mlflow/--no-mlflow", help="Log to MLflow."),
        json_out: JsonOpt = None,
        strict: StrictOpt = False,
    ) -> None:
        """F1@0.5/0.75, precision, recall and mean tIoU of events vs ground truth.

        Ground-truth episodes without predictions score 0 recall (they are listed, not
        failed items); exit 1 when there is no ground-truth episode to score.
        """
        from flora.segment.evaluate import evaluate_events, log_to_mlflow, read_events

        with report_output(json_out) as rep:
            res = evaluate_events(read_events(events), dataset, run_id=run_id)
            print_metrics(
                f"segmentation vs ground truth: {dataset.name}",
                res.metrics,
                lambda v: f"{v:.4f}" if isinstance(v, float) and not v.is_integer() else f"{v:g}",
            )
            if res.missing_episodes:
                typer.echo(f"episodes without predictions: {res.missing_episodes}", err=True)
            payload = res.to_dict()
            if mlflow:
                rid = log_to_mlflow(res, events_path=str(events), dataset_root=str(dataset))
                typer.echo(f"logged to MLflow run {rid}")
                payload["mlflow_run_id"] = rid
            finish_step(rep, payload, rows=len(res.per_episode), failed=0, strict=strict)
