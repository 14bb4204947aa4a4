"""``python -m flora.demo`` (``make demo``): the embedded data engine, end to end, on one machine.

1. Generate the toy-world dataset (``datasets/toy_world``; deterministic, so the bytes
   match the committed ``datasets.dvc`` pointer).
2. ``dvc add datasets`` and ``dvc push`` to the local remote (``.flora/dvc-remote``).
3. Run the ``flora_data_engine`` Airflow DAG with ``airflow dags test`` on SQLite
   (``AIRFLOW_HOME=.flora/airflow``): ingest -> validate -> segment -> caption -> outcome /
   dense / rubric rewards -> report, all logged to one MLflow run. Embedded backends: the
   kinematic segmenter on every valid episode; the tiny random VLM (built once into
   ``.flora/models/tiny``) captions and rewards the first ``--vlm-episodes`` valid
   episodes (its outputs are mostly rejected and recorded as failures with reasons).
4. Print where each table is, its rows and failures, the kinematic baseline's
   segmentation F1@0.5 against the toy world's ground truth (also in MLflow as
   ``segment.f1_at_0.5``), the MLflow UI command, the DVC remote and the elapsed time.

Airflow and DVC run as subprocesses (their CLIs, exactly as a user would call them);
``flora`` itself never imports Airflow.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from flora.settings import FloraSettings, get_settings

DAG_ID = "flora_data_engine"
DEMO_EPISODES = 10
DEMO_SEED = 0
#: Where the demo writes its toy world (under ``datasets/``, which ``datasets.dvc`` tracks).
DEMO_DATASET = Path("datasets") / "toy_world"
#: Valid episodes the tiny VLM captions and rewards in the demo (0 = all). Measured on
#: 2 shared cores at the steps' default budgets: 2 episodes (8 s + 20 s of video) took
#: 230 s of VLM work on a quiet machine and 580 s while another job held a core, so the
#: demo does 1; all 10 episodes (475 s of video) would take far more than 10 minutes.
DEMO_VLM_EPISODES = 1
#: Airflow ``dags test`` log line that starts a task (used for the live status line).
_TASK_START = re.compile(r"\[DAG TEST\] starting task_id=(\S+)")

console = Console()
if not console.is_terminal:  # piped / CI log: Rich would wrap at 80 columns
    console.width = 120


def _bin(name: str) -> str:
    """A console script of this interpreter's environment (airflow, dvc)."""
    p = Path(sys.executable).parent / name
    return str(p) if p.exists() else name


def _run(
    cmd: list[str],
    *,
    env: dict[str, str],
    cwd: Path,
    log: Path,
    what: str,
    watch: re.Pattern[str] | None = None,
) -> float:
    """Run a command under a spinner, appending its output to ``log``; raise on failure.

    With ``watch``, the spinner shows the first group of the last log line it matched
    (the DAG task now running).
    """
    t0 = time.perf_counter()
    log.parent.mkdir(parents=True, exist_ok=True)
    with console.status(f"[bold]{what}[/] …") as status, log.open("a") as fh:
        fh.write(f"\n$ {' '.join(cmd)}\n")
        fh.flush()
        start = fh.tell()
        proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=fh, stderr=subprocess.STDOUT)
        seen: list[str] = []
        while proc.poll() is None:
            time.sleep(0.5)
            if watch is None:
                continue
            with log.open() as rd:
                rd.seek(start)
                found = watch.findall(rd.read())
            for name in found[len(seen) :]:
                if seen:
                    console.print(f"  [dim]· {seen[-1]} done ({time.perf_counter() - t0:.0f}s)[/]")
                seen.append(name)
            if seen:
                status.update(f"[bold]{what}[/] … {seen[-1]} ({len(seen)})")
        rc = proc.returncode
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


