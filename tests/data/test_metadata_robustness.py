"""Metadata found in the wild that used to escape as bare exceptions or wrong values.

Each case is a ``FloraDataError`` naming dataset, episode, file and field, or, where the
input is usable, the right value: ``chunks_size``, per-episode ``tasks``, the meta file an
episode's row lives in, non-numeric vectors, a fractional v2.1 ``length``, ``.MP4`` files.
Ingest records an episode that fails in any way and completes the others.
"""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from flora.data import open_dataset
from flora.data.dataset import LeRobotV30Dataset
from flora.data.episode import FloraDataError
from flora.data.ingest import ingest_dataset

META0 = "meta/episodes/chunk-000/file-000.parquet"
META1 = "meta/episodes/chunk-000/file-001.parquet"


def _copy(src, tmp_path, name="ds"):
    dst = tmp_path / name
    shutil.copytree(src, dst)
    return dst


def _set_info(root, **values):
    p = root / "meta/info.json"
    info = json.loads(p.read_text())
    info.update(values)
    p.write_text(json.dumps(info))
    return p


def _split_meta(root, edit_second=None):
    """Move episode 2's metadata row into a second meta file (``edit_second`` may change it)."""
    df = pd.read_parquet(root / META0)
    df[df.episode_index < 2].to_parquet(root / META0, index=False)
    second = df[df.episode_index >= 2]
    if edit_second is not None:
        second = edit_second(second)
    second.to_parquet(root / META1, index=False)
    return root / META1


