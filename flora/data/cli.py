"""``flora synth``, ``flora ingest`` and ``flora dataset-info`` commands."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer, eval_app: typer.Typer) -> None:
    """Add the data commands to the root CLI."""

    @app.command("synth")
    def synth(
        out: Path = typer.Option(..., "--out", help="Dataset root to create."),
        episodes: int = typer.Option(10, "--episodes", help="Number of episodes."),
        seed: int = typer.Option(0, "--seed", help="Random seed (same seed, same bytes)."),
        layout: str = typer.Option("v3.0", "--layout", help="v3.0 | v2.1 | mp4"),
        size: int = typer.Option(96, "--size", help="Top camera frame size (square)."),
        wrist_size: int = typer.Option(0, "--wrist-size", help="Wrist size (0: = --size)."),
        durations: str = typer.Option(
            "", "--durations", help="Comma-separated episode lengths in seconds."
        ),
        cameras: str = typer.Option("top,wrist", "--cameras", help="Subset of top,wrist."),
        overwrite: bool = typer.Option(False, "--overwrite", help="Replace a non-empty out."),
    ) -> None:
        """Generate a synthetic toy-world robot dataset with ground truth."""
        from flora.data.synth import generate

        durs = [float(x) for x in durations.split(",") if x.strip()] or None
        root = generate(
            out,
            episodes,
            seed,
            durations_s=durs,
            layout=layout,
            image_size=size,
            wrist_size=wrist_size or None,
            cameras=tuple(c.strip() for c in cameras.split(",")),
            overwrite=overwrite,
        )
        typer.echo(f"wrote {episodes} episodes ({layout}) to {root}")

    @app.command("ingest")
    def ingest(
        path: Path = typer.Argument(..., help="Dataset root (LeRobot v3.0/v2.1 or mp4 folder)."),
        out: Path | None = typer.Option(None, "--out", help="Write the manifest Parquet here."),
    ) -> None:
        """Check every episode and print/write the ingest manifest."""
        from rich.console import Console
        from rich.table import Table

        from flora.data.ingest import ingest_dataset

        res = ingest_dataset(path, out=out)
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
                str(r.task or ""),
                dur,
                str(r.n_frames),
                r.status if r.status == "ok" else f"[red]{r.error}[/red]",
            )
        Console().print(t)
        typer.echo(f"{res.n_ok} ok, {res.n_error} error" + (f"; manifest: {out}" if out else ""))
        if res.n_ok == 0:
            raise typer.Exit(1)

    @app.command("dataset-info")
    def dataset_info(path: Path = typer.Argument(..., help="Dataset root.")) -> None:
        """Print the detected layout, fps, cameras and episode count of a dataset."""
        from flora.data.dataset import open_dataset

        ds = open_dataset(path)
        typer.echo(
            f"name: {ds.name}\nformat: {ds.format}\nfps: {ds.fps}\n"
            f"episodes: {ds.num_episodes}\ncameras: {ds.camera_roles}"
        )
