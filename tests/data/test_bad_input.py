"""Bad input: each case is an explicit FloraDataError naming dataset/episode/file/field."""

from __future__ import annotations

import json
import shutil

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from flora.data import open_dataset
from flora.data.episode import FloraDataError
from flora.data.frames import sample_episode_frames
from flora.data.ingest import ingest_dataset

TOP, WRIST = "observation.images.top", "observation.images.wrist"


def _video(root, key, file_index):
    return root / f"videos/{key}/chunk-000/file-{file_index:03d}.mp4"


def test_truncated_mp4(damaged):
    p = _video(damaged, TOP, 1)  # holds episode 2
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])
    ds = open_dataset(damaged)
    ep = ds.episode(2)
    with pytest.raises(FloraDataError) as ei:
        sample_episode_frames(ep, TOP, [0])
    e = ei.value
    assert (e.dataset, e.episode, e.field) == ("toy_damaged", 2, TOP)
    assert e.file == str(p) and "unreadable video" in str(e)
    assert str(p) in str(e) and "episode=2" in str(e)
    # Ingest records the bad episode and still ingests the others.
    res = ingest_dataset(damaged, progress=False)
    assert res.ok_indices() == [0, 1]
    assert set(res.errors()) == {2} and str(p) in res.errors()[2]


def test_garbage_mp4_in_plain_folder(tiny_mp4_pairs, tmp_path):
    root = tmp_path / "mp4_bad"
    shutil.copytree(tiny_mp4_pairs, root)
    bad = root / "episode_000001.wrist.mp4"
    bad.write_bytes(b"\x00\x00\x00\x18ftypmp42" + b"garbage" * 100)
    ds = open_dataset(root)
    with pytest.raises(FloraDataError) as ei:
        ds.episode(1)
    assert ei.value.file == str(bad) and ei.value.field == "wrist" and ei.value.episode == 1
    assert ds.episode(0).duration_us == 6_000_000
    res = ingest_dataset(root, progress=False)
    assert res.ok_indices() == [0, 2] and list(res.errors()) == [1]


def test_missing_camera_file(damaged):
    p = _video(damaged, WRIST, 1)
    p.unlink()
    ds = open_dataset(damaged)
    with pytest.raises(FloraDataError) as ei:
        ds.episode(2)
    e = ei.value
    assert (e.episode, e.field, e.file) == (2, WRIST, str(p))
    assert "camera file is missing" in str(e)
    assert ds.episode(1).duration_us == 14_000_000  # others unaffected


@pytest.mark.parametrize("key", ["fps", "features", "data_path", "video_path", "codebase_version"])
def test_info_json_missing_key(damaged, key):
    info_p = damaged / "meta/info.json"
    info = json.loads(info_p.read_text())
    del info[key]
    info_p.write_text(json.dumps(info))
    with pytest.raises(FloraDataError) as ei:
        open_dataset(damaged)
    e = ei.value
    assert (e.dataset, e.field, e.file) == ("toy_damaged", key, str(info_p))
    assert "missing" in str(e)


def test_info_json_bad_values(damaged):
    info_p = damaged / "meta/info.json"
    info = json.loads(info_p.read_text())
    info_p.write_text(json.dumps({**info, "fps": "fast"}))
    with pytest.raises(FloraDataError, match="fps"):
        open_dataset(damaged)
    info_p.write_text(json.dumps({**info, "codebase_version": "v9.9"}))
    with pytest.raises(FloraDataError) as ei:
        open_dataset(damaged)
    assert ei.value.field == "codebase_version"
    info_p.write_text("{not json")
    with pytest.raises(FloraDataError, match="not valid JSON"):
        open_dataset(damaged)


def test_episode_index_out_of_range(tiny_dataset):
    ds = open_dataset(tiny_dataset)
    for bad in (3, -1, 10**6):
        with pytest.raises(FloraDataError) as ei:
            ds.episode(bad)
        assert (ei.value.field, ei.value.episode, ei.value.dataset) == (
            "episode_index",
            bad,
            "toy_tiny",
        )
        assert "0..2" in str(ei.value)
    with pytest.raises(FloraDataError):
        ds.episode("1")


def test_non_monotonic_timestamps(damaged):
    p = damaged / "data/chunk-000/file-000.parquet"
    t = pq.read_table(p)
    ts = t.column("timestamp").to_numpy().copy()
    ep = t.column("episode_index").to_numpy()
    j = int((ep == 1).nonzero()[0][10])
    ts[j], ts[j + 1] = ts[j + 1], ts[j]
    idx = t.schema.get_field_index("timestamp")
    pq.write_table(t.set_column(idx, "timestamp", pa.array(ts, pa.float32())), p)
    ds = open_dataset(damaged)
    with pytest.raises(FloraDataError) as ei:
        ds.episode(1)
    e = ei.value
    assert (e.episode, e.field, e.file) == (1, "timestamp", str(p))
    assert "not strictly increasing at frame 11" in str(e)
    assert ds.episode(0).duration_us == 6_000_000
    res = ingest_dataset(damaged, progress=False)
    assert res.ok_indices() == [0, 2] and "timestamp" in res.errors()[1]


