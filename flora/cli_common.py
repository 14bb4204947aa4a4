"""Small pieces shared by the areas' ``cli`` modules (options parsing, result printing)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import typer


def parse_episodes(spec: str | None) -> list[int] | None:
    """``"0,2,5"`` -> ``[0, 2, 5]``; empty or None -> None (every episode)."""
    return [int(x) for x in (spec or "").split(",") if x.strip()] or None


def echo_failures(failures: Iterable[Any]) -> None:
    """One ``failed: <episode> <item>: <reason>`` line per recorded failure, on stderr."""
    for f in failures:
        typer.echo(f"failed: {f.episode_id} {f.item}: {f.reason}", err=True)


def print_metrics(
    title: str, metrics: Mapping[str, Any], fmt: Callable[[Any], str] = "{:.4f}".format
) -> None:
    """A two-column ``metric | value`` table on the console."""
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title)
    t.add_column("metric")
    t.add_column("value", justify="right")
    for k, v in metrics.items():
        t.add_row(k, fmt(v))
    Console().print(t)


__all__ = ["echo_failures", "parse_episodes", "print_metrics"]
