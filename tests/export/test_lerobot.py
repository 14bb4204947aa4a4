"""LeRobot export: schema of ``language_persistent`` (DESIGN §3.8), round trip, refusals."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest


@pytest.fixture(scope="module")
def oracle_tables(tiny_dataset, tmp_path_factory):
    from flora.curate.oracle import write_oracle_tables

    out = tmp_path_factory.mktemp("oracle_tables")
    write_oracle_tables(tiny_dataset, out, "run-gt")
    return out


def _tree(root):
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}  # fmt: skip


def test_export_schema_round_trip_and_source_untouched(tiny_dataset, oracle_tables, tmp_path):
    from flora.data import open_dataset
    from flora.data.ground_truth import load_ground_truth
    from flora.export.lerobot import (
        LANGUAGE_PERSISTENT,
        events_from_language,
        export_lerobot,
        read_annotations,
        read_language,
    )

    before = _tree(tiny_dataset)
    out = tmp_path / "export"
    res = export_lerobot(tiny_dataset, oracle_tables, out)
    assert _tree(tiny_dataset) == before  # the source is never modified
    gt = load_ground_truth(tiny_dataset)
    assert res.episodes == 3 and res.events == len(gt.tables["events"])

    # info.json declares the column as LeRobot 0.6 does.
    info = json.loads((out / "meta" / "info.json").read_text())
    assert info["features"][LANGUAGE_PERSISTENT] == {"dtype": "language", "shape": [1],
                                                     "names": None}  # fmt: skip
    # Arrow schema: list<struct<role!, content, style, timestamp! float32, camera, tool_calls>>.
    for p in sorted((out / "data").rglob("*.parquet")):
        t = pq.read_table(p).schema.field(LANGUAGE_PERSISTENT).type
        st = t.value_type
        assert [f.name for f in st] == ["role", "content", "style", "timestamp", "camera",
                                        "tool_calls"]  # fmt: skip
        assert str(st.field("timestamp").type) == "float" and not st.field("timestamp").nullable
        assert not st.field("role").nullable and st.field("camera").nullable
        assert "json" in str(st.field("tool_calls").type.value_type)

    # One struct per event, identical on every frame of the episode.
    lang = read_language(out)
    for i in range(3):
        ref = gt.events(i)
        rows = lang[i]
        assert [r["content"] for r in rows] == [e.caption for e in ref]
        assert {(r["role"], r["style"], r["camera"]) for r in rows} == {("assistant", "subtask",
                                                                          None)}  # fmt: skip
        assert np.allclose([r["timestamp"] for r in rows], [e.start_us / 1e6 for e in ref])
    df = pq.read_table(sorted((out / "data").rglob("*.parquet"))[0]).to_pandas()
    ep0 = df[df.episode_index == 0][LANGUAGE_PERSISTENT]
    assert len(ep0) > 1 and all(list(x) == list(ep0.iloc[0]) for x in ep0)

    # The project's reader sees the same episodes and frames; annotations come back.
    a, b = open_dataset(tiny_dataset), open_dataset(out)
    assert a.episode_indices() == b.episode_indices() and b.format == "lerobot_v3.0"
    for i in a.episode_indices():
        ea, eb = a.episode(i), b.episode(i)
        assert (ea.task, ea.duration_us) == (eb.task, eb.duration_us)
        assert np.array_equal(ea.timestamps_us, eb.timestamps_us)
        assert np.array_equal(ea.action, eb.action) and np.array_equal(ea.state, eb.state)
    from flora.data.frames import sample_frames

    cam_a, cam_b = a.episode(1).camera_by_role("main"), b.episode(1).camera_by_role("main")
    fa = sample_frames(cam_a, [0, 1_000_000])
    fb = sample_frames(cam_b, [0, 1_000_000])
    assert all(np.array_equal(x.image, y.image) for x, y in zip(fa, fb, strict=True))
    evs = events_from_language(b.name, lang, fps=b.fps)
    ref = gt.tables["events"].sort_values(["episode_index", "start_us"])
    assert list(evs.start_us) == list(ref.start_us) and list(evs.caption) == list(ref.caption)
    ann = read_annotations(out)
    assert set(ann) >= {"events", "captions", "outcome", "dense_labels"}
    src_out = pd.concat(pd.read_parquet(p) for p in sorted((oracle_tables / "outcome").glob(
        "*.parquet")))  # fmt: skip
    assert sorted(ann["outcome"].reward) == sorted(src_out.reward)  # rewards included
    assert len(ann["dense_labels"]) == len(gt.tables["dense"])


def test_foreign_target_refused_own_export_replaced_only_with_overwrite(
    tiny_dataset, oracle_tables, tmp_path
):
    """A user's folder or file at --out survives byte for byte, even with overwrite; an
    earlier export is replaced only with overwrite (issue 15: never delete user data)."""
    from flora.export.lerobot import export_lerobot
    from flora.safety import OWNER_MARKER, OutputDirError

    out = tmp_path / "exists"
    out.mkdir()
    (out / "keep.txt").write_bytes(b"mine\x00")
    for overwrite in (False, True):
        with pytest.raises(OutputDirError, match=f"{out}.*not written by Flora"):
            export_lerobot(tiny_dataset, oracle_tables, out, overwrite=overwrite)
        assert _tree(out) == {"keep.txt": b"mine\x00"}  # nothing touched
    a_file = tmp_path / "a_file"
    a_file.write_bytes(b"data")
    with pytest.raises(OutputDirError, match="is a file"):
        export_lerobot(tiny_dataset, oracle_tables, a_file, overwrite=True)
    assert a_file.read_bytes() == b"data"
    with pytest.raises(ValueError, match="in-place"):
        export_lerobot(tiny_dataset, oracle_tables, tiny_dataset / "sub")

    mine = tmp_path / "export"
    res = export_lerobot(tiny_dataset, oracle_tables, mine)
    assert res.frames > 0 and (mine / OWNER_MARKER).is_file()
    first = _tree(mine)
    with pytest.raises(OutputDirError, match="earlier Flora export.*--overwrite"):
        export_lerobot(tiny_dataset, oracle_tables, mine)
    assert _tree(mine) == first
    (mine / "stale.txt").write_text("from the earlier export")
    export_lerobot(tiny_dataset, oracle_tables, mine, overwrite=True)
    assert _tree(mine) == first  # replaced as a whole: the stale file is gone
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file", "exists", "export"]


def test_unmarked_export_replaced_only_under_flora_exports(
    tiny_dataset, oracle_tables, tmp_path, monkeypatch
):
    """An export from before the owner marker is replaced where only Flora writes (the
    DAG's FLORA_HOME/outputs/exports); the same files elsewhere may be a user's dataset
    exported in place, and are refused."""
    from flora.export.lerobot import ANNOTATIONS_DIR, export_lerobot
    from flora.safety import OWNER_MARKER, OutputDirError
    from flora.settings import get_settings

    monkeypatch.setenv("FLORA_HOME", str(tmp_path / "home"))
    get_settings.cache_clear()
    try:
        for parent, replaced in ((tmp_path / "home" / "outputs" / "exports", True),
                                 (tmp_path / "elsewhere", False)):  # fmt: skip
            old = parent / "toy"
            (old / ANNOTATIONS_DIR).mkdir(parents=True)
            (old / ANNOTATIONS_DIR / "manifest.json").write_text("{}")
            (old / "notes.txt").write_text("old")
            if replaced:
                export_lerobot(tiny_dataset, oracle_tables, old, overwrite=True)
                assert (old / OWNER_MARKER).is_file() and not (old / "notes.txt").exists()
            else:
                with pytest.raises(OutputDirError, match="not written by Flora"):
                    export_lerobot(tiny_dataset, oracle_tables, old, overwrite=True)
                assert (old / "notes.txt").read_text() == "old"
    finally:
        get_settings.cache_clear()


def test_in_place_and_episode_without_events(tiny_dataset, tmp_path):
    """--in-place adds the column to the source; an episode with no events gets []."""
    from flora.curate.oracle import write_oracle_tables
    from flora.export.lerobot import export_lerobot, read_language

    src = tmp_path / tiny_dataset.name
    shutil.copytree(tiny_dataset, src)
    tables = tmp_path / "t"
    write_oracle_tables(src, tables)
    shutil.rmtree(tables / "captions")
    from flora.tables import TableStore

    TableStore(tables)._part("events", f"{src.name}/000001").unlink()  # segment step failed
    res = export_lerobot(src, tables, in_place=True)
    assert res.root == src.resolve() and res.episodes_without_events == [1]
    with pytest.raises(ValueError, match="not both"):  # `out` was silently ignored
        export_lerobot(src, tables, tmp_path / "elsewhere", in_place=True)
    assert not (tmp_path / "elsewhere").exists()
    lang = read_language(src)
    assert lang[1] == [] and len(lang[0]) > 0
    assert (src / "flora_annotations" / "manifest.json").exists()


def test_cli_export_refuses_existing_target(tiny_dataset, oracle_tables, tmp_path):
    from typer.testing import CliRunner

    from flora.cli import app

    out = tmp_path / "o"
    out.mkdir()
    (out / "x").write_text("1")
    r = CliRunner().invoke(app, ["export", "lerobot", str(tiny_dataset), "--out", str(out),
                                 "--tables", str(oracle_tables)])  # fmt: skip
    assert r.exit_code == 2 and "--out" in r.output and "not written by Flora" in r.output
    r = CliRunner().invoke(app, ["export", "lerobot", str(tiny_dataset), "--out", str(out),
                                 "--tables", str(oracle_tables), "--overwrite"])  # fmt: skip
    assert r.exit_code == 2 and (out / "x").read_text() == "1"  # a user's folder: never
    mine = tmp_path / "mine"
    for extra in ([], ["--overwrite"]):
        r = CliRunner().invoke(app, ["export", "lerobot", str(tiny_dataset), "--out", str(mine),
                                     "--tables", str(oracle_tables), *extra])  # fmt: skip
        assert r.exit_code == 0, r.output
        assert json.loads(r.stdout)["episodes"] == 3


def test_export_ships_this_datasets_rows_and_curation_only(tiny_dataset, oracle_tables, tmp_path):
    """One tables root holds every dataset the engine labelled: an export carries its own
    dataset's rows and failure records only, and the curation decisions beside them."""
    from flora.curate.run import curate_dataset
    from flora.export.lerobot import export_lerobot, read_annotations
    from flora.tables import Failure, TableStore

    tables = tmp_path / "tables"
    shutil.copytree(oracle_tables, tables)
    store = TableStore(tables)
    ev = store.read("events")
    other = ev[ev.episode_id == ev.episode_id.iloc[0]].assign(
        episode_id="other_fleet/000000", dataset="other_fleet"
    )
    store.commit("events", "other_fleet/000000", other, [])
    store.commit("captions", "other_fleet/000001", None,
                 [Failure("captions", "other_fleet/000001", "event 0", "grammar")])  # fmt: skip
    cur = curate_dataset(tiny_dataset, tables, tables, "cur-run")
    res = export_lerobot(tiny_dataset, tables, tmp_path / "export")
    shipped = read_annotations(tmp_path / "export")
    assert res.tables["events"] == len(ev) and len(shipped["events"]) == len(ev)
    for name, df in shipped.items():
        if "episode_id" in df.columns:
            assert not df.episode_id.str.startswith("other_fleet/").any(), name
    fdir = tmp_path / "export/flora_annotations/_failures"
    fails = [f for p in fdir.glob("*.json") for f in json.loads(p.read_text())]
    assert all(not f["episode_id"].startswith("other_fleet/") for f in fails)
    assert len(shipped["curation"]) == len(cur.decisions) == res.tables["curation"]
    assert TableStore(tables).pending("curation") == []  # decisions committed, not pending


def test_in_place_export_again_removes_its_stale_files_keeps_the_users(
    tiny_dataset, oracle_tables, tmp_path
):
    """A second --in-place export that no longer writes captions or a mixture removes the
    files of the first export its manifest does not list (they used to stay, unlisted,
    next to the fresh ones); a file of the user's in flora_annotations/ stays."""
    from flora.export.lerobot import ANNOTATIONS_DIR, export_lerobot, read_annotations

    src = tmp_path / tiny_dataset.name
    shutil.copytree(tiny_dataset, src)
    tables = tmp_path / "tables"
    shutil.copytree(oracle_tables, tables)
    mix = tmp_path / "mixture.parquet"
    pd.DataFrame({"episode_id": [f"{src.name}/000000"], "weight": [1.0]}).to_parquet(mix)
    export_lerobot(src, tables, in_place=True, mixture=mix)
    ann = src / ANNOTATIONS_DIR
    first = {p.relative_to(ann).as_posix() for p in ann.rglob("*") if p.is_file()}
    assert {"captions.parquet", "_failures/captions.json", "mixture.parquet"} <= first
    (ann / "NOTES.md").write_text("mine")  # the user's, listed by no manifest
    (ann / "_failures" / "keep.txt").write_text("mine too")

    shutil.rmtree(tables / "captions")
    export_lerobot(src, tables, in_place=True)
    files = {p.relative_to(ann).as_posix() for p in ann.rglob("*") if p.is_file()}
    listed = set(json.loads((ann / "manifest.json").read_text())["sha256"])
    assert files == listed | {"manifest.json", "NOTES.md", "_failures/keep.txt"}
    assert not {"captions.parquet", "_failures/captions.json", "mixture.parquet"} & files
    assert (ann / "NOTES.md").read_text() == "mine"
    assert sorted(read_annotations(src)) == ["dense_labels", "events", "outcome"]
