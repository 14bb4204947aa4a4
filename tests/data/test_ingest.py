"""Ingest manifest and the data CLI commands."""

from __future__ import annotations

import pandas as pd
from typer.testing import CliRunner

from flora.cli import app
from flora.data.ingest import MANIFEST_COLUMNS, ingest_dataset


def test_manifest_of_a_clean_dataset(tiny_dataset, tmp_path):
    res = ingest_dataset(tiny_dataset, out=tmp_path / "manifest.parquet", progress=False)
    m = res.manifest
    assert list(m.columns) == MANIFEST_COLUMNS
    assert res.n_ok == 3 and res.n_error == 0
    assert list(m.episode_id) == ["toy_tiny/000000", "toy_tiny/000001", "toy_tiny/000002"]
    assert list(m.duration_us) == [6_000_000, 14_000_000, 26_000_000]
    assert list(m.n_frames) == [120, 280, 520]
    assert set(m.fps) == {20.0}
    assert set(m.cameras) == {"observation.images.top,observation.images.wrist"}
    assert (m.error == "").all() and m.task.str.len().min() > 5
    back = pd.read_parquet(tmp_path / "manifest.parquet")
    assert list(back.episode_id) == list(m.episode_id)


def test_cli_synth_and_ingest(tmp_path):
    runner = CliRunner()
    out = tmp_path / "cli_toy"
    r = runner.invoke(
        app, ["synth", "--episodes", "2", "--seed", "5", "--out", str(out), "--durations", "5,6"]
    )
    assert r.exit_code == 0, r.output
    assert (out / "meta/info.json").exists() and (out / "ground_truth/events.parquet").exists()
    r = runner.invoke(app, ["ingest", str(out), "--out", str(tmp_path / "m.parquet")])
    assert r.exit_code == 0, r.output
    assert "2 ok, 0 error" in r.output
    r = runner.invoke(app, ["dataset-info", str(out)])
    assert r.exit_code == 0 and "lerobot_v3.0" in r.output
    # Refuses to overwrite a non-empty directory unless asked.
    r = runner.invoke(app, ["synth", "--episodes", "1", "--out", str(out), "--durations", "5"])
    assert r.exit_code != 0
