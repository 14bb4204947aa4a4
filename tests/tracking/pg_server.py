"""A real PostgreSQL and an MLflow tracking server on it, on loopback, for the tests.

PostgreSQL refuses to run as root, so when the tests run as root the cluster is created and
started as the ``postgres`` OS user (``runuser``) in a fresh temp directory that user owns;
as any other user it runs as that user. Both listen on 127.0.0.1 only, on free ports. The
MLflow server stores runs and the registry in that database
(``postgresql+psycopg://`` — psycopg 3, pinned in requirements.lock) and artifacts under a
local ``file://`` root (the client writes them directly, as with an object store).

Anything that fails raises ``PgServerError`` with the log: the fixture must fail loudly,
never skip (tools/ensure_postgres.sh installs the server in ``make test``).
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from flora.ports import free_port


class PgServerError(RuntimeError):
    """PostgreSQL or the MLflow server could not be started."""


def _pg_bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if found:
        return found[-1]  # the newest installed major version
    path = shutil.which(name)
    if path is None:
        raise PgServerError(
            f"PostgreSQL's {name} not found: run tools/ensure_postgres.sh (apt-get install "
            "postgresql)"
        )
    return path


def _as_pg_user(cmd: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return cmd
    return ["runuser", "-u", "postgres", "--", *cmd]


def _run(cmd: list[str], what: str) -> None:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise PgServerError(f"{what} failed ({r.returncode}): {r.stdout}\n{r.stderr}")


@dataclass
class Postgres:
    """A running cluster: ``url`` is a SQLAlchemy URL for MLflow."""

    data_dir: Path
    port: int
    url: str


@contextmanager
def postgres(database: str = "mlflow") -> Iterator[Postgres]:
    """initdb + pg_ctl start on 127.0.0.1:<free port>; stopped and removed on exit."""
    root = Path(tempfile.mkdtemp(prefix="flora-pg-"))
    data = root / "data"
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    root.chmod(0o700)
    port = free_port()
    log = root / "postgres.log"
    pg_ctl = _pg_bin("pg_ctl")
    started = False
    try:
        _run(
            _as_pg_user(
                [_pg_bin("initdb"), "-D", str(data), "-U", "flora", "--auth=trust", "-E", "UTF8"]
            ),
            "initdb",
        )
        opts = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off"
        try:
            _run(
                _as_pg_user(
                    [pg_ctl, "-D", str(data), "-o", opts, "-l", str(log), "-w", "-t", "60", "start"]
                ),
                "pg_ctl start",
            )
        except PgServerError as e:
            tail = log.read_text()[-3000:] if log.exists() else ""
            raise PgServerError(f"{e}\n{tail}") from e
        started = True
        _run(
            _as_pg_user(
                [_pg_bin("createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "flora", database]
            ),
            "createdb",
        )
        yield Postgres(data, port, f"postgresql+psycopg://flora@127.0.0.1:{port}/{database}")
    finally:
        if started:
            subprocess.run(
                _as_pg_user([pg_ctl, "-D", str(data), "-m", "fast", "-w", "stop"]),
                capture_output=True,
                timeout=60,
            )
        shutil.rmtree(root, ignore_errors=True)


@dataclass
class MlflowServer:
    """A running ``mlflow server``: ``url`` is its tracking URI."""

    url: str
    proc: subprocess.Popen
    artifact_root: Path
    backend_store_uri: str


@contextmanager
def mlflow_server(pg: Postgres, workdir: Path, timeout_s: float = 180.0) -> Iterator[MlflowServer]:
    """``mlflow server`` on 127.0.0.1:<free port> over ``pg`` (one worker)."""
    artifacts = workdir / "artifacts"
    artifacts.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = workdir / "mlflow-server.log"
    mlflow_bin = str(Path(sys.executable).with_name("mlflow"))
    cmd = [
        mlflow_bin,
        "server",
        "--backend-store-uri",
        pg.url,
        "--default-artifact-root",
        artifacts.resolve().as_uri(),
        "--no-serve-artifacts",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", MLFLOW_ENABLE_TELEMETRY="false")
    with log.open("w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise PgServerError(
                    f"mlflow server exited ({proc.returncode}):\n{log.read_text()[-4000:]}"
                )
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise PgServerError(
                    f"mlflow server not up in {timeout_s}s:\n{log.read_text()[-4000:]}"
                )
            time.sleep(0.5)
        yield MlflowServer(url, proc, artifacts, pg.url)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@contextmanager
def postgres_mlflow(workdir: Path) -> Iterator[MlflowServer]:
    """PostgreSQL + an MLflow server on it, both on loopback; torn down on exit."""
    with postgres() as pg, mlflow_server(pg, workdir) as server:
        yield server


@pytest.fixture(scope="session")
def mlflow_pg_server(tmp_path_factory) -> Iterator[MlflowServer]:
    """Session-wide MLflow server on a real PostgreSQL (loopback). Fails loudly, never skips."""
    with postgres_mlflow(tmp_path_factory.mktemp("mlflow_pg")) as server:
        yield server


__all__ = [
    "MlflowServer",
    "PgServerError",
    "Postgres",
    "free_port",
    "mlflow_pg_server",
    "mlflow_server",
    "postgres",
    "postgres_mlflow",
]
