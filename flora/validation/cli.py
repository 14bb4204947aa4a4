"""``flora validate DATASET`` and ``flora validate-table TABLE|all PATH``.

Output (docs/validation.md):

- On a terminal: a summary and rich tables of suites and issues.
- Otherwise (CI logs, pipes): one line per problem, never a wrapped table::

      <severity> <dataset>/<episode> <field> <check>: <reason> [<file>]

  (``-`` where a part is unknown), then one ``summary:`` line. ``--lines`` / ``--table``
  force either form.
- ``--json PATH`` writes the JSON report and, beside it, the GX Data Docs (HTML) of the
  Checkpoint runs in ``<report stem>_data_docs/`` (``--docs DIR`` elsewhere, ``--no-docs``
  off). ``--json -`` writes the report to stdout; human text then goes to stderr.

Exit status (flora.cli_common): 0 everything valid; 3 some episodes failed, others are
valid (``--strict``: 1); 1 nothing usable (no valid episode, a dataset-level problem, a
table that fails as a whole); 2 usage (missing path, unknown table).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, TextIO

import typer

from flora.cli_common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_PARTIAL,
    JsonOpt,
    StrictOpt,
    one_line,
    report_output,
)
from flora.data.cli import RevisionOpt, _dataset_arg

SEVERITY = "error"  # every failed check blocks the data (no warning-level checks yet)


def problem_line(
    dataset: str | None,
    episode: Any,
    field: str | None,
    check: str,
    reason: str,
    file: str | None,
    severity: str = SEVERITY,
) -> str:
    """``<severity> <dataset>/<episode> <field> <check>: <reason> [<file>]`` on one line."""
    ep = "-" if episode is None or episode == "" else str(episode)
    where = f"{dataset or '-'}/{ep}" if "/" not in ep else ep  # episode ids carry the dataset
    return one_line(
        f"{severity} {where} {field or '-'} {check}: {reason} [{file or '-'}]", limit=2000
    )


def dataset_problem_lines(report: Any) -> list[str]:
    """The problem lines of a ``DatasetReport`` (one per issue)."""
    return [
        problem_line(i.dataset, i.episode, i.field, i.check, i.reason, i.file)
        for i in report.issues
    ]


def table_problem_lines(report: Any, file: str | None) -> list[str]:
    """The problem lines of a table ``ValidationReport``: one per (failed check, episode)."""
    out: list[str] = []
    for r in report.failures:
        check = r.description or r.expectation
        if not r.failing_ids:  # table-level (missing column, row count, ...)
            reason = r.error or r.describe().removeprefix("FAIL ")
            out.append(problem_line(report.dataset, None, r.column, check, reason, file))
            continue
        for eid in r.failing_ids:
            rows = [s for s in r.samples if str(s.get("episode_id")) == eid]
            reason = f"{report.table}: {r.unexpected_count} of {r.element_count} rows fail"
            if rows:
                first = {k: v for k, v in rows[0].items() if k != "episode_id"}
                reason += f", e.g. {first}"
            out.append(problem_line(report.dataset, eid, r.column, check, reason, file))
    return out


def _use_lines(stream: TextIO, lines: bool | None) -> bool:
    if lines is not None:
        return lines
    try:
        return not stream.isatty()
    except (AttributeError, ValueError):
        return True


def _print_dataset_table(report: Any, stream: TextIO) -> None:
    """The terminal form: summary and rich tables."""
    from rich.console import Console
    from rich.table import Table

    console = Console(file=stream)
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


def dataset_exit_code(report: Any, strict: bool = False) -> int:
    """0 all valid; 3 some episodes invalid, others valid (``strict``: 1); 1 none usable."""
    if report.success:
        return EXIT_OK
    if not report.valid_episodes:
        return EXIT_FAILED
    return EXIT_FAILED if strict else EXIT_PARTIAL


def table_exit_code(report: Any, n_episodes: int, strict: bool = False) -> int:
    """0 passed; 3 failures confined to some episodes (``strict``: 1); 1 otherwise."""
    if report.success:
        return EXIT_OK
    whole_table = any(not r.failing_ids for r in report.failures)
    if whole_table or report.row_count == 0 or len(report.failing_episodes) >= n_episodes:
        return EXIT_FAILED
    return EXIT_FAILED if strict else EXIT_PARTIAL


def _docs_dir(json_out: str | None, docs: Path | None, no_docs: bool) -> Path | None:
    if no_docs:
        return None
    if docs is not None:
        return docs
    if json_out and json_out != "-":
        p = Path(json_out)
        return p.with_name(f"{p.stem}_data_docs")
    return None


def _write_docs(reports: list[Any], folder: Path | None) -> str | None:
    if folder is None:
        return None
    from flora.validation.core import write_data_docs

    index = write_data_docs(reports, folder)
    if index is not None:
        typer.echo(f"data docs written to {index}", err=True)
    return None if index is None else str(index)


LinesOpt = typer.Option(
    None,
    "--lines/--table",
    help="Force one line per problem (default when stdout is not a terminal) or tables.",
)
DocsOpt = typer.Option(
    None, "--docs", help="Data Docs folder (default: <report stem>_data_docs beside --json)."
)
NoDocsOpt = typer.Option(False, "--no-docs", help="Do not write GX Data Docs.")


def register(app: typer.Typer, eval_app: typer.Typer) -> None:
    """Add the validation commands to the ``flora`` CLI."""

    @app.command("validate")
    def validate_cmd(
        dataset: str = typer.Argument(
            ...,
            callback=_dataset_arg,
            help="Dataset root (LeRobot v3.0/v2.1, mp4 folder) or Hub id org/name[@revision].",
        ),
        revision: str | None = RevisionOpt,
        json_out: JsonOpt = None,
        strict: StrictOpt = False,
        lines: bool | None = LinesOpt,
        docs: Path | None = DocsOpt,
        no_docs: bool = NoDocsOpt,
        quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
    ) -> None:
        """Validate every episode of DATASET with its GX suites (raw_frames, raw_episodes,
        raw_cameras: every video frame is decoded).

        Exit 0 when every episode is valid, 3 when some are not (1 with --strict), 1 when
        none is usable.
        """
        from flora.validation.raw import validate_dataset

        with report_output(json_out) as rep:
            out = sys.stdout  # stderr under --json -
            report = validate_dataset(
                dataset, progress=not quiet and out.isatty(), revision=revision
            )
            if _use_lines(out, lines):
                for line in dataset_problem_lines(report):
                    print(line, file=out)
                st = report.statistics
                print(
                    f"summary: {report.dataset} {'PASSED' if report.success else 'FAILED'} "
                    f"{st['valid']}/{st['episodes']} episodes valid, {st['issues']} problem(s)",
                    file=out,
                )
            else:
                _print_dataset_table(report, out)
            docs_index = _write_docs(
                list(report.tables.values()), _docs_dir(json_out, docs, no_docs)
            )
            code = dataset_exit_code(report, strict)
            rep.emit({**report.to_dict(), "data_docs": docs_index, "exit_code": code})
        raise typer.Exit(code)

    @app.command("validate-table")
    def validate_table_cmd(
        table: str = typer.Argument(
            ...,
            help="Table name (events, captions, outcome, ...), or 'all' for every table "
            "folder under PATH.",
        ),
        path: Path = typer.Argument(
            ..., exists=True, help="A Parquet file, a table folder, or (with 'all') a table root."
        ),
        json_out: JsonOpt = None,
        strict: StrictOpt = False,
        lines: bool | None = LinesOpt,
        docs: Path | None = DocsOpt,
        no_docs: bool = NoDocsOpt,
    ) -> None:
        """Validate engine tables (Parquet) against their GX suites.

        Exit 0 when they pass, 3 when only some episodes' rows fail (1 with --strict), 1
        when a table fails as a whole.
        """
        from flora.data.episode import FloraDataError
        from flora.validation.core import registered_tables, validate_table

        known = registered_tables()
        if table == "all":
            targets = [(d.name, d) for d in sorted(path.iterdir()) if d.is_dir()
                       and d.name in known and any(d.glob("*.parquet"))]  # fmt: skip
            if not targets:
                raise FloraDataError(
                    f"no table folder with Parquet parts under {path} (tables: {', '.join(known)})",
                    file=path,
                )
        elif table in known:
            targets = [(table, path)]
        else:
            raise typer.BadParameter(
                f"no suite for table {table!r} (known: all, {', '.join(known)})",
                param_hint="TABLE",
            )
        loaded = [(name, where, _read_parquet(where, name)) for name, where in targets]
        with report_output(json_out) as rep:
            out = sys.stdout  # stderr under --json -
            use_lines = _use_lines(out, lines)
            results: dict[str, Any] = {}
            codes: list[int] = []
            reports = []
            for name, where, df in loaded:
                report = validate_table(name, df)
                reports.append(report)
                n_eps = int(df["episode_id"].nunique()) if "episode_id" in df.columns else 0
                code = table_exit_code(report, n_eps, strict)
                codes.append(code)
                results[name] = {**report.to_dict(), "path": str(where), "exit_code": code}
                if use_lines:
                    for line in table_problem_lines(report, str(where)):
                        print(line, file=out)
                    st = report.statistics
                    print(
                        f"summary: {name} {'PASSED' if report.success else 'FAILED'} "
                        f"{st['successful']}/{st['evaluated']} expectations, "
                        f"{report.row_count} rows, {len(report.failing_episodes)} failing "
                        f"episode(s) [{where}]",
                        file=out,
                    )
                else:
                    _print_table_report(report, out)
            docs_index = _write_docs(reports, _docs_dir(json_out, docs, no_docs))
            code = EXIT_FAILED if EXIT_FAILED in codes else max(codes)
            payload = results[table] if table != "all" else {"tables": results}
            rep.emit({**payload, "data_docs": docs_index, "exit_code": code})
        raise typer.Exit(code)


def _read_parquet(path: Path, table: str) -> Any:
    """One table from a Parquet file or a folder of parts; unreadable -> FloraDataError."""
    import pandas as pd

    from flora.data.episode import FloraDataError

    parts = sorted(path.glob("*.parquet")) if path.is_dir() else [path]
    if not parts:
        raise FloraDataError(f"no Parquet parts in {path}", file=path, field=table)
    frames = []
    for p in parts:
        try:
            frames.append(pd.read_parquet(p))
        except Exception as e:  # noqa: BLE001 - any unreadable part is a data error
            raise FloraDataError(
                f"unreadable Parquet ({type(e).__name__}: {e})", file=p, field=table
            ) from e
    return pd.concat(frames, ignore_index=True)


def _print_table_report(report: Any, stream: TextIO) -> None:
    """The terminal form of one table report."""
    from rich.console import Console
    from rich.text import Text

    console = Console(file=stream)
    style = "green" if report.success else "red"
    console.print(Text(report.summary(), style=style))
    for r in report.failures:
        for row in r.samples[:3]:
            console.print(f"    e.g. {row}", markup=False)
