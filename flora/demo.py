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
4. Close the loop (skipped with ``--no-train``): the ``flora_train_models`` DAG builds the
   sets, trains the three ``small`` Flora models on the short ``*-demo`` recipes (SFT; GRPO
   for segmenter and captioner; the captioner and rewarder fine-tune the project's released
   ``models/small`` weights, the segmenter's LoRA starts from its random base), evaluates
   each on held-out episodes beside its untrained (random) self, registers it, applies the
   promotion gates and renders its deployment. Each model's ``champion`` (else its latest
   ``challenger``; the segmenter only as champion, the kinematic baseline otherwise) is
   served with ``flora serve`` on loopback, and the data-engine DAG runs again through
   those HTTP endpoints in its own ``FLORA_HOME``.
5. Print where each table is, its rows and failures, the held-out scores trained vs
   untrained, the served pass's tables scored against the toy world's ground truth, the
   MLflow UI command, the DVC remote and the elapsed time.

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
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from flora.ports import await_port
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


TRAIN_DAG_ID = "flora_train_models"
DEMO_MODELS = ("segmenter", "captioner", "rewarder")
#: Held-out episodes each model is scored on (trained and untrained) in the demo.
DEMO_EVAL_EPISODES = 2


def train_conf(dataset: Path, *, recipe: str = "demo", eval_episodes: int = DEMO_EVAL_EPISODES,
               models: tuple[str, ...] = DEMO_MODELS) -> dict[str, Any]:  # fmt: skip
    """The ``flora_train_models`` conf of the demo: the short ``*-demo`` recipes, project gates,
    the toy world's ground truth (the first pass's captions come from an untrained model)."""
    return {"dataset": str(dataset), "recipe": recipe, "models": list(models),
            "eval_episodes": eval_episodes, "n_boot": 200, "gates": "project"}  # fmt: skip


@dataclass
class Served:
    """One ``flora serve`` process started from a registered version."""

    model: str
    ref: str  # "champion", or "challenger" when no version passed the gates yet
    version: str
    url: str = ""  # known once the server announced the port it bound
    proc: subprocess.Popen | None = None
    port_file: Path | None = None


def _wait_healthy(sv: Served, timeout_s: float = 600.0) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if sv.proc is not None and sv.proc.poll() is not None:
            raise RuntimeError(f"flora serve for {sv.model} exited {sv.proc.returncode}")
        try:
            with urllib.request.urlopen(sv.url.removesuffix("/v1") + "/health", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1.0)
    raise RuntimeError(f"flora serve for {sv.model} not healthy after {timeout_s:.0f}s")


def pick_version(model: str) -> tuple[str, str] | None:
    """(ref, version) to serve: the ``champion``, else the latest ``challenger``, else None.

    Segmenter: only a champion (the kinematic baseline is the embedded default otherwise).
    """
    from model_registry.promotion import CHAMPION, _alias_version, _client, registered_name
    from model_registry.register import CHALLENGER

    client, name = _client(), registered_name(model)
    try:
        refs = (CHAMPION,) if model == "segmenter" else (CHAMPION, CHALLENGER)
        for ref in refs:
            v = _alias_version(client, name, ref)
            if v is not None:
                return ref, str(v)
    except Exception:  # noqa: BLE001 - a model never registered has no aliases
        return None
    return None


@contextmanager
def serve_models(
    models: tuple[str, ...], env: dict[str, str], log: Path, token: str
) -> Iterator[dict[str, Served]]:
    """Serve each model's registered version with ``flora serve`` on a free loopback port.

    The model comes from the registry's download (as a pod's storage initializer gets
    it); the bearer token from ``FLORA_SERVE_TOKEN``. Every server is stopped on exit,
    also on error.
    """
    from model_registry.register import download_model
    from training.sft import model_paths

    served: dict[str, Served] = {}
    try:
        for model in models:
            picked = pick_version(model)
            if picked is None:
                continue
            ref, version = picked
            base, adapter = model_paths(download_model(model, version))
            # Port 0: the server binds what the OS gives and announces it (no port race).
            port_file = log.parent / f"serve-{model}.port"
            port_file.unlink(missing_ok=True)
            cmd = [_bin("flora"), "serve", "--model", str(base), "--port", "0",
                   "--port-file", str(port_file), "--served-model", "flora",
                   "--device", "cpu"]  # fmt: skip
            if adapter is not None:
                cmd += ["--adapter", str(adapter)]
            fh = log.open("a")
            fh.write(f"\n$ {' '.join(cmd)}\n")
            fh.flush()
            sv = Served(model, ref, version, port_file=port_file)
            sv.proc = subprocess.Popen(cmd, env={**env, "FLORA_SERVE_TOKEN": token,
                                                 "OMP_NUM_THREADS": "1"},
                                       stdout=fh, stderr=subprocess.STDOUT)  # fmt: skip
            served[model] = sv
        for sv in served.values():
            assert sv.proc is not None and sv.port_file is not None
            port = await_port(sv.port_file, sv.proc, 600.0, f"flora serve for {sv.model}")
            sv.url = f"http://127.0.0.1:{port}/v1"
            _wait_healthy(sv)
        yield served
    finally:
        for sv in served.values():
            if sv.proc is not None and sv.proc.poll() is None:
                sv.proc.terminate()
        for sv in served.values():
            if sv.proc is not None:
                try:
                    sv.proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    sv.proc.kill()
                    sv.proc.wait()


