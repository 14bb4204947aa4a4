"""``flora synth``, ``flora ingest`` and ``flora dataset-info`` commands."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path

import typer

from flora.cli_common import JsonOpt, StrictOpt, finish_step, report_output


class Layout(StrEnum):
    """On-disk layout written by ``flora synth``."""

    v3_0 = "v3.0"
    v2_1 = "v2.1"
    mp4 = "mp4"


def _floats(spec: str, hint: str) -> list[float] | None:
    try:
        return [float(x) for x in spec.split(",") if x.strip()] or None
    except ValueError:
        raise typer.BadParameter(
            f"expected comma-separated seconds, got {spec!r}", param_hint=hint
        ) from None


RevisionOpt = typer.Option(
    None, "--revision", help="Hub dataset branch, tag or commit (Hub ids only)."
)


def _dataset_arg(value: str) -> str:
    """A dataset argument must be an existing folder or look like a Hub id (usage error)."""
    from flora.data.dataset import HUB_DATASET

    if value is not None and not Path(value).exists() and not HUB_DATASET.match(value):
        raise typer.BadParameter(
            f"{value!r} is neither an existing dataset folder nor a Hub id org/name[@revision]"
        )
    return value


def register(app: typer.Typer, eval_app: typer.Typer) -> None:
    """Add the data commands to the root CLI."""

    @app.command("synth")
    def synth(
        out: Path = typer.Option(..., "--out", help="Dataset root to create."),
        episodes: int = typer.Option(10, "--episodes", min=1, help="Number of episodes."),
        seed: int = typer.Option(0, "--seed", help="Random seed (same seed, same bytes)."),
        layout: Layout = typer.Option(Layout.v3_0, "--layout", help="Dataset layout."),
        size: int = typer.Option(96, "--size", min=8, help="Top camera frame size (square)."),
        wrist_size: int = typer.Option(0, "--wrist-size", help="Wrist size (0: = --size)."),
        durations: str = typer.Option(
            "", "--durations", help="Comma-separated episode lengths in seconds."
        ),
        cameras: str = typer.Option("top,wrist", "--cameras", help="Subset of top,wrist."),
        world: int = typer.Option(
            0, "--world", help="Toy-world rules version (0: the latest; 1: worlds made before 2)."
        ),
        overwrite: bool = typer.Option(False, "--overwrite", help="Replace a non-empty out."),
        json_out: JsonOpt = None,
    ) -> None:
        """Generate a synthetic toy-world robot dataset with ground truth."""
        from flora.data.synth import generate
        from flora.data.world import WORLD_VERSION

        durs = _floats(durations, "--durations")
        with report_output(json_out) as rep:
            try:
                root = generate(
                    out,
                    episodes,
                    seed,
                    durations_s=durs,
                    layout=layout.value,
                    image_size=size,
                    wrist_size=wrist_size or None,
                    cameras=tuple(c.strip() for c in cameras.split(",")),
                    world=world or WORLD_VERSION,
                    overwrite=overwrite,
                )
            except FileExistsError as e:
                raise typer.BadParameter(
                    f"{out} exists and is not empty (pass --overwrite to replace it)",
                    param_hint="--out",
                ) from e
            except ValueError as e:  # argument checks of generate(): a usage error
                raise typer.BadParameter(str(e)) from e
            typer.echo(f"wrote {episodes} episodes ({layout.value}) to {root}")
            finish_step(
                rep,
                {"root": str(root), "episodes": episodes, "seed": seed, "layout": layout.value},
                rows=episodes,
                failed=0,
            )

    @app.command("ingest")
    def ingest(
        path: str = typer.Argument(
            ...,
            callback=_dataset_arg,
            help="Dataset root (LeRobot v3.0/v2.1 or mp4 folder) or Hub id org/name[@revision].",
        ),
        revision: str | None = RevisionOpt,
        out: Path | None = typer.Option(None, "--out", help="Write the manifest Parquet here."),
        json_out: JsonOpt = None,
        strict: StrictOpt = False,
    ) -> None:
        """Check every episode and print/write the ingest manifest.

        Exit 0 when every episode reads, 3 when some do not (1 with --strict), 1 when none.
        """
        from rich.console import Console
        from rich.markup import escape
        from rich.table import Table

        from flora.data.ingest import ingest_dataset

        with report_output(json_out) as rep:
            res = ingest_dataset(path, out=out, revision=revision)
            t = Table(title=f"{res.dataset.name} ({res.dataset.format})")
            for c in ("episode", "task", "duration s", "frames", "status"):
                t.add_column(c)
            for r in res.manifest.itertuples():
                dur = (
                    ""
                    if r.duration_us is None or str(r.duration_us) == "<NA>"
                    else (f"{int(r.duration_us) / 1e6:.1f}")
                )
                t.add_row(
                    str(r.episode_index),
                    escape(str(r.task or "")),
                    dur,
                    str(r.n_frames),
                    r.status if r.status == "ok" else f"[red]{escape(str(r.error))}[/red]",
                )
            Console().print(t)
            typer.echo(
                f"{res.n_ok} ok, {res.n_error} error" + (f"; manifest: {out}" if out else "")
            )
            payload = {
                "dataset": res.dataset.name,
                "format": res.dataset.format,
                "n_ok": res.n_ok,
                "n_error": res.n_error,
                "errors": {str(k): v for k, v in res.errors().items()},
                "manifest": str(out) if out else None,
            }
            finish_step(rep, payload, rows=res.n_ok, failed=res.n_error, strict=strict)

    @app.command("dataset-info")
    def dataset_info(
        path: str = typer.Argument(
            ..., callback=_dataset_arg, help="Dataset root or Hub id org/name[@revision]."
        ),
        revision: str | None = RevisionOpt,
        json_out: JsonOpt = None,
    ) -> None:
        """Print the detected layout, fps, cameras and episode count of a dataset."""
        from flora.data.dataset import open_dataset

        with report_output(json_out) as rep:
            ds = open_dataset(path, revision=revision)
            typer.echo(
                f"name: {ds.name}\nformat: {ds.format}\nfps: {ds.fps}\n"
                f"episodes: {ds.num_episodes}\ncameras: {ds.camera_roles}"
            )
            rep.emit(
                {
                    "name": ds.name,
                    "format": ds.format,
                    "fps": ds.fps,
                    "episodes": ds.num_episodes,
                    "cameras": ds.camera_roles,
                }
            )
