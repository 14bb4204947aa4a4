"""``flora segment DATASET`` and ``flora eval segment`` commands."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from flora.cli_common import echo_failures, parse_episodes, print_metrics


def register(app: typer.Typer, eval_app: typer.Typer) -> None:
    """Add the segmentation commands to the root CLI."""

    @app.command("segment")
    def segment(
        dataset: Path = typer.Argument(..., help="Dataset root (LeRobot v3.0/v2.1 or mp4)."),
        out: Path | None = typer.Option(
            None, "--out", help="Table root (default: <FLORA_HOME>/outputs); writes events/."
        ),
        profile: str = typer.Option("standard", "--profile", help="standard | long_horizon"),
        shift: bool = typer.Option(True, "--shift/--no-shift", help="Shifted refinement pass."),
        run_id: str | None = typer.Option(None, "--run-id", help="Run id stored on every row."),
        episodes: str = typer.Option("", "--episodes", help="Comma-separated indices (all)."),
        overwrite: bool = typer.Option(False, "--overwrite", help="Redo finished episodes."),
        max_attempts: int = typer.Option(3, "--max-attempts", min=1, help="Parse retries."),
    ) -> None:
        """Segment a dataset into the ``events`` table (backend from FLORA_BACKEND)."""
        from flora.backends import make_backend
        from flora.segment.run import segment_dataset
        from flora.settings import get_settings

        s = get_settings()
        backend = make_backend(s)
        res = segment_dataset(
            dataset,
            out or s.outputs_dir,
            backend,
            run_id,
            profile=profile,
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

    @eval_app.command("segment")
    def eval_segment(
        events: Path = typer.Option(..., "--events", help="events table (root, dir or file)."),
        dataset: Path = typer.Option(..., "--dataset", help="Dataset root with ground_truth/."),
        run_id: str | None = typer.Option(None, "--run-id", help="Only rows of this run."),
        mlflow: bool = typer.Option(True, "--mlflow/--no-mlflow", help="Log to MLflow."),
        json_out: Path | None = typer.Option(None, "--json", help="Also write results here."),
    ) -> None:
        """F1@0.5/0.75, precision, recall and mean tIoU of events vs ground truth."""
        from flora.segment.evaluate import evaluate_events, log_to_mlflow, read_events

        res = evaluate_events(read_events(events), dataset, run_id=run_id)
        print_metrics(
            f"segmentation vs ground truth: {dataset.name}",
            res.metrics,
            lambda v: f"{v:.4f}" if isinstance(v, float) and not v.is_integer() else f"{v:g}",
        )
        if res.missing_episodes:
            typer.echo(f"episodes without predictions: {res.missing_episodes}")
        if json_out:
            json_out.write_text(json.dumps(res.to_dict(), indent=1, default=float))
        if mlflow:
            rid = log_to_mlflow(res, events_path=str(events), dataset_root=str(dataset))
            typer.echo(f"logged to MLflow run {rid}")
