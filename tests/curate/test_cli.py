"""``flora curate`` / ``flora report`` on the tiny dataset's oracle tables; metadata sources."""

from __future__ import annotations

import shutil

import pandas as pd
import pytest
from typer.testing import CliRunner


@pytest.fixture(scope="module")
def tables(tiny_dataset, tmp_path_factory):
    from flora.curate.oracle import write_oracle_tables

    out = tmp_path_factory.mktemp("cli_tables")
    write_oracle_tables(tiny_dataset, out, "run-gt")
    return out


def test_curate_and_report_commands(tiny_dataset, tables, tmp_path):
    from flora.cli import app

    r = CliRunner().invoke(app, ["curate", str(tiny_dataset), "--tables", str(tables),
                                 "--out", str(tmp_path / "c"), "--no-track"])  # fmt: skip
    assert r.exit_code == 0, r.output
    assert f"mixture {tmp_path / 'c' / 'curated' / 'toy_tiny' / 'mixture.parquet'}" in r.output
    mix = pd.read_parquet(tmp_path / "c" / "curated" / "toy_tiny" / "mixture.parquet")
    assert set(mix.split) == {"pretrain", "policy", "failures"}

    rules = tmp_path / "strict.yaml"
    rules.write_text("duration:\n  min_episode_s: 100\nsplits: [pretrain, policy]\n")
    r = CliRunner().invoke(app, ["curate", str(tiny_dataset), "--tables", str(tables),
                                 "--out", str(tmp_path / "e"), "--rules", str(rules),
                                 "--no-track"])  # fmt: skip
    assert r.exit_code == 1 and "curated mixture is empty" in r.output
    rules.write_text("caption:\n  min_words: 0\n")
    r = CliRunner().invoke(app, ["curate", str(tiny_dataset), "--tables", str(tables),
                                 "--rules", str(rules), "--no-track"])  # fmt: skip
    assert r.exit_code == 2 and "caption.min_words" in r.output

    shutil.copytree(tmp_path / "c" / "curated", tables / "curated", dirs_exist_ok=True)
    r = CliRunner().invoke(app, ["report", str(tiny_dataset), "--tables", str(tables),
                                 "--out", str(tmp_path / "r"),
                                 "--max-episode-pages", "1"])  # fmt: skip
    assert r.exit_code == 0, r.output
    index = (tmp_path / "r" / "index.html").read_text()
    assert "Curated mixture" in index and "pretrain" in index
    assert len(list((tmp_path / "r" / "episodes").glob("*.html"))) == 1


def test_episode_meta_reads_robot_policy_and_day_columns(tiny_dataset, tmp_path):
    from flora.curate.sources import episode_meta

    root = tmp_path / tiny_dataset.name
    shutil.copytree(tiny_dataset, root)
    p = root / "meta" / "episodes" / "chunk-000" / "file-000.parquet"
    df = pd.read_parquet(p)
    df["robot_id"] = ["arm-a", "arm-b", "arm-a"]
    df["policy_version"] = ["v1", "v2", "v2"]
    df["recorded_at"] = ["2026-11-28T10:00:00Z", "2026-11-29T11:00:00Z", "2026-11-30T12:00:00Z"]
    df.to_parquet(p, index=False)
    m = episode_meta(root)
    assert list(m.robot) == ["arm-a", "arm-b", "arm-a"]
    assert list(m.policy_version) == ["v1", "v2", "v2"]
    assert list(m.day) == ["2026-11-28", "2026-11-29", "2026-11-30"]
    plain = episode_meta(tiny_dataset)
    assert set(plain.robot) == {"flora_toy_arm"} and set(plain.day) == {"unknown"}
    assert list(plain.duration_us) == [6_000_000, 14_000_000, 26_000_000]


def test_day_reads_epoch_units_from_magnitude_and_never_raises():
    import numpy as np

    from flora.curate.sources import _day

    s = 1764460800  # 2025-11-30 00:00:00 UTC
    for v in (s, s + 0.5, s * 10**3, s * 10**6, s * 10**9, np.int64(s * 10**3),
              np.float64(s), np.uint64(s * 10**9), "2025-11-30T10:00:00Z"):  # fmt: skip
        assert _day(v) == "2025-11-30", v
    for v in (None, True, np.bool_(False), "garbage", float("nan"), np.float32("nan"), 1e30):
        assert _day(v) == "unknown", v


def test_episode_meta_reads_epoch_milliseconds(tiny_dataset, tmp_path):
    from flora.curate.sources import episode_meta

    root = tmp_path / tiny_dataset.name
    shutil.copytree(tiny_dataset, root)
    p = root / "meta" / "episodes" / "chunk-000" / "file-000.parquet"
    df = pd.read_parquet(p)
    df["recorded_at"] = [(1764460800 + 60 * i) * 1000 for i in range(len(df))]  # epoch ms
    df.to_parquet(p, index=False)
    assert list(episode_meta(root).day) == ["2025-11-30"] * len(df)


def test_curate_dot_writes_under_the_folder_name(tiny_dataset, tables, tmp_path, monkeypatch):
    from flora.curate.run import curate_dataset, mixture_path

    monkeypatch.chdir(tiny_dataset)
    res = curate_dataset(".", tables, tmp_path / "out", "run-dot")
    assert res.dataset == tiny_dataset.name
    assert res.mixture_path == mixture_path(tmp_path / "out", tiny_dataset.name)
    assert res.mixture_path.exists()
