"""``python -m flora.demo`` (``make demo``): the embedded data engine, end to end, on one machine.

1. Generate the toy-world dataset (``datasets/toy_world``; deterministic, so the bytes
   match the committed ``datasets.dvc`` pointer).
2. ``dvc add datasets`` and ``dvc push`` to the local remote (``.flora/dvc-remote``).
3. Run the ``flora_data_engine`` Airflow DAG with ``airflow dags test`` on SQLite
   (``AIRFLOW_HOME=.flora/airflow``). The DAG drives everything after data versioning, so
   steps appended to the DAG (segment, caption, reward) show up here with no change.
4. Print where the results are: MLflow store and UI command, outputs, DVC remote.

Airflow and DVC run as subprocesses (their CLIs, exactly as a user would call them);
``flora`` itself never imports Airflow.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from flora.settings import FloraSettings, get_settings

DAG_ID = "flora_data_engine"
DEMO_EPISODES = 10
DEMO_SEED = 0

console = Console()


def _bin(name: str) -> str:
    """A console script of this interpreter's environment (airflow, dvc)."""
    p = Path(sys.executable).parent / name
    return str(p) if p.exists() else name


def _run(cmd: list[str], *, env: dict[str, str], cwd: Path, log: Path, what: str) -> float:
    """Run a command under a spinner, appending its output to ``log``; raise on failure."""
    t0 = time.perf_counter()
    log.parent.mkdir(parents=True, exist_ok=True)
    with console.status(f"[bold]{what}[/] …"), log.open("a") as fh:
        fh.write(f"\n$ {' '.join(cmd)}\n")
        fh.flush()
        rc = subprocess.run(cmd, env=env, cwd=cwd, stdout=fh, stderr=subprocess.STDOUT).returncode
    dt = time.perf_counter() - t0
    if rc != 0:
        tail = "".join(log.read_text().splitlines(keepends=True)[-40:])
        console.print(f"[red]✗ {what} failed (exit {rc}); last lines of {log}:[/]\n{tail}")
        raise typer.Exit(rc)
    console.print(f"[green]✓[/] {what} [dim]({dt:.1f}s)[/]")
    return dt


def _dvc_md5(pointer: Path) -> str | None:
    """The directory hash recorded in a ``.dvc`` pointer file."""
    if not pointer.exists():
        return None
    for line in pointer.read_text().splitlines():
        line = line.strip().lstrip("- ")
        if line.startswith("md5:"):
            return line.split(":", 1)[1].strip()
    return None


