"""Export to LeRobot v3.0 with the engine's events in LeRobot 0.6's ``language_persistent``.

DESIGN §3.8: every ``data/*.parquet`` row gets the optional ``language_persistent`` column
— a list of structs ``role, content, style, timestamp (float32 s), camera, tool_calls``,
one struct per captioned event of the episode (style ``subtask``, role ``assistant``,
content = caption, timestamp = event start in seconds, camera null, tool_calls null),
sorted by start; the episode's list is identical on every frame of that episode (LeRobot
broadcasts persistent rows). The Arrow type mirrors ``lerobot.datasets.language`` of
LeRobot 0.6.1 (``role`` and ``timestamp`` non-nullable, ``tool_calls`` a list of Arrow
JSON), and ``meta/info.json`` declares the feature as LeRobot does:
``{"dtype": "language", "shape": [1], "names": null}``.

``flora_annotations/`` holds the engine tables (events, captions, outcome, dense_labels,
rubric, curation decisions, mixture: one Parquet file each), their recorded failures and
a ``manifest.json`` (row counts, run ids, sha256 of every file).

The source dataset is never modified unless ``in_place``. An in-place export replaces
the files of an earlier one: files its ``manifest.json`` listed that the new export does
not write are removed; files no manifest listed (the user's) are left alone.

``out`` may be missing or empty; an earlier export there (its owner marker
``.flora-output.json``, kind ``lerobot export``) is replaced only with ``overwrite``;
anything else there (a dataset, a file) is refused with
:class:`flora.safety.OutputDirError`, even with ``overwrite``. The export is assembled in
a sibling temp folder and renamed into place, so a failed export leaves nothing half
written and the earlier export stays until the new one is complete.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from flora.data.episode import FloraDataError, make_episode_id
from flora.safety import OutputDirError, claim_output_dir, ensure_own_output_dir

LANGUAGE_PERSISTENT = "language_persistent"
LANGUAGE_FEATURE = {"dtype": "language", "shape": [1], "names": None}
ANNOTATIONS_DIR = "flora_annotations"
EXPORT_TABLES = ("events", "captions", "outcome", "dense_labels", "rubric", "curation")
SUBTASK_STYLE = "subtask"
ASSISTANT_ROLE = "assistant"
#: ``kind`` in an export's owner marker (:mod:`flora.safety`): only such a folder is replaced.
EXPORT_KIND = "lerobot export"


def _json_type() -> pa.DataType:
    return pa.json_() if hasattr(pa, "json_") else pa.string()


def persistent_row_type(json_type: pa.DataType | None = None) -> pa.StructType:
    """Arrow struct of one persistent language row (LeRobot 0.6 field order and nullability)."""
    return pa.struct([
        pa.field("role", pa.string(), nullable=False),
        pa.field("content", pa.string(), nullable=True),
        pa.field("style", pa.string(), nullable=True),
        pa.field("timestamp", pa.float32(), nullable=False),
        pa.field("camera", pa.string(), nullable=True),
        pa.field("tool_calls", pa.list_(json_type or _json_type()), nullable=True),
    ])  # fmt: skip


def language_persistent_type() -> pa.ListType:
    """Arrow type of the ``language_persistent`` column."""
    return pa.list_(persistent_row_type())


def episode_language(events: pd.DataFrame) -> list[dict[str, Any]]:
    """One episode's persistent rows from its captioned events (sorted by start)."""
    rows = []
    for r in events.sort_values(["start_us", "end_us"]).itertuples(index=False):
        rows.append({"role": ASSISTANT_ROLE, "content": str(r.caption), "style": SUBTASK_STYLE,
                     "timestamp": float(r.start_us) / 1e6, "camera": None,
                     "tool_calls": None})  # fmt: skip
    return rows


def language_by_episode(dataset_name: str, tables: dict[str, pd.DataFrame]) -> dict[int, list]:
    """Episode index -> persistent rows: accepted captions, else captioned events rows."""
    caps = tables.get("captions", pd.DataFrame())
    evs = tables.get("events", pd.DataFrame())
    out: dict[int, list] = {}
    prefix = f"{dataset_name}/"
    for src in (caps, evs):
        if not len(src) or "caption" not in src.columns:
            continue
        src = src[src.episode_id.astype(str).str.startswith(prefix)]
        src = src[src.caption.fillna("").astype(str).str.strip() != ""]
        for eid, g in src.groupby("episode_id"):
            i = int(str(eid).rsplit("/", 1)[1])
            out.setdefault(i, episode_language(g))
    return out