def test_zero_length_episode(damaged):
    p = damaged / "meta/episodes/chunk-000/file-000.parquet"
    t = pq.read_table(p)
    lengths = pc.if_else(pc.equal(t.column("episode_index"), 0), 0, t.column("length"))
    t = t.set_column(t.schema.get_field_index("length"), "length", lengths.cast(pa.int64()))
    pq.write_table(t, p)
    ds = open_dataset(damaged)
    with pytest.raises(FloraDataError) as ei:
        ds.episode(0)
    assert (ei.value.episode, ei.value.field) == (0, "length")
    assert "zero-length" in str(ei.value)
    res = ingest_dataset(damaged, progress=False)
    assert res.ok_indices() == [1, 2]


def test_row_count_disagrees_with_length(damaged):
    p = damaged / "data/chunk-000/file-001.parquet"
    t = pq.read_table(p)
    pq.write_table(t.slice(0, t.num_rows - 5), p)
    with pytest.raises(FloraDataError) as ei:
        open_dataset(damaged).episode(2)
    assert ei.value.field == "length" and "515 data rows but length 520" in str(ei.value)


def test_missing_episode_metadata_column(damaged):
    p = damaged / "meta/episodes/chunk-000/file-000.parquet"
    t = pq.read_table(p)
    col = f"videos/{WRIST}/from_timestamp"
    pq.write_table(t.drop_columns([col]), p)
    with pytest.raises(FloraDataError) as ei:
        open_dataset(damaged)
    assert ei.value.field == col and ei.value.file == str(p)


def test_v21_missing_video(tiny_v21, tmp_path):
    root = tmp_path / "v21_bad"
    shutil.copytree(tiny_v21, root)
    p = root / f"videos/chunk-000/{TOP}/episode_000000.mp4"
    p.unlink()
    with pytest.raises(FloraDataError) as ei:
        open_dataset(root).episode(0)
    assert (ei.value.episode, ei.value.field, ei.value.file) == (0, TOP, str(p))


def test_not_a_dataset(tmp_path):
    with pytest.raises(FloraDataError, match="does not exist"):
        open_dataset(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FloraDataError, match="not a dataset"):
        open_dataset(tmp_path / "empty")


@pytest.mark.parametrize(
    ("field", "expected"),
    [(f"videos/{TOP}/from_timestamp", "not a finite number"), ("length", "not an integer")],
)
def test_null_episode_metadata_cell_fails_that_episode_only(damaged, field, expected):
    """A null cell in one episode's metadata row is that episode's bad input, named as such;
    ingest records it and completes the others (a bare ``int(nan)`` used to stop the run)."""
    p = damaged / "meta/episodes/chunk-000/file-000.parquet"
    t = pq.read_table(p)
    i = t.schema.get_field_index(field)
    col = t.column(field).cast(pa.float64()).to_pylist()
    col[1] = None
    pq.write_table(t.set_column(i, field, pa.array(col, pa.float64())), p)
    with pytest.raises(FloraDataError, match=expected) as ei:
        open_dataset(damaged).episode(1)
    assert (ei.value.episode, ei.value.field, ei.value.file) == (1, field, str(p))
    res = ingest_dataset(damaged, progress=False)
    assert res.ok_indices() == [0, 2] and list(res.errors()) == [1]
    assert field in res.errors()[1]


@pytest.mark.parametrize(
    ("name", "line", "field"),
    [
        ("tasks.jsonl", '{"task_index": 9, "task" "no colon"}', "task_index/task"),
        ("episodes.jsonl", '{"episode_index": 9}', "episode_index/length"),
    ],
)
def test_v21_malformed_jsonl_line_names_the_file(tiny_v21, tmp_path, name, line, field):
    root = tmp_path / "v21_jsonl"
    shutil.copytree(tiny_v21, root)
    p = root / "meta" / name
    n = len(p.read_text().splitlines())
    p.write_text(p.read_text() + line + "\n")
    with pytest.raises(FloraDataError, match=f"bad {name} line {n + 1}") as ei:
        open_dataset(root)
    assert (ei.value.file, ei.value.field) == (str(p), field)


def test_a_dataset_opened_as_dot_keeps_its_folder_name(tiny_dataset, monkeypatch):
    """Run from inside the dataset (``flora ingest .``), episodes are keyed by the folder's
    name, as when the path is given: an empty name would key them ``/000000`` and a later
    run by path would store every episode a second time."""
    monkeypatch.chdir(tiny_dataset)
    assert open_dataset(".").name == tiny_dataset.name
    monkeypatch.chdir(tiny_dataset / "meta")
    assert open_dataset("..").name == tiny_dataset.name
