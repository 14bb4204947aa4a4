"""Pieces of ``make demo`` that are cheap to check (the full demo is measured in docs)."""

from __future__ import annotations

from pathlib import Path

from flora.demo import DAG_ID, _dvc_md5, demo_env, generate_dataset
from flora.settings import FloraSettings

REPO = Path(__file__).resolve().parents[2]


def test_generate_is_skipped_only_when_an_identical_dataset_exists(tmp_path):
    root = tmp_path / "toy_world"
    assert generate_dataset(root, episodes=1, seed=3) is True
    assert generate_dataset(root, episodes=1, seed=3) is False  # same config: kept
    assert generate_dataset(root, episodes=1, seed=4) is True  # other seed: regenerated


def test_demo_environment_keeps_all_state_under_flora_home(tmp_path):
    env = demo_env(REPO, FloraSettings(home=Path(".flora")))
    home = Path(env["FLORA_HOME"])
    assert home == (REPO / ".flora").resolve()
    assert Path(env["AIRFLOW_HOME"]) == home / "airflow"
    assert Path(env["DVC_SITE_CACHE_DIR"]).is_relative_to(REPO)
    assert env["AIRFLOW__CORE__DAGS_FOLDER"] == str(REPO / "dags")
    assert (REPO / "dags" / f"{DAG_ID}.py").exists()


def test_committed_pointer_is_readable():
    md5 = _dvc_md5(REPO / "datasets.dvc")
    assert md5 is not None and md5.endswith(".dir") and len(md5) == 36