@dataclass
class ExportResult:
    """What an export wrote."""

    root: Path
    episodes: int
    frames: int
    events: int
    tables: dict[str, int] = field(default_factory=dict)
    episodes_without_events: list[int] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"root": str(self.root), "episodes": self.episodes, "frames": self.frames,
                "events": self.events, "tables": self.tables,
                "episodes_without_events": self.episodes_without_events}  # fmt: skip


def _sha256(p: Path) -> str:
    h = hashlib.sha256()
    with open(p, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _flat(df: pd.DataFrame) -> pd.DataFrame:
    return df.reset_index(drop=True)


def _write_annotations(dst: Path, ann: Any, mixture_path: Path | None) -> dict[str, int]:
    d = dst / ANNOTATIONS_DIR
    (d / "_failures").mkdir(parents=True, exist_ok=True)
    counts: dict[str, int] = {}
    manifest: dict[str, Any] = {"tables": {}, "source": {}}
    for t in EXPORT_TABLES:
        df = ann.table(t)
        fails = [f.__dict__ for fs in ann.failures.get(t, {}).values() for f in fs]
        if not len(df) and not fails:
            continue
        if len(df):
            _flat(df).to_parquet(d / f"{t}.parquet", index=False)
        (d / "_failures" / f"{t}.json").write_text(json.dumps(fails, indent=1))
        counts[t] = int(len(df))
        manifest["tables"][t] = {
            "rows": int(len(df)), "failures": len(fails),
            "run_ids": sorted({str(x) for x in df.get("run_id", pd.Series(dtype=str)).dropna()}),
        }  # fmt: skip
        manifest["source"][t] = ann.roots.get(t)
    if mixture_path is not None and Path(mixture_path).exists():
        shutil.copyfile(mixture_path, d / "mixture.parquet")
        n = pq.read_metadata(d / "mixture.parquet").num_rows
        counts["mixture"] = int(n)
        manifest["tables"]["mixture"] = {"rows": int(n)}
        manifest["source"]["mixture"] = str(mixture_path)
    manifest["sha256"] = {p.relative_to(d).as_posix(): _sha256(p)
                          for p in sorted(d.rglob("*")) if p.is_file()}  # fmt: skip
    (d / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True))
    return counts


def _manifest_files(d: Path) -> set[str]:
    """The files the ``manifest.json`` in annotations folder ``d`` lists (and itself);
    empty when there is none or it is unreadable (then nothing counts as Flora's)."""
    try:
        listed = json.loads((d / "manifest.json").read_text()).get("sha256", {})
    except (OSError, ValueError, AttributeError):
        return set()
    if not isinstance(listed, dict):
        return set()
    return {str(rel) for rel in listed} | {"manifest.json"}


def _remove_stale_annotations(d: Path, old: set[str], new: set[str]) -> None:
    """Delete files of annotations folder ``d`` an earlier export listed and this one does
    not (a table or mixture no longer exported), so no stale annotation ships unlisted.

    Only names in ``old`` are touched: a file no manifest listed is the user's and stays.
    A listed name that is not a plain relative path inside ``d`` is skipped.
    """
    base = d.resolve()
    for rel in sorted(old - new):
        pp = PurePosixPath(rel)
        if pp.is_absolute() or ".." in pp.parts:
            continue
        p = d / pp
        if base not in p.resolve().parents or p.is_symlink() or not p.is_file():
            continue
        p.unlink()


def _in_flora_exports(target: Path) -> bool:
    """True for a folder under ``FLORA_HOME/outputs/exports`` (the DAG's and the demo's
    export folder), where only Flora writes: there an export from before the owner marker
    (its ``flora_annotations/manifest.json``) counts as Flora's own. Elsewhere it does not,
    because ``--in-place`` writes the same file into a user's dataset."""
    from flora.settings import get_settings

    exports = (get_settings().outputs_dir / "exports").resolve()
    return exports in target.resolve().parents


