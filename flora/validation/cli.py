"""``flora validate DATASET`` and ``flora validate-table TABLE PATH``.

Both print a readable report and exit non-zero when anything fails, so CI can run them.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table


def _print_dataset_report(report, console: Console) -> None:
    from flora.validation.raw import DatasetReport

    assert isinstance(report, DatasetReport)
    ok = report.success
    style = "green" if ok else "red"
    console.print(
        f"[bold]{report.dataset}[/] ({report.format}, {report.path}): "
        f"[{style}]{'PASSED' if ok else 'FAILED'}[/] — "
        f"{len(report.valid_episodes)}/{len(report.episodes)} episodes valid"
    )
    t = Table(title="suites", show_lines=False)
    for col in ("table", "result", "expectations", "rows"):
        t.add_column(col)
    for name, r in report.tables.items():
        st = r.statistics
        t.add_row(
            name,
            "[green]passed[/]" if r.success else "[red]failed[/]",
            f"{st['successful']}/{st['evaluated']}",
            str(r.row_count),
        )
    if report.tables:
        console.print(t)
    if report.issues:
        it = Table(title=f"{len(report.issues)} issue(s)", show_lines=True)
        for col in ("episode", "field", "check", "reason", "file"):
            it.add_column(col, overflow="fold")
        for i in report.issues:
            it.add_row(
                "-" if i.episode is None else str(i.episode),
                i.field or "-",
                i.check,
                i.reason,
                i.file or "-",
            )
        console.print(it)


def register(app: typer.Typer, eval_app: typer.Typer) -> None:
    """Add the validation commands to the ``flora`` CLI."""

    @app.command("validate")
    def validate_cmd(
        dataset: Path = typer.Argument(..., help="Dataset root (LeRobot v3.0/v2.1, mp4 folder)."),
        json_out: Path | None = typer.Option(None, "--json", help="Also write the report."),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
    ) -> None:
        """Validate every episode of DATASET with its GX suites; exit 1 on any issue."""
        from flora.validation.raw import validate_dataset

        console = Console()
        report = validate_dataset(dataset, progress=not quiet)
        _print_dataset_report(report, console)
        if json_out is not None:
            report.write(json_out)
            console.print(f"report written to {json_out}")
        raise typer.Exit(0 if report.success else 1)

    @app.command("validate-table")
    def validate_table_cmd(
        table: str = typer.Argument(..., help="Table name, e.g. events, outcome."),
        path: Path = typer.Argument(..., help="A Parquet file or a TableStore table folder."),
        json_out: Path | None = typer.Option(None, "--json", help="Also write the report."),
    ) -> None:
        """Validate an engine table (Parquet) against its suite; exit 1 on failure."""
        import pandas as pd

        from flora.validation.core import validate_table

        console = Console()
        if path.is_dir():
            parts = sorted(path.glob("*.parquet"))
            if not parts:
                console.print(f"[red]no Parquet parts in {path}[/]")
                raise typer.Exit(2)
            df = pd.concat([pd.read_parquet(p) for p in parts], ignore_index=True)
        else:
            df = pd.read_parquet(path)
        report = validate_table(table, df)
        style = "green" if report.success else "red"
        console.print(f"[{style}]{report.summary()}[/]")
        for r in report.failures:
            for row in r.samples[:3]:
                console.print(f"    e.g. {row}")
        if json_out is not None:
            json_out.parent.mkdir(parents=True, exist_ok=True)
            json_out.write_text(json.dumps(report.to_dict(), indent=1))
        raise typer.Exit(0 if report.success else 1)