def _v21_edit(root, i, **values):
    p = root / "meta/episodes.jsonl"
    rows = [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
    rows[i].update(values)
    p.write_text("".join(json.dumps(d) + "\n" for d in rows))
    return p


# ----------------------------------------------------------------------------- chunks_size


@pytest.mark.parametrize("layout", ["v21", "v30"])
@pytest.mark.parametrize("bad", [0, -5, None, "abc", 2.5, True])
def test_bad_chunks_size_is_a_named_dataset_error(tiny_v21, tiny_v30, tmp_path, layout, bad):
    """``chunks_size`` null / text / 0 used to give a bare TypeError / ValueError /
    ZeroDivisionError from every episode of a v2.1 dataset (and ingest stopped)."""
    root = _copy(tiny_v21 if layout == "v21" else tiny_v30, tmp_path)
    info = _set_info(root, chunks_size=bad)
    with pytest.raises(FloraDataError, match="chunks_size must be a positive integer") as ei:
        open_dataset(root)
    assert (ei.value.file, ei.value.field) == (str(info), "chunks_size")
    with pytest.raises(FloraDataError) as ei:
        ingest_dataset(root, progress=False)
    assert ei.value.field == "chunks_size"


def test_chunks_size_integral_float_or_absent_is_read(tiny_v21, tmp_path):
    root = _copy(tiny_v21, tmp_path)
    _set_info(root, chunks_size=1000.0)
    assert open_dataset(root).chunks_size == 1000
    p = root / "meta/info.json"
    info = json.loads(p.read_text())
    del info["chunks_size"]
    p.write_text(json.dumps(info))
    ds = open_dataset(root)
    assert ds.chunks_size == 1000 and ds.episode(0).duration_us == 6_000_000


def test_data_file_of_never_raises_on_a_zero_chunks_size():
    """The issue-location helper is best effort: a reader-like object with a zero
    ``chunks_size`` gives no file rather than a ZeroDivisionError."""
    from flora.validation.raw import data_file_of

    ds = SimpleNamespace(info={"data_path": "data/{episode_index}.parquet"}, episodes_meta={},
                         chunks_size=0, root=None)  # fmt: skip
    assert data_file_of(ds, 3) is None


# ----------------------------------------------------------------------------- tasks


def test_tasks_missing_from_one_meta_file_fall_back_to_task_index(damaged):
    """Several meta/episodes files, one without ``tasks``: pandas fills NaN, which used to
    be a TypeError (``len(nan)``) that stopped ingest; now the task comes by task_index."""
    want = [list(t) for t in pd.read_parquet(damaged / META0).tasks]
    _split_meta(damaged, lambda df: df.drop(columns=["tasks"]))
    ds = open_dataset(damaged)
    assert [[ds.episode(i).task] for i in ds.episode_indices()] == want
    res = ingest_dataset(damaged, progress=False)
    assert res.n_ok == 3 and list(res.manifest.task) == [t[0] for t in want]


def test_null_tasks_without_task_index_is_named_error(damaged):
    """A null ``tasks`` cell and no ``task_index`` to look the task up by: the task is lost,
    which is that episode's named error (naming the meta file of its row), not ``""``."""
    meta1 = _split_meta(damaged, lambda df: df.drop(columns=["tasks"]))
    data1 = damaged / "data/chunk-000/file-001.parquet"  # episode 2's rows only
    pq.write_table(pq.read_table(data1).drop_columns(["task_index"]), data1)
    ds = open_dataset(damaged)
    with pytest.raises(FloraDataError, match="no tasks value") as ei:
        ds.episode(2)
    assert (ei.value.episode, ei.value.file, ei.value.field) == (2, str(meta1), "tasks")
    res = ingest_dataset(damaged, progress=False)
    assert res.ok_indices() == [0, 1] and "field=tasks" in res.errors()[2]


def test_tasks_as_a_plain_string_is_one_task(damaged, tiny_v21, tmp_path):
    """A string ``tasks`` value is one task; it used to be split into its characters."""
    df = pd.read_parquet(damaged / META0)
    df["tasks"] = "pick up the red block"
    df.to_parquet(damaged / META0, index=False)
    assert open_dataset(damaged).episode(0).task == "pick up the red block"
    root = _copy(tiny_v21, tmp_path)
    _v21_edit(root, 0, tasks="pick up the red block")
    assert open_dataset(root).episode(0).task == "pick up the red block"


@pytest.mark.parametrize("bad", [5, {"a": "b"}, [1, 2], ["ok", None]])
def test_tasks_of_another_type_is_named_error(tiny_v21, tmp_path, bad):
    root = _copy(tiny_v21, tmp_path)
    p = _v21_edit(root, 1, tasks=bad)
    ds = open_dataset(root)
    with pytest.raises(FloraDataError, match="tasks must be a list of strings") as ei:
        ds.episode(1)
    assert (ei.value.episode, ei.value.file, ei.value.field) == (1, str(p), "tasks")
    assert ds.episode(0).task  # the others load


def test_v30_tasks_of_numbers_is_named_error(damaged):
    df = pd.read_parquet(damaged / META0)
    df["tasks"] = [[1], [2], [3]]
    df.to_parquet(damaged / META0, index=False)
    with pytest.raises(FloraDataError) as ei:
        open_dataset(damaged).episode(1)
    assert (ei.value.episode, ei.value.file, ei.value.field) == (1, str(damaged / META0), "tasks")


# ----------------------------------------------------------------------------- any exception


def test_unexpected_exception_of_one_episode_is_its_error_row(damaged, monkeypatch):
    """Any Exception raised for one episode (a reader bug, input no check foresaw) is that
    episode's error row naming the exception; the other episodes are ingested."""
    load = LeRobotV30Dataset._load

    def flaky(self, i):
        if i == 1:
            raise RuntimeError("boom in the reader")
        return load(self, i)

    monkeypatch.setattr(LeRobotV30Dataset, "_load", flaky)
    res = ingest_dataset(damaged, progress=False)
    assert res.ok_indices() == [0, 2] and list(res.errors()) == [1]
    err = res.errors()[1]
    assert "RuntimeError: boom in the reader" in err and "episode=1" in err


# ----------------------------------------------------------------------------- meta file


def test_metadata_error_names_the_meta_file_holding_the_row(damaged):
    """With several meta/episodes files, a bad cell is reported in the file it is in (it
    used to be the first file, whatever the row's file)."""

    def null_length(df):
        return df.assign(length=df["length"].astype("float64") * float("nan"))

    meta1 = _split_meta(damaged, null_length)
    ds = open_dataset(damaged)
    with pytest.raises(FloraDataError, match="not an integer") as ei:
        ds.episode(2)
    assert (ei.value.episode, ei.value.file, ei.value.field) == (2, str(meta1), "length")
    assert ds.episode(1).duration_us == 14_000_000


def test_duplicate_episode_names_the_meta_file_of_the_duplicate(damaged):
    df = pd.read_parquet(damaged / META0)
    df[df.episode_index == 2].to_parquet(damaged / META1, index=False)  # 2 listed twice
    with pytest.raises(FloraDataError, match="duplicate episode") as ei:
        open_dataset(damaged)
    assert (ei.value.episode, ei.value.file) == (2, str(damaged / META1))


# ----------------------------------------------------------------------------- numbers


@pytest.mark.parametrize("column", ["action", "observation.state"])
def test_vector_column_of_strings_is_named_error(damaged, column):
    """A scalar column of strings used to be a bare ValueError (float('x'))."""
    p = damaged / "data/chunk-000/file-000.parquet"
    t = pq.read_table(p)
    i = t.column_names.index(column)
    pq.write_table(t.set_column(i, column, pa.array(["x"] * t.num_rows)), p)
    with pytest.raises(FloraDataError, match="not numbers") as ei:
        open_dataset(damaged).episode(0)
    assert (ei.value.episode, ei.value.file, ei.value.field) == (0, str(p), column)


def test_scalar_numeric_column_still_reads(damaged):
    p = damaged / "data/chunk-000/file-000.parquet"
    t = pq.read_table(p)
    i = t.column_names.index("action")
    pq.write_table(t.set_column(i, "action", pa.array(range(t.num_rows), pa.int64())), p)
    assert open_dataset(damaged).episode(0).action.shape == (120, 1)


@pytest.mark.parametrize(("value", "why"), [(120.7, "not an integer"), (None, "not an integer")])
def test_v21_length_checked_per_episode_as_in_v30(tiny_v21, tmp_path, value, why):
    """v2.1 ``length`` 120.7 used to become 120 silently (null stopped the whole open);
    now it is that episode's bad input, like a v3.0 metadata cell."""
    root = _copy(tiny_v21, tmp_path)
    p = _v21_edit(root, 0, length=value)
    ds = open_dataset(root)
    with pytest.raises(FloraDataError, match=why) as ei:
        ds.episode(0)
    assert (ei.value.episode, ei.value.file, ei.value.field) == (0, str(p), "length")
    assert ds.episode(1).duration_us == 14_000_000


# ----------------------------------------------------------------------------- mp4 folder


def test_mp4_suffix_matches_in_any_case(tiny_mp4_single, tmp_path):
    """``.MP4`` (cameras, phones) used to be skipped silently: a mixed folder lost episodes
    and an all-upper-case folder was 'not a dataset'."""
    src = sorted(tiny_mp4_single.glob("*.mp4"))
    root = tmp_path / "clips"
    root.mkdir()
    shutil.copy(src[0], root / "take_a.mp4")
    shutil.copy(src[1], root / "take_b.MP4")
    shutil.copy(src[1], root / "take_c.Mp4")
    ds = open_dataset(root)
    assert [ds.episode_name(i) for i in ds.episode_indices()] == ["take_a", "take_b", "take_c"]
    assert ds.episode(1).cameras["video"].path == root / "take_b.MP4"
    only = tmp_path / "only_upper"
    only.mkdir()
    shutil.copy(src[0], only / "clip.MP4")
    assert open_dataset(only).num_episodes == 1


def test_mp4_names_differing_only_in_suffix_case_are_refused(tiny_mp4_single, tmp_path):
    src = sorted(tiny_mp4_single.glob("*.mp4"))
    root = tmp_path / "clips"
    root.mkdir()
    shutil.copy(src[0], root / "a.mp4")
    shutil.copy(src[1], root / "a.MP4")
    with pytest.raises(FloraDataError, match="both give episode 'a'") as ei:
        open_dataset(root)
    assert ei.value.field == "file name" and ei.value.file.startswith(str(root))