def _check_target(target: Path, overwrite: bool) -> None:
    """Refuse an ``--out`` that is not free or this export's own earlier output.

    Free: missing or an empty folder. An earlier export (owner marker of kind
    :data:`EXPORT_KIND`) is replaced only with ``overwrite``. Anything else — a dataset, an
    unrelated folder, a file, a symlink — is refused even with ``overwrite``: the export
    never deletes data it did not write.
    """
    hint = "delete it yourself if it is disposable"
    legacy = (f"{ANNOTATIONS_DIR}/manifest.json",) if _in_flora_exports(target) else ()
    if ensure_own_output_dir(target, EXPORT_KIND, markers=legacy, hint=hint) and not overwrite:
        raise OutputDirError(f"{target} holds an earlier Flora export; pass --overwrite to "
                             "replace it, or choose another --out")  # fmt: skip


def _promote(work: Path, target: Path, overwrite: bool) -> None:
    """Rename the finished export ``work`` to ``target``; an earlier export is moved aside
    first (checked again: never anything Flora did not write) and removed after."""
    _check_target(target, overwrite)
    if target.is_dir() and any(target.iterdir()):
        old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
        os.replace(target, old / target.name)
        os.replace(work, target)
        shutil.rmtree(old, ignore_errors=True)
        return
    if target.is_dir():
        target.rmdir()  # empty
    os.replace(work, target)


def export_lerobot(
    dataset: str | Path,
    tables: Any,
    out: str | Path | None = None,
    *,
    mixture: str | Path | None = None,
    overwrite: bool = False,
    in_place: bool = False,
) -> ExportResult:
    """Write a LeRobot v3.0 dataset with ``language_persistent`` and ``flora_annotations/``.

    Args:
        dataset: source LeRobot v3.0 dataset root.
        tables: engine tables (TableStore root or ``{table: root}``).
        out: target root (required unless ``in_place``).
        mixture: a curated mixture Parquet file to ship in ``flora_annotations/``.
        overwrite: replace an earlier export at ``out`` (never a folder Flora did not write).
        in_place: add the column and folder to the source dataset itself.
    """
    from flora.curate.sources import load_annotations
    from flora.data import open_dataset

    src = Path(dataset).resolve()
    ds = open_dataset(src)
    if ds.format != "lerobot_v3.0":
        raise FloraDataError(f"export needs a LeRobot v3.0 source, got {ds.format}",
                             dataset=ds.name, file=src, field="codebase_version")  # fmt: skip
    if in_place:
        if out is not None:  # the CLI refuses both; a library caller must not lose `out`
            raise ValueError("export_lerobot: pass out=DIR or in_place=True, not both")
        target = src
    else:
        if out is None:
            raise ValueError("export_lerobot: pass out=DIR (or in_place=True)")
        target = Path(out).resolve()
        if target == src or src in target.parents:
            raise ValueError(f"--out {target} is the source dataset or inside it; "
                             "pass --in-place to modify the source")  # fmt: skip
        _check_target(target, overwrite)
    ann = load_annotations(tables, EXPORT_TABLES).for_dataset(ds.name)
    lang = language_by_episode(ds.name, ann.tables)
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}.export-", dir=target.parent))
    try:
        if in_place:
            (work / "data").mkdir()
            (work / "meta").mkdir()
        else:
            shutil.copytree(src, work, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns(ANNOTATIONS_DIR))  # fmt: skip
            claim_output_dir(work, EXPORT_KIND)  # over a marker copied from the source
        frames = 0
        data_files = sorted((src / "data").rglob("*.parquet"))
        for p in data_files:
            rel = p.relative_to(src)
            tbl = pq.read_table(p)
            if LANGUAGE_PERSISTENT in tbl.column_names:
                tbl = tbl.drop_columns([LANGUAGE_PERSISTENT])
            idx = tbl.column("episode_index").to_pylist()
            rows = [lang.get(int(i), []) for i in idx]
            col = pa.array(rows, type=pa.list_(persistent_row_type(pa.string())))
            tbl = tbl.append_column(pa.field(LANGUAGE_PERSISTENT, language_persistent_type()),
                                    col.cast(language_persistent_type()))  # fmt: skip
            (work / rel).parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(tbl, work / rel)
            frames += tbl.num_rows
        info = json.loads((src / "meta" / "info.json").read_text())
        info["features"][LANGUAGE_PERSISTENT] = dict(LANGUAGE_FEATURE)
        (work / "meta" / "info.json").write_text(json.dumps(info, indent=2) + "\n")
        counts = _write_annotations(work, ann, Path(mixture) if mixture else None)
        if in_place:
            old_files = _manifest_files(src / ANNOTATIONS_DIR)
            new_files = _manifest_files(work / ANNOTATIONS_DIR)
            for p in sorted(work.rglob("*")):
                if p.is_file():
                    dst = src / p.relative_to(work)
                    dst.parent.mkdir(parents=True, exist_ok=True)
                    if dst.exists() and dst.is_dir():
                        shutil.rmtree(dst)
                    os.replace(p, dst)
            shutil.rmtree(work)
            # After the new files are in place: the earlier export's leftovers go.
            _remove_stale_annotations(src / ANNOTATIONS_DIR, old_files, new_files)
        else:
            _promote(work, target, overwrite)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    idx = ds.episode_indices()
    return ExportResult(
        root=target, episodes=len(idx), frames=frames,
        events=sum(len(lang.get(i, [])) for i in idx), tables=counts,
        episodes_without_events=[i for i in idx if not lang.get(i)],
    )  # fmt: skip