def served_env(env: dict[str, str], served: dict[str, Served], token: str,
               tracking_uri: str) -> dict[str, str]:  # fmt: skip
    """Settings of the second data-engine pass: the served models, reached over HTTP.

    Its own ``FLORA_HOME`` (``<home>/served``) so its tables are new (the steps resume from
    their tables), the same MLflow store and Airflow home.
    """
    home = Path(env["FLORA_HOME"]) / "served"
    out = {**env, "FLORA_HOME": str(home), "FLORA_MLFLOW_TRACKING_URI": tracking_uri,
           "FLORA_BACKEND": "openai", "FLORA_OPENAI_API_KEY": token,
           "FLORA_OPENAI_MODEL": "flora"}  # fmt: skip
    for model, sv in served.items():
        out[f"FLORA_{model.upper()}_BASE_URL"] = sv.url
    if "segmenter" not in served:
        out["FLORA_SEGMENTER_BACKEND"] = "kinematic"
    return out


def score_tables(outputs: Path, dataset: Path) -> dict[str, Any]:
    """Score the second pass's tables against the toy world's ground truth."""
    scores: dict[str, Any] = {}
    try:
        from flora.segment.evaluate import evaluate_events, read_events

        scores["events"] = evaluate_events(read_events(outputs), dataset).metrics
    except Exception as e:  # noqa: BLE001 - reported in the summary, the demo goes on
        scores["events"] = {"error": str(e)[:200]}
    try:
        from flora.caption.evaluate import evaluate_captions
        from flora.caption.judges import EmbeddingJudge

        scores["captions"] = evaluate_captions(outputs / "captions", dataset,
                                               EmbeddingJudge()).metrics  # fmt: skip
    except Exception as e:  # noqa: BLE001
        scores["captions"] = {"error": str(e)[:200]}
    try:
        from flora.reward.benchmark import score_tables as score_reward_tables

        scores["rewards"] = score_reward_tables(dataset, outputs)
    except Exception as e:  # noqa: BLE001
        scores["rewards"] = {"error": str(e)[:200]}
    return scores


def _eval_reports(home: Path) -> dict[str, dict[str, Any]]:
    """The latest training run's held-out reports, per model."""
    runs = sorted((home / "training" / TRAIN_DAG_ID).glob("*"), key=lambda p: p.stat().st_mtime)
    if not runs:
        return {}
    return {p.parent.name: json.loads(p.read_text()) for p in runs[-1].glob("*/eval.json")}


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
    train: bool = typer.Option(
        True, help="Train, register, promote and serve the Flora models (--no-train: quick)."
    ),
    recipe: str = typer.Option("demo", help="Recipe size of the trained models."),
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

    # 4. Train -> evaluate -> register -> gate -> promote -> render deployment (Airflow DAG).
    closed: dict[str, Any] = {}
    if train:
        tconf = json.dumps(train_conf(dataset, recipe=recipe))
        _run(
            [_bin("airflow"), "dags", "test", TRAIN_DAG_ID, "--conf", tconf],
            env={**env, "OMP_NUM_THREADS": "1"},
            cwd=repo,
            log=log,
            what=f"airflow dags test {TRAIN_DAG_ID} (recipes *-{recipe})",
            watch=_TASK_START,
        )
        closed = _close_loop(repo, dataset, env, log, conf)
        closed["recipe"] = recipe

    # 5. Where things are.
    _summary(home, dataset, env, time.perf_counter() - t_start, closed)


