"""``flora report DATASET``: the HTML run report and episode pages."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from flora.cli_common import TablesOpt, parse_episodes


def register(app: typer.Typer, eval_app: typer.Typer) -> None:
    """Add ``flora report`` to ``app``."""

    @app.command("report")
    def report_cmd(
        dataset: Annotated[Path, typer.Argument(help="Dataset root.")],
        tables: TablesOpt = None,
        out: Annotated[
            Path | None, typer.Option(help="Report folder (default: <outputs>/reports/<name>).")
        ] = None,
        episodes: Annotated[str | None, typer.Option(help="Comma-separated indices.")] = None,
        max_episode_pages: Annotated[int, typer.Option(help="Episode pages to write.")] = 50,
        track: Annotated[bool, typer.Option(help="Log the report to MLflow.")] = False,
    ) -> None:
        """Write ``index.html`` (run) and ``episodes/*.html`` (self-contained HTML)."""
        from flora.curate.run import mixture_path
        from flora.data.dataset import dataset_name
        from flora.report.html import build_reports, log_reports
        from flora.settings import get_settings

        src = tables or get_settings().outputs_dir
        name = dataset_name(dataset)  # as `flora curate` names it (`org/x@rev` -> x)

        mixture = mixture_path(src, name)
        res = build_reports(dataset, src, out or src / "reports" / name,
                            mixture=mixture if mixture.exists() else None,
                            episodes=parse_episodes(episodes),
                            max_episode_pages=max_episode_pages)  # fmt: skip
        if track:
            from flora.tracking import mlflow_run

            with mlflow_run("report", tags={"dataset": name}):
                log_reports(res)
        typer.echo(str(res.index))