def read_language(root: str | Path) -> dict[int, list[dict[str, Any]]]:
    """Episode index -> its ``language_persistent`` list, checked identical on every frame."""
    root = Path(root)
    out: dict[int, list[dict[str, Any]]] = {}
    for p in sorted((root / "data").rglob("*.parquet")):
        tbl = pq.read_table(p, columns=["episode_index", LANGUAGE_PERSISTENT])
        for i, rows in zip(tbl.column("episode_index").to_pylist(),
                           tbl.column(LANGUAGE_PERSISTENT).to_pylist(), strict=True):  # fmt: skip
            if i in out and out[i] != rows:
                raise FloraDataError("language_persistent differs between frames of one "
                                     "episode", dataset=root.name, episode=i, file=p,
                                     field=LANGUAGE_PERSISTENT)  # fmt: skip
            out.setdefault(i, rows)
    return out


def read_annotations(root: str | Path) -> dict[str, pd.DataFrame]:
    """The engine tables shipped in ``<root>/flora_annotations/`` (sha256 verified)."""
    d = Path(root) / ANNOTATIONS_DIR
    manifest = json.loads((d / "manifest.json").read_text())
    out = {}
    for rel, sha in manifest["sha256"].items():
        if _sha256(d / rel) != sha:
            raise FloraDataError("annotation file does not match its manifest checksum",
                                 dataset=Path(root).name, file=d / rel, field="sha256")  # fmt: skip
        if rel.endswith(".parquet") and "/" not in rel:
            out[rel[: -len(".parquet")]] = pd.read_parquet(d / rel)
    return out


def _to_us(t_s: float, fps: float | None) -> int:
    # float32 seconds lose µs precision; like the dataset readers, snap to the frame grid
    # when within 1 ms of it (SNAP_TOL_US).
    from flora.data.dataset import SNAP_TOL_US

    us = int(round(float(t_s) * 1e6))
    if fps:
        grid = int(round(round(float(t_s) * fps) * 1e6 / fps))
        if abs(us - grid) <= SNAP_TOL_US:
            return grid
    return us


def events_from_language(
    dataset_name: str, lang: dict[int, list], fps: float | None = None
) -> pd.DataFrame:
    """(episode_id, start_us, caption) rows from ``language_persistent`` lists."""
    rows = [{"episode_id": make_episode_id(dataset_name, i),
             "start_us": _to_us(r["timestamp"], fps), "caption": r["content"]}
            for i, rs in sorted(lang.items()) for r in rs]  # fmt: skip
    return pd.DataFrame(rows, columns=["episode_id", "start_us", "caption"])


__all__ = [
    "ANNOTATIONS_DIR",
    "LANGUAGE_FEATURE",
    "LANGUAGE_PERSISTENT",
    "ExportResult",
    "episode_language",
    "events_from_language",
    "export_lerobot",
    "language_persistent_type",
    "persistent_row_type",
    "read_annotations",
    "read_language",
]
