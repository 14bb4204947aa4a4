"""``flora caption DATASET`` and ``flora eval caption`` commands."""

from __future__ import annotations

from pathlib import Path

import typer

from flora.cli_common import (
    Backend,
    JsonOpt,
    Judge,
    StrictOpt,
    echo_failures,
    finish_step,
    make_backend_or_usage_error,
    parse_episodes,
    print_metrics,
    report_output,
    settings_with_backend,
    step_payload,
)


def _check_neighbour_source(events: Path, dataset: Path) -> None:
    """Refuse --neighbour-captions with a ground-truth events table (a usage error)."""
    from flora.caption.run import load_events_table
    from flora.data.dataset import dataset_name
    from flora.data.episode import FloraDataError

    try:
        load_events_table(events, dataset_name(dataset), neighbour_captions=True)
    except FloraDataError as e:
        raise typer.BadParameter(e.reason, param_hint="--neighbour-captions") from None


def register(app: typer.Typer, eval_app: typer.Typer) -> None:
    """Add the captioning commands to the root CLI."""

    @app.command("caption")
    def caption(
        dataset: Path = typer.Argument(
            ..., exists=True, help="Dataset root (LeRobot v3.0/v2.1 or mp4)."
        ),
        events: Path = typer.Option(
            ...,
            "--events",
            exists=True,
            help="events table: store root, events/ dir or a parquet file.",
        ),
        out: Path | None = typer.Option(
            None, "--out", help="Table root (default: <FLORA_HOME>/outputs); writes captions/."
        ),
        run_id: str | None = typer.Option(None, "--run-id", help="Run id stored on every row."),
        episodes: str = typer.Option("", "--episodes", help="Comma-separated indices (all)."),
        overwrite: bool = typer.Option(False, "--overwrite", help="Redo finished episodes."),
        max_attempts: int = typer.Option(3, "--max-attempts", min=1, help="Parse retries."),
        oracle: bool = typer.Option(
            False, "--oracle", help="Answer from the dataset's ground truth (toy world check)."
        ),
        neighbour_captions: bool = typer.Option(
            False,
            "--neighbour-captions",
            help="Quote the neighbours' captions from a previous model pass in the prompt "
            "(refused for ground-truth tables).",
        ),
        backend: Backend | None = typer.Option(
            None, "--backend", help="VLM backend (default: FLORA_BACKEND)."
        ),
        json_out: JsonOpt = None,
        strict: StrictOpt = False,
    ) -> None:
        """Caption every event of an events table (backend from --backend or FLORA_BACKEND).

        Exit 0 when every event got a caption, 3 when some failed (1 with --strict), 1 when
        no caption was written.
        """
        from flora.caption.run import CaptionConfig, caption_dataset

        with report_output(json_out) as rep:
            s = settings_with_backend(backend)
            if neighbour_captions:
                _check_neighbour_source(events, dataset)
            if oracle:
                from flora.caption.oracle import GroundTruthCaptionBackend

                vlm = GroundTruthCaptionBackend(dataset)
            else:
                vlm = make_backend_or_usage_error(s)
                if vlm is None:
                    raise typer.BadParameter(
                        "captioning needs a VLM: set FLORA_BACKEND=transformers (FLORA_MODEL_PATH) "
                        "or openai (FLORA_OPENAI_BASE_URL), or pass --oracle on a toy dataset",
                        param_hint="FLORA_BACKEND",
                    )
            res = caption_dataset(
                dataset,
                events,
                out or s.outputs_dir,
                vlm,
                run_id,
                config=CaptionConfig(
                    max_attempts=max_attempts, neighbour_captions=neighbour_captions
                ),
                episodes=parse_episodes(episodes),
                overwrite=overwrite,
            )
            typer.echo(
                f"{len(res.processed)} episodes captioned, {len(res.skipped)} skipped, "
                f"{len(res.captions)} captions in {res.table_dir} (run {res.run_id}); "
                f"validation {'passed' if res.report.success else 'FAILED'}"
            )
            echo_failures(res.failures)
            finish_step(
                rep,
                step_payload(
                    table="captions",
                    table_dir=res.table_dir,
                    run_id=res.run_id,
                    rows=len(res.captions),
                    processed=res.processed,
                    skipped=res.skipped,
                    failures=res.failures,
                    validation=res.report,
                ),
                rows=len(res.captions),
                failed=len(res.failures),
                strict=strict,
            )

    @eval_app.command("caption")
    def eval_caption(
        captions: Path = typer.Option(
            ...,
            "--captions",
            exists=True,
            help="captions table: store root, captions/ dir or parquet.",
        ),
        dataset: Path = typer.Option(
            ..., "--dataset", exists=True, help="Dataset root with ground_truth/."
        ),
        judge: Judge = typer.Option(
            Judge.embedding, "--judge", help="Judge (llm uses FLORA_BACKEND)."
        ),
        min_tiou: float = typer.Option(0.5, "--min-tiou", help="Match to GT events by tIoU."),
        control: bool = typer.Option(
            False, "--control", help="Also score GT captions and a shuffled-caption control."
        ),
        mlflow: bool = typer.Option(True, "--mlflow/--no-mlflow", help="Log to MLflow."),
        json_out: JsonOpt = None,
        strict: StrictOpt = False,
    ) -> None:
        """Mean r_cap of captions vs the ground-truth requirements (seed eq. 17).

        Captions the judge could not score count as failed items.
        """
        from flora.caption.evaluate import evaluate_captions, ground_truth_control, log_to_mlflow

        with report_output(json_out) as rep:
            if judge == Judge.embedding:
                from flora.caption.judges import EmbeddingJudge

                j = EmbeddingJudge()
            else:
                from flora.caption.judges import LLMJudge

                backend = make_backend_or_usage_error(settings_with_backend(None))
                if backend is None:
                    raise typer.BadParameter(
                        "--judge llm needs FLORA_BACKEND=openai|transformers", param_hint="--judge"
                    )
                j = LLMJudge(backend)
            res = evaluate_captions(captions, dataset, j, min_tiou=min_tiou)
            ctl = ground_truth_control(dataset, j) if control else None
            print_metrics(
                f"captions vs ground truth: {dataset.name} ({res.judge})",
                {**res.metrics, **{f"control.{a}": b for a, b in (ctl or {}).items()}},
            )
            payload = {"metrics": res.metrics, "control": ctl, "judge": res.judge}
            if mlflow:
                rid = log_to_mlflow(
                    res, captions_path=str(captions), dataset_root=str(dataset), control=ctl
                )
                typer.echo(f"logged to MLflow run {rid}")
                payload["mlflow_run_id"] = rid
            finish_step(
                rep, payload, rows=len(res.scores), failed=int(res.n_rejected), strict=strict
            )