def generate_dataset(
    root: Path, episodes: int, seed: int, *, regenerate: bool = False, overwrite: bool = False
) -> bool:
    """Generate the toy world unless an identical one is already there; True if written.

    Only a toy world made by ``flora synth`` (its ``meta/flora_synth.json``) is ever
    replaced; a folder holding anything else is refused with
    :class:`flora.safety.OutputDirError` unless ``overwrite``. ``regenerate`` rewrites an
    identical toy world too.
    """
    from flora.data.synth import SYNTH_META, SynthConfig, default_durations, generate
    from flora.safety import ensure_own_output_dir

    meta = root / SYNTH_META
    wanted = SynthConfig(seed, tuple(default_durations(episodes))).to_json()
    if meta.is_file() and not regenerate:
        try:  # also records layout and per-episode tasks
            have = json.loads(meta.read_text())
        except (OSError, ValueError):
            have = {}
        if isinstance(have, dict) and all(have.get(k) == v for k, v in wanted.items()):
            return False
    ensure_own_output_dir(root, "toy world", overwrite=overwrite, markers=(SYNTH_META,))
    generate(root, episodes=episodes, seed=seed, overwrite=True, progress=True)
    return True


def main(
    episodes: int = typer.Option(DEMO_EPISODES, help="Toy-world episodes to generate."),
    seed: int = typer.Option(DEMO_SEED, help="Generator seed."),
    regenerate: bool = typer.Option(False, help="Regenerate the dataset even if present."),
    overwrite: bool = typer.Option(
        False, help=f"Replace {DEMO_DATASET} even if it is not a toy world Flora made."
    ),
    dvc: bool = typer.Option(True, help="Version the dataset with DVC (add + push)."),
    vlm_episodes: int = typer.Option(
        DEMO_VLM_EPISODES, help="Valid episodes the VLM steps caption/reward (0 = all)."
    ),
    max_attempts: int = typer.Option(3, min=1, help="Bounded parse attempts per VLM item."),
    max_new_tokens: int = typer.Option(
        0, min=0, help="Cap on each VLM step's generation budget (0 = step defaults)."
    ),
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
    # The demo writes its toy world to its own folder, never to FLORA_DATASET: that one is
    # the DAGs' input and may be a real dataset (the DAG run gets this path in its conf).
    dataset = (repo / DEMO_DATASET).resolve()
    configured = (repo / s.dataset).resolve() if not s.dataset.is_absolute() else s.dataset
    console.rule("[bold]Flora data engine demo")
    console.print(f"dataset {dataset}  ·  state {home}  ·  log {log}")
    if configured != dataset:
        console.print(f"  [dim]FLORA_DATASET={configured} is left alone: the demo uses its own[/]")

    # 1. Data.
    t0 = time.perf_counter()
    from flora.safety import OutputDirError

    try:
        wrote = generate_dataset(dataset, episodes, seed, regenerate=regenerate,
                                 overwrite=overwrite)  # fmt: skip
    except OutputDirError as e:
        console.print(f"[red]✗ {e}[/]")
        raise typer.Exit(2) from e
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
    conf = json.dumps(
        {
            "dataset": str(dataset),
            "vlm_max_episodes": vlm_episodes or None,
            "max_attempts": max_attempts,
            "max_new_tokens": max_new_tokens or None,
        }
    )
    vlm = "all valid episodes" if not vlm_episodes else f"the first {vlm_episodes} valid episodes"
    console.print(
        f"  segment: FLORA_BACKEND={s.backend}; caption + rewards: "
        f"{'tiny random VLM' if s.backend == 'kinematic' else s.backend} on {vlm}"
    )
    _run(
        [_bin("airflow"), "dags", "test", DAG_ID, "--conf", conf],
        env=env,
        cwd=repo,
        log=log,
        what=f"airflow dags test {DAG_ID}",
        watch=_TASK_START,
    )

    # 4. Where things are.
    _summary(home, dataset, env, time.perf_counter() - t_start)


def _latest_run(client: Any, s: FloraSettings, dataset: Path) -> Any | None:
    exp = client.get_experiment_by_name(s.mlflow_experiment)
    if exp is None:
        return None
    runs = client.search_runs(
        [exp.experiment_id],
        filter_string=f"tags.dataset = '{dataset.name}'",
        order_by=["attributes.start_time DESC"],
        max_results=1,
    )
    return runs[0] if runs else None


def _engine_summary(outputs: Path, dataset: Path, run_id: str) -> dict[str, Any]:
    """The ``report`` task's per-table summary of this run (empty if it did not run)."""
    p = outputs / "runs" / dataset.name / f"{run_id}.json"
    return json.loads(p.read_text()) if p.exists() else {}


def _short(path: str) -> str:
    """A path relative to the working directory when it is inside it."""
    p = Path(path)
    return str(p.relative_to(Path.cwd())) if p.is_relative_to(Path.cwd()) else path


def _summary(home: Path, dataset: Path, env: dict[str, str], elapsed: float) -> None:
    from mlflow.tracking import MlflowClient

    s = FloraSettings(home=home)
    client = MlflowClient(tracking_uri=s.tracking_uri)
    r = _latest_run(client, s, dataset)
    tables = _engine_summary(s.outputs_dir.resolve(), dataset, r.info.run_id) if r else {}

    if tables:
        tt = Table(title="Engine tables (this run)")
        for col in ("table", "model", "episodes in", "rows", "failures", "suite", "location"):
            tt.add_column(col, overflow="fold")
        for name, t in tables.items():
            fails = f"{t['failures']} ({t['failed_episodes']} ep.)" if t["failures"] else "0"
            tt.add_row(name, t["model"], str(t["episodes_in"]), str(t["rows"]), fails,
                       t["valid"], _short(t["table_dir"]))  # fmt: skip
        console.print(tt)
        console.print("[dim]failed items and their reasons: <table>/_failures/*.json[/]")
        for name, t in tables.items():
            for ex in t.get("failure_examples", [])[:1]:
                console.print(Text(f"  {name}: {ex[:160]}", style="dim"))

    t = Table(title="Flora demo results", show_header=False)
    t.add_column(style="bold")
    t.add_column(overflow="fold")
    if r:
        m = r.data.metrics
        t.add_row("MLflow run", f"{r.info.run_name} ({r.info.run_id}) — {r.info.status}")
        t.add_row(
            "episodes",
            f"{int(m.get('ingest.episodes', 0))} ingested, "
            f"{int(m.get('validation.valid_episodes', 0))} valid",
        )
        t.add_row("validation", r.data.tags.get("validation.raw", "?"))
        t.add_row("steps", r.data.tags.get("flora.steps", "?"))
        if "segment.f1_at_0.5" in m:
            t.add_row(
                "segmentation",
                f"kinematic baseline vs toy ground truth: F1@0.5 = {m['segment.f1_at_0.5']:.3f} "
                f"(P {m.get('segment.precision_at_0.5', float('nan')):.3f}, "
                f"R {m.get('segment.recall_at_0.5', float('nan')):.3f}; "
                f"mean tIoU {m.get('segment.mean_tiou', float('nan')):.3f}; "
                f"{int(m.get('segment.n_pred', 0))} predicted / "
                f"{int(m.get('segment.n_ref', 0))} true events) — MLflow segment.f1_at_0.5",
            )
    t.add_row("MLflow store", s.tracking_uri)
    t.add_row(
        "MLflow UI",
        f"mlflow ui --backend-store-uri {s.tracking_uri} --default-artifact-root "
        f"{s.artifact_root.as_uri()}",
    )
    out = s.outputs_dir.resolve()
    t.add_row("outputs", f"{out} (manifest/, validation/, runs/, one folder per engine table)")
    t.add_row("DVC remote", str(s.dvc_remote.resolve()))
    t.add_row("Airflow", f"AIRFLOW_HOME={env['AIRFLOW_HOME']} (SQLite, dags test)")
    t.add_row("elapsed", f"{elapsed:.0f}s")
    console.print(t)


app = typer.Typer(add_completion=False)
app.command()(main)

if __name__ == "__main__":
    app()
