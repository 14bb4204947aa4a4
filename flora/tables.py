"""Engine tables on disk: one Parquet part per episode, resumable, with recorded failures.

Layout under ``root/<table>/``: ``<episode_key>.parquet`` per finished episode and
``_failures/<episode_key>.json`` per failed item. A rerun skips finished episodes
(no duplicates) and retries failed ones. Every table carries the common columns
``episode_id, dataset, model, model_version, run_id`` (DESIGN §3).
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

COMMON_COLUMNS = ("episode_id", "dataset", "model", "model_version", "run_id")


def _key(episode_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "__", episode_id)


@dataclass(frozen=True)
class Failure:
    """A failed item: which episode, which item inside it, and why."""

    table: str
    episode_id: str
    item: str
    reason: str


class TableStore:
    """Resumable per-episode Parquet store for the engine's tables."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def _part(self, table: str, episode_id: str) -> Path:
        return self.root / table / f"{_key(episode_id)}.parquet"

    def _fail(self, table: str, episode_id: str) -> Path:
        return self.root / table / "_failures" / f"{_key(episode_id)}.json"

    def has(self, table: str, episode_id: str) -> bool:
        """True when the episode's part exists (a rerun skips it)."""
        return self._part(table, episode_id).exists()

    def write(self, table: str, episode_id: str, df: pd.DataFrame) -> Path:
        """Atomically write one episode's rows; replaces an earlier part for it."""
        missing = [c for c in COMMON_COLUMNS if c not in df.columns]
        if missing:
            raise ValueError(f"table {table!r}, episode {episode_id}: missing columns {missing}")
        path = self._part(table, episode_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        os.close(fd)
        df.to_parquet(tmp, index=False)
        os.replace(tmp, path)
        return path

    def record_failures(self, table: str, episode_id: str, failures: list[Failure]) -> None:
        """Record (or clear, with an empty list) the failed items of one episode."""
        path = self._fail(table, episode_id)
        if not failures:
            path.unlink(missing_ok=True)
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps([f.__dict__ for f in failures], indent=1))

    def failures(self, table: str) -> list[Failure]:
        d = self.root / table / "_failures"
        out: list[Failure] = []
        for p in sorted(d.glob("*.json")) if d.exists() else []:
            out.extend(Failure(**f) for f in json.loads(p.read_text()))
        return out

    def split_pending(
        self, table: str, episode_ids: Iterable[str], *, redo: bool = False
    ) -> tuple[list[str], list[str]]:
        """``(todo, skipped)`` of ``episode_ids``, order kept.

        An episode is skipped when its part exists and it has no recorded failures (a
        rerun redoes failed episodes); ``redo`` puts every episode in ``todo``.
        """
        failed = set() if redo else {f.episode_id for f in self.failures(table)}
        todo: list[str] = []
        skipped: list[str] = []
        for eid in episode_ids:
            done = not redo and self.has(table, eid) and eid not in failed
            (skipped if done else todo).append(eid)
        return todo, skipped

    def read(self, table: str) -> pd.DataFrame:
        """All finished episodes' rows of ``table`` (empty frame if none)."""
        parts = sorted((self.root / table).glob("*.parquet"))
        if not parts:
            return pd.DataFrame(columns=list(COMMON_COLUMNS))
        return pd.concat([pd.read_parquet(p) for p in parts], ignore_index=True)