def _close_loop(
    repo: Path, dataset: Path, env: dict[str, str], log: Path, conf: str
) -> dict[str, Any]:
    """Serve the registered models and run the data engine again through them over HTTP."""
    import secrets

    s = FloraSettings(home=Path(env["FLORA_HOME"]))
    os.environ["FLORA_HOME"] = env["FLORA_HOME"]  # this process reads the same registry
    get_settings.cache_clear()
    token = secrets.token_urlsafe(24)
    with console.status("[bold]flora serve: starting one server per registered model[/] …"), \
            serve_models(DEMO_MODELS, env, log, token) as served:  # fmt: skip
        for sv in served.values():
            console.print(f"[green]✓[/] serving flora-{sv.model} v{sv.version} ({sv.ref}) "
                          f"at {sv.url}")  # fmt: skip
        if "segmenter" not in served:
            console.print("  segmenter: no champion, the kinematic baseline segments")
        env2 = served_env(env, served, token, s.tracking_uri)
        _run([_bin("airflow"), "dags", "test", DAG_ID, "--conf", conf], env=env2, cwd=repo,
             log=log, what=f"airflow dags test {DAG_ID} (served models over HTTP)",
             watch=_TASK_START)  # fmt: skip
    console.print("[green]✓[/] servers stopped")
    outputs = FloraSettings(home=Path(env2["FLORA_HOME"])).outputs_dir.resolve()
    return {
        "served": {m: (sv.ref, sv.version, sv.url) for m, sv in served.items()},
        "outputs": str(outputs),
        "scores": score_tables(outputs, dataset),
    }


def _latest_run(client: Any, s: FloraSettings, dataset: Path, outputs: Path) -> Any | None:
    """The newest data-engine run on ``dataset`` whose summary was written under ``outputs``.

    The demo's two passes log to one MLflow store; each pass has its own outputs folder.
    """
    exp = client.get_experiment_by_name(s.mlflow_experiment)
    if exp is None:
        return None
    runs = client.search_runs(
        [exp.experiment_id],
        filter_string=f"tags.dataset = '{dataset.name}'",
        order_by=["attributes.start_time DESC"],
        max_results=20,
    )
    for r in runs:
        if _engine_summary(outputs, dataset, r.info.run_id):
            return r
    return runs[0] if runs else None


def _engine_summary(outputs: Path, dataset: Path, run_id: str) -> dict[str, Any]:
    """The ``summary`` task's per-table summary of this run (empty if it did not run)."""
    p = outputs / "runs" / dataset.name / f"{run_id}.json"
    return json.loads(p.read_text()) if p.exists() else {}


def _tables_summary(title: str, tables: dict[str, Any]) -> None:
    tt = Table(title=title)
    for col in ("table", "model", "episodes in", "rows", "failures", "suite", "location"):
        tt.add_column(col, overflow="fold")
    for name, t in tables.items():
        fails = f"{t['failures']} ({t['failed_episodes']} ep.)" if t["failures"] else "0"
        tt.add_row(name, t["model"], str(t["episodes_in"]), str(t["rows"]), fails,
                   t["valid"], _short(t["table_dir"]))  # fmt: skip
    console.print(tt)
    for name, t in tables.items():
        for ex in t.get("failure_examples", [])[:1]:
            console.print(Text(f"  {name}: {ex[:160]}", style="dim"))


def _short(path: str) -> str:
    """A path relative to the working directory when it is inside it."""
    p = Path(path)
    return str(p.relative_to(Path.cwd())) if p.is_relative_to(Path.cwd()) else path


def _summary(home: Path, dataset: Path, env: dict[str, str], elapsed: float,
             closed: dict[str, Any] | None = None) -> None:  # fmt: skip
    from mlflow.tracking import MlflowClient

    s = FloraSettings(home=home)
    client = MlflowClient(tracking_uri=s.tracking_uri)
    out = s.outputs_dir.resolve()
    r = _latest_run(client, s, dataset, out)
    tables = _engine_summary(out, dataset, r.info.run_id) if r else {}
    if tables:
        _tables_summary("Engine tables (first pass: kinematic segmenter, untrained tiny VLM)",
                        tables)  # fmt: skip
    if closed:
        served_out = Path(closed["outputs"])
        r2 = _latest_run(client, s, dataset, served_out)
        served_tables = _engine_summary(served_out, dataset, r2.info.run_id) if r2 else {}
        if served_tables:
            _tables_summary("Engine tables (served pass: the registered Flora models over HTTP)",
                            served_tables)  # fmt: skip
    if tables:
        console.print("[dim]failed items and their reasons: <table>/_failures/*.json[/]")

    if closed:
        _models_summary(home, closed)

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
        children = client.search_runs(
            [r.info.experiment_id], f"tags.mlflow.parentRunId = '{r.info.run_id}'",
            max_results=1000,
        )  # fmt: skip
        shards = sorted({c.data.tags.get("flora.shard", "") for c in children} - {"", "all"})
        t.add_row("tasks", f"{len(children)} child runs (one per task; engine steps over "
                           f"{len(shards)} shards: {', '.join(shards) or '-'})")  # fmt: skip
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
    t.add_row(
        "outputs",
        f"{out} (one folder per engine table; manifest/, validation/, "
        "curated/, exports/, reports/, runs/ = run summaries)",
    )
    t.add_row("DVC remote", str(s.dvc_remote.resolve()))
    t.add_row("Airflow", f"AIRFLOW_HOME={env['AIRFLOW_HOME']} (SQLite, dags test)")
    if closed:
        t.add_row("served pass", f"{closed['outputs']} (tables from the served models)")
        t.add_row("registry", "flora registry list captioner  (also segmenter, rewarder)")
    t.add_row(
        "reports",
        f"{out}/reports/{dataset.name}/{r.info.run_id if r else '<MLflow run id>'}/index.html"
        + (f" and {closed['outputs']}/reports/" if closed else ""),
    )
    t.add_row("elapsed", f"{elapsed:.0f}s")
    console.print(t)


