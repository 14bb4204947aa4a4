"""Airflow for DAG tests: a temporary AIRFLOW_HOME with a migrated SQLite metadata DB.

Airflow reads its configuration when first imported, so the environment is set here
(before any test imports airflow) and ``airflow db migrate`` runs once per module in a
subprocess (measured: 3–12 s on SQLite); the environment is restored afterwards.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def airflow_home(tmp_path_factory):
    """AIRFLOW_HOME with a migrated DB; FLORA_HOME next to it. Returns (airflow, flora) homes."""
    base = tmp_path_factory.mktemp("airflow")
    home, flora_home = base / "airflow_home", base / "flora_home"
    env = {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        "FLORA_HOME": str(flora_home),
        "GX_ANALYTICS_ENABLED": "false",
    }
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    t0 = time.perf_counter()
    subprocess.run(
        [str(Path(sys.executable).parent / "airflow"), "db", "migrate"],
        check=True,
        capture_output=True,
        env=os.environ.copy(),
        timeout=300,
    )
    print(f"airflow db migrate: {time.perf_counter() - t0:.1f}s")
    from flora.settings import get_settings

    get_settings.cache_clear()
    yield home, flora_home
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    get_settings.cache_clear()
