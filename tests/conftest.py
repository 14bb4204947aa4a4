"""Shared test setup: offline/headless env and the session-wide tiny toy dataset."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# A test run that changes the user's checkout fails, naming the files (tests/checkout_guard.py).
from tests.checkout_guard import pytest_sessionfinish, pytest_sessionstart  # noqa: F401

# Session fixture: MLflow on a real PostgreSQL for the tracking and registry tests.
from tests.tracking.pg_server import mlflow_pg_server  # noqa: F401

# Tests run offline and headless on every machine.
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("MPLBACKEND", "Agg")

TINY_SEED = 7


@pytest.fixture(scope="session", autouse=True)
def _migrated_mlflow_sqlite(tmp_path_factory):
    """Fresh SQLite MLflow stores start from this worker's once-migrated schema
    (tests/mlflow_template.py): the migrations cost seconds per fresh FLORA_HOME."""
    from tests.mlflow_template import patched_mlflow_migrations

    yield from patched_mlflow_migrations(tmp_path_factory.mktemp("mlflow_schema") / "mlflow.db")


TINY_DURATIONS_S = (6.0, 14.0, 26.0)


@pytest.fixture(scope="session")
def tiny_dataset(tmp_path_factory):
    """Root of a tiny LeRobot v3.0 toy-world dataset (3 episodes: 6 s, 14 s, 26 s).

    Two cameras (top "main" 96x96, "wrist" 96x96), 20 fps, two episodes per video file,
    ground truth under ``<root>/ground_truth``. Episode 0 is a clean success, episode 1
    has a missed grasp, episode 2 a collision and a hesitation. Treat it as read-only
    (copy it to damage it).
    """
    from flora.data.synth import generate

    root = tmp_path_factory.mktemp("tiny") / "toy_tiny"
    return generate(
        root,
        episodes=len(TINY_DURATIONS_S),
        seed=TINY_SEED,
        durations_s=TINY_DURATIONS_S,
        episodes_per_file=2,
        progress=False,
    )


@pytest.fixture(scope="session")
def tiny_vlm_dir(tmp_path_factory):
    """Factory ``tiny_vlm_dir(family="qwen3_vl") -> Path`` of a tiny random Qwen-VL checkpoint.

    Families: ``qwen3_vl``, ``qwen2_5_vl``, ``qwen3_5``. Each is built offline (a few
    seconds) at most once per session and shared by every test that asks for it; loads via
    ``AutoModelForImageTextToText`` / ``flora.backends.processing.load_processor``. Treat it
    as read-only (copy it to change it).
    """

    from flora.backends.tiny import build_tiny_vlm

    root = tmp_path_factory.mktemp("tiny_vlm")
    cache: dict[str, Path] = {}

    def make(family: str = "qwen3_vl") -> Path:
        if family not in cache:
            cache[family] = build_tiny_vlm(root / family, family=family)
        return cache[family]

    return make


@pytest.fixture
def isolated_home(tmp_path, monkeypatch):
    """Point settings (MLflow store, outputs) at a fresh FLORA_HOME for one test."""
    from flora.settings import get_settings

    home = tmp_path / "flora_home"
    monkeypatch.setenv("FLORA_HOME", str(home))
    monkeypatch.delenv("FLORA_MLFLOW_TRACKING_URI", raising=False)
    get_settings.cache_clear()
    yield home
    get_settings.cache_clear()


def run_dvc(args: list[str], cwd) -> str:
    """Run the ``dvc`` CLI of this environment in ``cwd`` (site cache kept inside it)."""
    import subprocess
    import sys
    from pathlib import Path

    dvc = str(Path(sys.executable).parent / "dvc")
    env = {**os.environ, "DVC_SITE_CACHE_DIR": str(Path(cwd) / ".flora" / "dvc-site-cache")}
    p = subprocess.run([dvc, *args], cwd=cwd, env=env, capture_output=True, text=True)
    assert p.returncode == 0, f"dvc {' '.join(args)} failed:\n{p.stdout}\n{p.stderr}"
    return p.stdout


def build_demo_repo(repo: os.PathLike | str) -> os.PathLike:
    """A scratch git repo at ``repo`` with this repo's DVC setup and the demo dataset,
    generated exactly as ``make demo`` does (``flora.demo.generate_dataset`` with the demo's
    episodes and seed) into ``<repo>/datasets/toy_world`` and ``dvc add``-ed."""
    import shutil
    import subprocess
    from pathlib import Path

    from flora.demo import DEMO_EPISODES, DEMO_SEED, generate_dataset

    src = Path(__file__).resolve().parents[1]
    repo = Path(repo)
    repo.mkdir(parents=True)
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    shutil.copytree(src / ".dvc", repo / ".dvc", ignore=shutil.ignore_patterns("tmp", "cache"))
    shutil.copy(src / ".dvcignore", repo / ".dvcignore")
    shutil.copy(src / ".gitignore", repo / ".gitignore")
    generate_dataset(repo / "datasets" / "toy_world", DEMO_EPISODES, DEMO_SEED)
    run_dvc(["add", "datasets"], repo)
    return repo


def demo_pointer(repo: os.PathLike | str) -> dict:
    """The ``outs`` entry of ``<repo>/datasets.dvc`` (md5, size, nfiles, path)."""
    from pathlib import Path

    import yaml

    return yaml.safe_load((Path(repo) / "datasets.dvc").read_text())["outs"][0]


def demo_repo_as_committed(demo_repo: os.PathLike | str, scratch: os.PathLike | str):
    """``demo_repo`` when its ``datasets.dvc`` equals the committed one; else a second
    generation at ``scratch``, which must (tests/flips.py: the rare video byte flip does not
    come twice in a row; a stale pointer differs every time). A flip is reported as a
    warning naming the files the two generations disagree on."""
    import filecmp
    import warnings
    from pathlib import Path

    committed = demo_pointer(Path(__file__).resolve().parents[1])
    first = Path(demo_repo)
    if demo_pointer(first)["md5"] == committed["md5"]:
        return first
    again = Path(build_demo_repo(Path(scratch) / "again"))
    # A file only one generation has counts as differing.
    differ = [p.relative_to(first) for p in sorted(first.rglob("datasets/**/*"))
              if p.is_file() and not ((again / p.relative_to(first)).is_file()
              and filecmp.cmp(p, again / p.relative_to(first), shallow=False))]  # fmt: skip
    assert demo_pointer(again)["md5"] == committed["md5"], (
        "datasets.dvc is stale (two regenerations differ from it): run `make demo` and "
        "commit datasets.dvc"
    )
    warnings.warn(f"one of two demo-dataset generations differed in {differ} (the rare "
                  "video byte flip, docs/dataset.md); the other matches the committed "
                  "datasets.dvc", stacklevel=2)  # fmt: skip
    return again


@pytest.fixture(scope="session")
def demo_repo(tmp_path_factory):
    """:func:`build_demo_repo` once per session, so the scratch ``datasets.dvc`` must equal
    the committed one. Session-wide: generating the 10-episode toy world is the expensive
    part (~30-60 s on 2 shared cores), and both the DVC tests and the CI data checks
    (tests/validation/test_ci_data_checks.py) use it. Tests that change it must restore it
    (the push/pull test does).
    """
    return build_demo_repo(tmp_path_factory.mktemp("dvc") / "repo")
