"""validate_dataset never stops at one episode: bad metadata and unexpected exceptions."""

from __future__ import annotations

import json
import shutil

import pandas as pd

from flora.validation.raw import validate_dataset

META0 = "meta/episodes/chunk-000/file-000.parquet"


def _copy(tiny_dataset, tmp_path):
    root = tmp_path / tiny_dataset.name
    shutil.copytree(tiny_dataset, root)
    return root


def test_bad_chunks_size_is_a_load_issue(tiny_dataset, tmp_path):
    """``chunks_size: null`` used to escape validate_dataset as a bare TypeError."""
    root = _copy(tiny_dataset, tmp_path)
    p = root / "meta/info.json"
    p.write_text(json.dumps({**json.loads(p.read_text()), "chunks_size": None}))
    report = validate_dataset(root, progress=False)
    (issue,) = report.issues
    assert (issue.check, issue.episode, issue.file, issue.field) == (
        "load", None, str(p), "chunks_size"
    )  # fmt: skip
    assert not report.success and report.valid_episodes == []


def test_tasks_column_missing_from_one_meta_file_validates(tiny_dataset, tmp_path):
    """A second meta/episodes file without ``tasks`` (NaN after concat) used to abort
    validation with a TypeError; the task comes from task_index and all episodes pass."""
    root = _copy(tiny_dataset, tmp_path)
    df = pd.read_parquet(root / META0)
    df[df.episode_index < 2].to_parquet(root / META0, index=False)
    df[df.episode_index >= 2].drop(columns=["tasks"]).to_parquet(
        root / "meta/episodes/chunk-000/file-001.parquet", index=False
    )
    report = validate_dataset(root, progress=False)
    assert report.success, [i.describe() for i in report.issues]
    assert report.valid_episodes == [0, 1, 2]


def test_unexpected_exception_of_one_episode_is_its_load_issue(tiny_dataset, tmp_path, monkeypatch):
    """Any Exception raised for one episode, loading it or building its rows, becomes a
    ``load`` issue naming the exception; the other episodes are validated."""
    import flora.validation.raw as raw

    root = _copy(tiny_dataset, tmp_path)
    rows = raw.camera_rows

    def flaky(ep):
        if ep.index == 1:
            raise RuntimeError("boom while decoding")
        return rows(ep)

    monkeypatch.setattr(raw, "camera_rows", flaky)
    report = validate_dataset(root, progress=False)
    (issue,) = report.issues
    assert (issue.check, issue.episode, issue.dataset) == ("load", 1, root.name)
    assert "RuntimeError: boom while decoding" in issue.reason
    assert issue.file.endswith("data/chunk-000/file-000.parquet")
    assert report.valid_episodes == [0, 2]
    # No partial rows of the failed episode reached the tables.
    assert report.tables["raw_episodes"].row_count == 2
    assert report.tables["raw_cameras"].row_count == 4
    assert all(r.success for r in report.tables.values())
