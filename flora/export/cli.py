"""``flora export lerobot DATASET --out DIR``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from flora.cli_common import TablesOpt


def register(app: typer.Typer, eval_app: typer.Typer) -> None:
    """Add ``flora export …`` to ``app``."""
    export_app = typer.Typer(help="Export datasets with the engine's annotations.",
                             no_args_is_help=True)  # fmt: skip
    app.add_typer(export_app, name="export")

    @export_app.command("lerobot")
    def lerobot_cmd(
        dataset: Annotated[
            Path,
            typer.Argument(help="Source LeRobot v3.0 dataset root.", exists=True, file_okay=False),
        ],
        out: Annotated[
            Path | None, typer.Option(help="Target folder (not with --in-place).")
        ] = None,
        tables: TablesOpt = None,
        mixture: Annotated[
            Path | None, typer.Option(help="Curated mixture Parquet.", exists=True)
        ] = None,
        overwrite: Annotated[bool, typer.Option(help="Replace an earlier export.")] = False,
        in_place: Annotated[
            bool, typer.Option(help="Modify the source dataset (not with --out).")
        ] = False,
    ) -> None:
        """LeRobot v3.0 with ``language_persistent`` events and ``flora_annotations/``."""
        from flora.export.lerobot import export_lerobot
        from flora.settings import get_settings

        if out is None and not in_place:
            raise typer.BadParameter("pass --out DIR (or --in-place)", param_hint="--out")
        if out is not None and in_place:  # which one was meant is unknowable: touch nothing
            raise typer.BadParameter(
                "--out and --in-place are exclusive: pass --out DIR to write a copy, or "
                "--in-place to modify the source dataset",
                param_hint="--out/--in-place",
            )
        src = tables or get_settings().outputs_dir
        if mixture is None:
            from flora.curate.run import mixture_path

            cand = mixture_path(src, dataset.resolve().name)
            mixture = cand if cand.exists() else None
        from flora.safety import OutputDirError

        try:
            res = export_lerobot(dataset, src, out, mixture=mixture, overwrite=overwrite,
                                 in_place=in_place)  # fmt: skip
        except OutputDirError as e:  # never replace what Flora did not write: usage, exit 2
            raise typer.BadParameter(str(e), param_hint="--out") from e
        except (FileExistsError, ValueError) as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(1) from e
        typer.echo(json.dumps(res.to_dict(), indent=1))
