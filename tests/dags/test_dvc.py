"""DVC: repo config, add/push/pull round trip, and the committed datasets.dvc pointer.

The demo dataset is deterministic, so regenerating it must reproduce the directory hash
recorded in the committed ``datasets.dvc`` (else the pointer is stale).
"""

from __future__ import annotations

import filecmp
import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


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
    from tests.conftest import run_dvc

    return run_dvc(args, cwd)


# ``demo_repo`` (a scratch repo with the demo dataset ``dvc add``-ed) is a session fixture
# in tests/conftest.py: the CI data checks validate the same regenerated dataset.


def _pointer(repo: Path) -> dict:
    from tests.conftest import demo_pointer

    return demo_pointer(repo)


def test_committed_pointer_matches_regenerated_demo_dataset(demo_repo, tmp_path):
    """A stale pointer differs on every regeneration; the rare video byte flip does not
    (tests.conftest.demo_repo_as_committed regenerates once before calling it stale)."""
    from tests.conftest import demo_repo_as_committed

    committed = _pointer(REPO)
    fresh = _pointer(demo_repo_as_committed(demo_repo, tmp_path))
    assert fresh["path"] == committed["path"] == "datasets"
    assert fresh["md5"] == committed["md5"]
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
