"""Triggering as users do: a real Airflow (api-server, scheduler, dag-processor) on
loopback, ``flora_data_engine`` triggered over the REST v2 API with a ``conf`` (issue 12).

Auth is Airflow 3's SimpleAuthManager with a user and a password file, so the test gets a
JWT from ``/auth/token`` exactly as the README shows; every process binds 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from flora.ports import free_port

REPO = Path(__file__).resolve().parents[2]
DAG_ID = "flora_data_engine"
DEADLINE_S = 900  # generous: the whole engine runs on two shared cores


@pytest.fixture(scope="module")
def airflow_services(tmp_path_factory, tiny_dataset):
    base = tmp_path_factory.mktemp("airflow_rest")
    home, flora_home = base / "airflow_home", base / "flora_home"
    home.mkdir()
    (home / "passwords.json").write_text(json.dumps({"flora": "flora-test-password"}))
    port = free_port()
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__PARALLELISM": "2",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "flora:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "passwords.json"),
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
        "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "False",
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
        "FLORA_HOME": str(flora_home),
        "GX_ANALYTICS_ENABLED": "false",
        "OMP_NUM_THREADS": "1",
    }
    airflow = str(Path(sys.executable).parent / "airflow")
    subprocess.run([airflow, "db", "migrate"], env=env, check=True, capture_output=True,
                   timeout=600)  # fmt: skip
    procs = []
    logs = []
    for cmd in (["api-server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                ["scheduler"], ["dag-processor"]):  # fmt: skip
        log = open(base / f"{cmd[0]}.log", "w")  # noqa: SIM115 - closed below
        logs.append(log)
        procs.append(subprocess.Popen([airflow, *cmd], env=env, stdout=log,
                                      stderr=subprocess.STDOUT))  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                if httpx.get(f"{url}/api/v2/monitor/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                tails = {p.name: p.read_text()[-2000:] for p in base.glob("*.log")}
                pytest.fail(f"Airflow did not come up: {tails}")
            time.sleep(2)
        yield url, flora_home, base
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
        for log in logs:
            log.close()


def test_trigger_data_engine_over_rest_v2(airflow_services, tiny_dataset):
    url, flora_home, base = airflow_services
    tok = httpx.post(
        f"{url}/auth/token",
        json={"username": "flora", "password": "flora-test-password"},
        timeout=30,
    )
    assert tok.status_code == 201, tok.text
    api = httpx.Client(
        base_url=f"{url}/api/v2",
        headers={"Authorization": f"Bearer {tok.json()['access_token']}"},
        timeout=30,
    )
    # the dag-processor has to parse the DAG folder first
    deadline = time.monotonic() + 300
    while api.get(f"/dags/{DAG_ID}").status_code != 200:
        if time.monotonic() > deadline:  # a hang guard, not a speed check
            pytest.fail((base / "dag-processor.log").read_text()[-3000:])
        time.sleep(3)
    assert api.patch(f"/dags/{DAG_ID}", json={"is_paused": False}).status_code == 200
    conf = {"dataset": str(tiny_dataset), "vlm_max_episodes": 1, "max_new_tokens": 16}
    r = api.post(f"/dags/{DAG_ID}/dagRuns", json={"logical_date": None, "conf": conf})
    assert r.status_code == 200, r.text
    run_id = r.json()["dag_run_id"]
    assert r.json()["conf"] == conf
    deadline = time.monotonic() + DEADLINE_S
    while True:
        state = api.get(f"/dags/{DAG_ID}/dagRuns/{run_id}").json()["state"]
        if state in ("success", "failed"):
            break
        if time.monotonic() > deadline:  # a hang guard, not a speed check
            pytest.fail((base / "scheduler.log").read_text()[-3000:])
        time.sleep(5)
    tis = api.get(f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances").json()["task_instances"]
    states = {(t["task_id"], t["map_index"]): t["state"] for t in tis}
    assert state == "success", (states, (base / "scheduler.log").read_text()[-3000:])
    assert states[("ingest", -1)] == "success"
    # The engine steps ran once per episode shard (dynamic task mapping, 2 by default).
    assert {m for t, m in states if t == "shard.segment"} == {0, 1}
    assert all(st == "success" for (t, _), st in states.items() if t.startswith("shard."))
    events = list((flora_home / "outputs" / "events").glob("*.parquet"))
    assert len(events) == 3  # one part per episode of the tiny dataset