def demo_env(repo: Path, s: FloraSettings) -> dict[str, str]:
    """Environment for the demo's subprocesses: embedded Airflow, DVC and Flora state."""
    home = (repo / s.home).resolve() if not s.home.is_absolute() else s.home
    return {
        **os.environ,
        "FLORA_HOME": str(home),
        "AIRFLOW_HOME": str(home / "airflow"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(repo / "dags"),
        "DVC_SITE_CACHE_DIR": str(home / "dvc-site-cache"),
        "GX_ANALYTICS_ENABLED": "false",
        "HF_HUB_OFFLINE": "1",
        "MPLBACKEND": "Agg",
        "PYTHONUNBUFFERED": "1",
    }


def generate_dataset(root: Path, episodes: int, seed: int) -> bool:
    """Generate the toy world unless an identical one is already there; True if written."""
    from flora.data.synth import SYNTH_META, SynthConfig, default_durations, generate

    meta = root / SYNTH_META
    wanted = SynthConfig(seed, tuple(default_durations(episodes))).to_json()
    if meta.exists():
        have = json.loads(meta.read_text())  # also records layout and per-episode tasks
        if all(have.get(k) == v for k, v in wanted.items()):
            return False
    generate(root, episodes=episodes, seed=seed, overwrite=True, progress=True)
    return True


def main(
    episodes: int = typer.Option(DEMO_EPISODES, help="Toy-world episodes to generate."),
    seed: int = typer.Option(DEMO_SEED, help="Generator seed."),
    regenerate: bool = typer.Option(False, help="Regenerate the dataset even if present."),
    dvc: bool = typer.Option(True, help="Version the dataset with DVC (add + push)."),
) -> None:
    """Run the Flora data engine demo end to end (embedded mode, no services)."""
    t_start = time.perf_counter()
    repo = Path.cwd().resolve()
    if not (repo / "dags" / f"{DAG_ID}.py").exists():
        console.print("[red]run the demo from the repository root (make demo)[/]")
        raise typer.Exit(2)
    s = get_settings()
    env = demo_env(repo, s)
    home = Path(env["FLORA_HOME"])
    log = home / "demo.log"
    dataset = (repo / s.dataset).resolve() if not s.dataset.is_absolute() else s.dataset
    console.rule("[bold]Flora data engine demo")
    console.print(f"dataset {dataset}  ·  state {home}  ·  log {log}")

    # 1. Data.
    t0 = time.perf_counter()
    if regenerate and dataset.exists():
        import shutil

        shutil.rmtree(dataset)
    wrote = generate_dataset(dataset, episodes, seed)
    verb = "generated" if wrote else "already present (deterministic; use --regenerate)"
    console.print(f"[green]✓[/] toy world {verb} [dim]({time.perf_counter() - t0:.1f}s)[/]")

    # 2. DVC: the pointer covers datasets/ (one directory hash for all datasets).
    pointer = repo / "datasets.dvc"
    before = _dvc_md5(pointer)
    if dvc and (repo / ".dvc").is_dir():
        tracked = dataset.parent.relative_to(repo)
        _run([_bin("dvc"), "add", str(tracked)], env=env, cwd=repo, log=log, what="dvc add")
        _run([_bin("dvc"), "push"], env=env, cwd=repo, log=log, what="dvc push (local remote)")
        after = _dvc_md5(pointer)
        if before == after:
            console.print(f"  datasets.dvc unchanged: the data matches the committed md5 {after}")
        elif before is None:
            console.print(f"  created datasets.dvc (md5 {after}): commit it")
        else:
            console.print(
                f"  [yellow]datasets.dvc changed[/] ({before} -> {after}): commit it "
                "with the generator change that caused it"
            )
    elif dvc:
        console.print("[yellow]no .dvc/ here: skipping data versioning[/]")

    # 3. Orchestration: the DAG runs every engine step.
    _run([_bin("airflow"), "db", "migrate"], env=env, cwd=repo, log=log, what="airflow db migrate")
    conf = json.dumps({"dataset": str(dataset)})
    _run(
        [_bin("airflow"), "dags", "test", DAG_ID, "--conf", conf],
        env=env,
        cwd=repo,
        log=log,
        what=f"airflow dags test {DAG_ID}",
    )

    # 4. Where things are.
    _summary(home, dataset, env, time.perf_counter() - t_start)


def _summary(home: Path, dataset: Path, env: dict[str, str], elapsed: float) -> None:
    from mlflow.tracking import MlflowClient

    s = FloraSettings(home=home)
    client = MlflowClient(tracking_uri=s.tracking_uri)
    exp = client.get_experiment_by_name(s.mlflow_experiment)
    runs = (
        client.search_runs(
            [exp.experiment_id],
            filter_string=f"tags.dataset = '{dataset.name}'",
            order_by=["attributes.start_time DESC"],
            max_results=1,
        )
        if exp
        else []
    )
    t = Table(title="Flora demo results", show_header=False)
    t.add_column(style="bold")
    t.add_column(overflow="fold")
    if runs:
        r = runs[0]
        m = r.data.metrics
        t.add_row("MLflow run", f"{r.info.run_name} ({r.info.run_id}) — {r.info.status}")
        t.add_row(
            "episodes",
            f"{int(m.get('ingest.episodes', 0))} ingested, "
            f"{int(m.get('validation.valid_episodes', 0))} valid",
        )
        t.add_row("validation", r.data.tags.get("validation.raw", "?"))
        t.add_row("steps", r.data.tags.get("flora.steps", "?"))
    t.add_row("MLflow store", s.tracking_uri)
    t.add_row(
        "MLflow UI",
        f"mlflow ui --backend-store-uri {s.tracking_uri} --default-artifact-root "
        f"{s.artifact_root.as_uri()}",
    )
    out = s.outputs_dir.resolve()
    t.add_row("outputs", f"{out} (manifest/, validation/, one folder per engine table)")
    t.add_row("DVC remote", str(s.dvc_remote.resolve()))
    t.add_row("Airflow", f"AIRFLOW_HOME={env['AIRFLOW_HOME']} (SQLite, dags test)")
    t.add_row("elapsed", f"{elapsed:.0f}s")
    console.print(t)


app = typer.Typer(add_completion=False)
app.command()(main)

if __name__ == "__main__":
    app()
