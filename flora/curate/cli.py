"""``flora curate DATASET``: filter the annotation tables and write the curated mixture.

Failure analysis and fleet monitoring are part of ``flora report`` (``flora.report.cli``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from flora.cli_common import TablesOpt, parse_episodes

DatasetArg = Annotated[Path, typer.Argument(help="Dataset root (task/robot metadata).")]
OutOpt = Annotated[Path | None, typer.Option(help="Output root (default: the tables root).")]


def _outputs(p: Path | None) -> Path:
    from flora.settings import get_settings

    return p or get_settings().outputs_dir


def register(app: typer.Typer, eval_app: typer.Typer) -> None:
    """Add ``flora curate`` to ``app``."""

    @app.command("curate")
    def curate_cmd(
        dataset: DatasetArg,
        tables: TablesOpt = None,
        out: OutOpt = None,
        rules: Annotated[Path | None, typer.Option(help="Rules YAML (default rules).")] = None,
        episodes: Annotated[str | None, typer.Option(help="Comma-separated indices.")] = None,
        dvc_repo: Annotated[
            Path | None, typer.Option(help="Version the mixture in this DVC repo.")
        ] = None,
        track: Annotated[bool, typer.Option(help="Log to MLflow.")] = True,
    ) -> None:
        """Filter the annotation tables and write the curated mixture (DESIGN §3.8)."""
        from flora.curate.rebalance import EmptyMixtureError
        from flora.curate.rules import RulesError
        from flora.curate.run import curate_dataset, log_mixture, version_with_dvc

        src = _outputs(tables)
        try:
            res = curate_dataset(dataset, src, out or src, rules=rules,
                                 episodes=parse_episodes(episodes))  # fmt: skip
        except RulesError as e:
            raise typer.BadParameter(str(e), param_hint="--rules") from e
        except EmptyMixtureError as e:
            typer.echo(f"flora curate: error: {e}", err=True)
            raise typer.Exit(1) from e
        if dvc_repo is not None:
            res.summary["dvc"] = version_with_dvc(res.mixture_path, dvc_repo, res.dataset)
        if track:
            from flora.tracking import mlflow_run

            with mlflow_run("curate", tags={"dataset": res.dataset}):
                log_mixture(res)
        d = res.summary["decisions"]
        typer.echo(f"{res.dataset}: {d['items']} items over {d['episodes']} episodes -> "
                   f"pretrain {d['pretrain']}, policy {d['policy']}, failures {d['failures']}, "
                   f"dropped {d['dropped']}; mixture {res.mixture_path}")  # fmt: skip
        typer.echo(json.dumps(res.summary["mixture"]["splits"], sort_keys=True))