# Held-out metrics the demo's summary prints per model, headline first (training.evaluate).
SUMMARY_METRICS = {
    "segmenter": ("r_seg", "f1_at_0.5"),
    "captioner": ("r_cap",),
    "rewarder": ("outcome.mae", "dense.accuracy", "dense.failure_recall", "rubric.l1"),
}


def model_rows(
    reports: dict[str, dict[str, Any]], served: dict[str, tuple[str, int]]
) -> list[tuple[str, ...]]:
    """Rows of the demo's models table: per model and metric, the trained model's held-out
    value beside its untrained self's; the model, what is served and the parse rates on the
    model's first row only."""
    rows = []
    for model in DEMO_MODELS:
        rep = reports.get(model, {})
        flat, base = rep.get("flat", {}), rep.get("baseline", {})
        sv = served.get(model)
        label = f"v{sv[1]} ({sv[0]})" if sv else "not served"
        parse = f"{_fmt(flat.get('eval.parse_rate'))} / {_fmt(base.get('eval.parse_rate'))}"
        for i, metric in enumerate(SUMMARY_METRICS[model]):
            key = "eval." + metric
            rows.append(
                (
                    model if i == 0 else "",
                    label if i == 0 else "",
                    metric,
                    _fmt(flat.get(key)),
                    _fmt(base.get(key)),
                    parse if i == 0 else "",
                )
            )
    return rows


def _models_summary(home: Path, closed: dict[str, Any]) -> None:
    """Per model: what was registered / promoted, held-out metrics trained vs untrained."""
    mt = Table(title="Flora models (held-out episodes: trained vs its untrained self)")
    for col in ("model", "served", "metric", "trained", "untrained", "parse rate (t/u)"):
        mt.add_column(col, overflow="fold")
    for row in model_rows(_eval_reports(home), closed["served"]):
        mt.add_row(*row)
    console.print(mt)
    for line in release_notes(closed.get("recipe", "demo")):
        console.print(f"  {line}")
    st = Table(title="Served pass scored against the toy world's ground truth")
    st.add_column("table")
    st.add_column("metrics", overflow="fold")
    for name, m in closed["scores"].items():
        st.add_row(name, ", ".join(f"{k}={_fmt(v)}" for k, v in list(m.items())[:12]))
    console.print(st)


def release_notes(recipe: str) -> list[str]:
    """Where each model's fine-tune started: the released weights of its recipe's
    ``init_from`` (training.release) with what they measured, or its random base."""
    from training.evaluate import HEADLINE
    from training.recipe import load_recipe
    from training.release import read_release
    from training.sft import init_path

    out = []
    for model in DEMO_MODELS:
        r = load_recipe(f"{model}-{recipe}")
        if r.init_from is None:
            out.append(f"{model}: trained from its random {r.base} base")
            continue
        card = read_release(init_path(r.init_from))
        sft = card["heldout"]["variants"].get("SFT", {}).get("metrics", {})
        data = card.get("data", {})
        out.append(
            f"{model}: fine-tuned from {r.init_from} (released {card.get('date', '?')}, "
            f"trained on {data.get('episodes', '?')} episodes of toy world seed "
            f"{data.get('toy_world_seed', '?')}; its own held-out {HEADLINE[model]} "
            f"{_fmt(sft.get(HEADLINE[model]))}, parse rate {_fmt(sft.get('parse_rate'))})"
        )
    return out


def _fmt(v: Any) -> str:
    return f"{v:.3f}" if isinstance(v, int | float) else ("–" if v is None else str(v))


app = typer.Typer(add_completion=False)
app.command()(main)

if __name__ == "__main__":
    app()
