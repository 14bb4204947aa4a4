"""DVC: repo config, add/push/pull round trip, and the committed datasets.dvc pointer.

The demo dataset is deterministic, so regenerating it must reproduce the directory hash
recorded in the committed ``datasets.dvc`` (else the pointer is stale).
"""

from __future__ import annotations

import filecmp
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DVC = str(Path(sys.executable).parent / "dvc")


def test_repo_dvc_config_points_inside_the_repo():
    from dvc.config import Config

    cfg = Config(dvc_dir=str(REPO / ".dvc"), validate=True)
    core = cfg["core"]
    assert core["remote"] == "local"
    assert core["autostage"] is False and core["analytics"] is False
    site = Path(core["site_cache_dir"])
    assert not site.is_absolute() and site.parts[0] == ".flora"
    url = Path(cfg["remote"]["local"]["url"]).resolve()
    assert url == (REPO / ".flora" / "dvc-remote").resolve()
    assert (REPO / ".dvc" / ".gitignore").read_text().split() == ["/config.local", "/tmp", "/cache"]


def _dvc(args: list[str], cwd: Path) -> str:
    env = {**os.environ, "DVC_SITE_CACHE_DIR": str(cwd / ".flora" / "dvc-site-cache")}
    p = subprocess.run([DVC, *args], cwd=cwd, env=env, capture_output=True, text=True)
    assert p.returncode == 0, f"dvc {' '.join(args)} failed:\n{p.stdout}\n{p.stderr}"
    return p.stdout


@pytest.fixture(scope="module")
def demo_repo(tmp_path_factory):
    """A scratch git repo with this repo's DVC setup and a freshly generated demo dataset."""
    from flora.data.synth import generate
    from flora.demo import DEMO_EPISODES, DEMO_SEED

    repo = tmp_path_factory.mktemp("dvc") / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    shutil.copytree(REPO / ".dvc", repo / ".dvc", ignore=shutil.ignore_patterns("tmp", "cache"))
    shutil.copy(REPO / ".dvcignore", repo / ".dvcignore")
    shutil.copy(REPO / ".gitignore", repo / ".gitignore")
    generate(repo / "datasets" / "toy_world", DEMO_EPISODES, DEMO_SEED, progress=False)
    _dvc(["add", "datasets"], repo)
    return repo


def test_committed_pointer_matches_regenerated_demo_dataset(demo_repo):
    fresh = yaml.safe_load((demo_repo / "datasets.dvc").read_text())["outs"][0]
    committed = yaml.safe_load((REPO / "datasets.dvc").read_text())["outs"][0]
    assert fresh["path"] == committed["path"] == "datasets"
    assert fresh["md5"] == committed["md5"], (
        "datasets.dvc is stale: run `make demo` and commit datasets.dvc"
    )
    assert (fresh["size"], fresh["nfiles"]) == (committed["size"], committed["nfiles"])


def test_push_then_pull_restores_the_dataset(demo_repo, tmp_path):
    _dvc(["push"], demo_repo)
    remote = demo_repo / ".flora" / "dvc-remote"
    assert any(remote.rglob("*")), "nothing pushed to the local remote"
    # Restore into a clean copy: drop the workspace data and the cache, pull from remote.
    original = tmp_path / "original"
    shutil.copytree(demo_repo / "datasets", original)
    shutil.rmtree(demo_repo / "datasets")
    shutil.rmtree(demo_repo / ".dvc" / "cache")
    _dvc(["pull"], demo_repo)
    cmp = filecmp.dircmp(original, demo_repo / "datasets")
    assert not cmp.left_only and not cmp.right_only and not cmp.diff_files
    pulled = sorted(
        p.relative_to(demo_repo / "datasets") for p in (demo_repo / "datasets").rglob("*")
    )
    assert pulled == sorted(p.relative_to(original) for p in original.rglob("*"))
    for p in original.rglob("*"):
        if p.is_file():
            assert filecmp.cmp(p, demo_repo / "datasets" / p.relative_to(original), shallow=False)
