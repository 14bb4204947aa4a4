"""The curated mixture is versioned with DVC (add + push to the repo's local remote)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]


def test_mixture_is_dvc_added_and_pushed(tmp_path):
    from flora.curate.run import version_with_dvc

    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    shutil.copytree(REPO / ".dvc", repo / ".dvc", ignore=shutil.ignore_patterns("tmp", "cache"))
    shutil.copy(REPO / ".dvcignore", repo / ".dvcignore")
    mix = tmp_path / "mixture.parquet"
    pd.DataFrame({"episode_id": ["toy/000000"], "weight": [1.0]}).to_parquet(mix)
    rec = version_with_dvc(mix, repo, "toy")
    pointer = Path(rec["pointer"])
    assert pointer == repo / "curated" / "toy" / "mixture.parquet.dvc" and rec["pushed"]
    assert yaml.safe_load(pointer.read_text())["outs"][0]["md5"] == rec["md5"]
    remote = repo / ".flora" / "dvc-remote"
    assert any(p.is_file() for p in remote.rglob("*"))
    # Same content -> same md5 (a rerun does not create a new version).
    assert version_with_dvc(mix, repo, "toy")["md5"] == rec["md5"]
    with pytest.raises(FileNotFoundError, match="not a DVC repository"):
        version_with_dvc(mix, tmp_path, "toy")
