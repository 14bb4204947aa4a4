"""Where curation reads from: the engine tables (with their recorded failures) and the
episodes' metadata (task, robot, policy version, day, duration).

The tables may live under one ``TableStore`` root (Airflow: ``<outputs>/<table>/``) or each
under its own root (KFP: one artifact per table), so a source is a root or a mapping
``table -> root``. A table that is absent is an empty frame: the step that writes it
failed or has not run, and the rules record that per episode instead of failing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from flora.data.dataset import local_dataset_name
from flora.data.episode import FloraDataError, make_episode_id
from flora.tables import Failure, TableStore

#: Annotation tables curation reads, in the order their reasons are reported.
TABLES = ("events", "captions", "outcome", "dense_labels", "rubric")
META_COLUMNS = ("episode_id", "episode_index", "task", "robot", "policy_version", "day",
                "duration_us")  # fmt: skip
#: Optional per-episode metadata columns (LeRobot ``meta/episodes``), first match wins.
ROBOT_KEYS = ("robot_id", "robot", "robot_name")
POLICY_KEYS = ("policy_version", "policy", "model_version")
DAY_KEYS = ("day", "date", "recorded_at", "start_time", "timestamp_utc")

TableSource = str | Path | Mapping[str, str | Path]


def table_root(source: TableSource, table: str) -> Path:
    """The ``TableStore`` root holding ``table`` for ``source``.

    A mapping value may be the root (a KFP artifact: ``<artifact>/<table>/``) or the
    ``<root>/<table>`` folder itself.
    """
    if isinstance(source, Mapping):
        if table not in source:
            return Path("/nonexistent-flora-table-root")
        p = Path(source[table])
        # A root holds <root>/<table>/; a mapping value may also be that folder itself.
        if not (p / table).exists() and p.name == table and (p / "_layout.json").exists():
            return p.parent
        return p
    return Path(source)


@dataclass
class Annotations:
    """The engine tables of one curation run and their recorded failures."""

    tables: dict[str, pd.DataFrame]
    failures: dict[str, dict[str, list[Failure]]] = field(default_factory=dict)
    roots: dict[str, str] = field(default_factory=dict)

    def table(self, name: str) -> pd.DataFrame:
        return self.tables.get(name, pd.DataFrame(columns=["episode_id"]))

    def failed(self, name: str, episode_id: str) -> list[Failure]:
        return self.failures.get(name, {}).get(episode_id, [])

    def for_dataset(self, dataset: str) -> Annotations:
        """Only the rows and failure records of ``dataset``'s episodes: one tables root
        (``FLORA_HOME/outputs``) holds every dataset the engine has labelled."""
        prefix = f"{dataset}/"
        tables = {t: df[df.episode_id.astype(str).str.startswith(prefix)].reset_index(drop=True)
                  for t, df in self.tables.items()}  # fmt: skip
        failures = {t: {e: f for e, f in fs.items() if e.startswith(prefix)}
                    for t, fs in self.failures.items()}  # fmt: skip
        return Annotations(tables, failures, dict(self.roots))

    def present(self, name: str) -> bool:
        """True when the table has any rows or recorded failures (its step ran)."""
        return len(self.table(name)) > 0 or bool(self.failures.get(name))


def load_annotations(source: TableSource, tables: tuple[str, ...] = TABLES) -> Annotations:
    """Read every annotation table (absent ones are empty) and its ``_failures``."""
    out = Annotations(tables={})
    for t in tables:
        root = table_root(source, t)
        store = TableStore(root)
        df = store.read(t) if (root / t).exists() else pd.DataFrame(columns=["episode_id"])
        out.tables[t] = df
        fails: dict[str, list[Failure]] = {}
        if (root / t).exists():
            for f in store.failures(t):
                fails.setdefault(f.episode_id, []).append(f)
        out.failures[t] = fails
        out.roots[t] = str((root / t).resolve())
    return out


def _first(row: Mapping[str, Any], keys: tuple[str, ...]) -> Any:
    for k in keys:
        v = row.get(k)
        if v is not None and not (isinstance(v, float) and np.isnan(v)):
            return v
    return None


def _day(v: Any) -> str:
    """``YYYY-MM-DD`` of a per-episode timestamp; ``"unknown"`` when it cannot be read.

    A number (Python or numpy, not a bool) is an epoch time whose unit follows from its
    magnitude: ``|v| < 1e11`` seconds, ``< 1e14`` milliseconds, ``< 1e17`` microseconds,
    else nanoseconds (so any instant between 1973 and 5138 reads right in every unit).
    Anything else goes through ``pd.Timestamp`` (ISO strings, datetimes). Never raises.
    """
    if v is None or isinstance(v, bool | np.bool_):
        return "unknown"
    try:
        if isinstance(v, int | float | np.integer | np.floating):
            x = float(v)
            if not np.isfinite(x):
                return "unknown"
            a = abs(x)
            unit = "s" if a < 1e11 else "ms" if a < 1e14 else "us" if a < 1e17 else "ns"
            ts = pd.Timestamp(int(v) if isinstance(v, int | np.integer) else x, unit=unit)
        else:
            ts = pd.Timestamp(v)
        return ts.strftime("%Y-%m-%d")
    except (ValueError, TypeError, OverflowError, NotImplementedError):
        return "unknown"


def episode_meta(dataset: str | Path, episodes: list[int] | None = None) -> pd.DataFrame:
    """One row per episode: ``META_COLUMNS``, from the dataset's metadata (no video decoded).

    ``robot``: a per-episode ``robot_id``/``robot`` column when the metadata has one, else
    ``meta/info.json`` ``robot_type``; ``policy_version`` and ``day`` likewise from
    per-episode columns, else ``"unknown"``. An episode that cannot be read is left out
    (the ingest/validate steps already report it).
    """
    from flora.data import open_dataset

    ds = open_dataset(dataset)
    info = getattr(ds, "info", {}) or {}
    default_robot = str(info.get("robot_type") or "unknown")
    meta = getattr(ds, "episodes_meta", None)
    rows = []
    for i in episodes if episodes is not None else ds.episode_indices():
        try:
            ep = ds.episode(int(i))
        except FloraDataError:
            continue
        m: Mapping[str, Any] = {}
        if isinstance(meta, pd.DataFrame) and int(i) in meta.index:
            m = meta.loc[int(i)].to_dict()
        elif isinstance(meta, dict):
            m = meta.get(int(i), {})
        rows.append({
            "episode_id": ep.episode_id, "episode_index": int(i), "task": ep.task or "",
            "robot": str(_first(m, ROBOT_KEYS) or default_robot),
            "policy_version": str(_first(m, POLICY_KEYS) or "unknown"),
            "day": _day(_first(m, DAY_KEYS)), "duration_us": int(ep.duration_us),
        })  # fmt: skip
    return pd.DataFrame(rows, columns=list(META_COLUMNS))


def ground_truth_meta(root: str | Path, dataset: str | None = None) -> pd.DataFrame:
    """``META_COLUMNS`` from a toy world's ``ground_truth/episodes.parquet`` (no videos)."""
    root = Path(root)
    p = root / "ground_truth" / "episodes.parquet"
    if not p.exists():
        raise FloraDataError("ground truth file missing", dataset=root.name, file=p)
    df = pd.read_parquet(p)
    name = dataset or local_dataset_name(root)
    synth = root / "meta" / "flora_synth.json"
    robot = "flora_toy_arm"
    if (root / "meta" / "info.json").exists():
        robot = json.loads((root / "meta" / "info.json").read_text()).get("robot_type", robot)
    elif synth.exists():
        robot = "flora_toy_arm"
    return pd.DataFrame({
        "episode_id": [make_episode_id(name, int(i)) for i in df.episode_index],
        "episode_index": df.episode_index.astype("int64"), "task": df.task.astype(str),
        "robot": robot, "policy_version": "unknown", "day": "unknown",
        "duration_us": df.duration_us.astype("int64"),
    })  # fmt: skip


__all__ = [
    "META_COLUMNS",
    "TABLES",
    "Annotations",
    "TableSource",
    "episode_meta",
    "ground_truth_meta",
    "load_annotations",
    "table_root",
]
