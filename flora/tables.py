"""Engine tables on disk: one Parquet part per episode, resumable, with recorded failures.

Layout under ``root/<table>/``:

- ``<part_key>.parquet`` per finished episode, ``part_key = <slug>~<hash>`` (readable slug
  of the episode id plus 16 hex digits of its SHA-256, so two ids never share a part);
- ``_failures/<part_key>.json`` per episode with failed items;
- ``_pending/<part_key>`` while an episode's part is written (or removed, by a redo that
  produced no rows) but its failures are not yet recorded (a crash in between leaves it,
  and the next run redoes the episode);
- ``_quarantine/`` for records that could not be read (moved aside, never deleted);
- ``_layout.json`` once the table uses these part names (older tables are migrated).

A rerun skips finished episodes (no duplicates) and retries failed or interrupted ones.
Every table carries the common columns ``episode_id, dataset, model, model_version,
run_id`` (DESIGN §3). Design notes: ``docs/reliability.md``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

log = logging.getLogger(__name__)

COMMON_COLUMNS = ("episode_id", "dataset", "model", "model_version", "run_id")

#: Part-name scheme recorded in ``_layout.json``; tables without it are migrated once.
LAYOUT_FILE = "_layout.json"
LAYOUT = {"part_names": "slug~sha256[:16]", "version": 2}
FAILURES_DIR = "_failures"
PENDING_DIR = "_pending"
QUARANTINE_DIR = "_quarantine"
_SLUG_MAX = 80
_HASH_HEX = 16  # 64 bits: a collision among a million episode ids has odds ~3e-8
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def _legacy_key(episode_id: str) -> str:
    """The part name of tables written before ``_layout.json`` (not injective)."""
    return _UNSAFE.sub("__", episode_id)


def part_key(episode_id: str) -> str:
    """File stem of an episode's part and failure record: ``<slug>~<sha256[:16]>``.

    The slug keeps the id readable (the old name, trimmed); the hash of the full id keeps
    names apart for ids the slug maps together (``robot data`` / ``robot:data`` /
    ``robot__data``, any two all-non-ASCII ids). ``~`` never occurs in an old name, which
    is how migration tells the two apart.
    """
    slug = _legacy_key(episode_id).strip(".")[:_SLUG_MAX] or "_"
    digest = hashlib.sha256(episode_id.encode("utf-8", "surrogatepass")).hexdigest()
    return f"{slug}~{digest[:_HASH_HEX]}"


@dataclass(frozen=True)
class Failure:
    """A failed item: which episode, which item inside it, and why."""

    table: str
    episode_id: str
    item: str
    reason: str


class FailureRecordError(ValueError):
    """A ``_failures/*.json`` record that cannot be read (torn, not JSON, wrong shape)."""


def _fsync_dir(d: Path) -> None:
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover - some filesystems refuse fsync on directories
        pass
    finally:
        os.close(fd)


def _atomic_write(path: Path, write: Any) -> None:
    """Write ``path`` via a temp file in the same folder, fsync, then ``os.replace``.

    Readers see the old file or the whole new one, never a torn one; ``write(fileobj)``
    produces the bytes.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def _parse_record(data: bytes, where: Path) -> list[Failure]:
    try:
        obj = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise FailureRecordError(f"{where}: not a JSON failure record ({e})") from e
    if not isinstance(obj, list) or not obj:
        raise FailureRecordError(f"{where}: expected a non-empty JSON list of failures")
    out: list[Failure] = []
    for i, f in enumerate(obj):
        fields = ("table", "episode_id", "item", "reason")
        if not isinstance(f, dict) or not all(isinstance(f.get(k), str) for k in fields):
            raise FailureRecordError(f"{where}: entry {i} lacks string fields {fields}")
        out.append(Failure(*(f[k] for k in fields)))
    return out


def _part_episode_ids(path: Path) -> set[str] | None:
    """The episode ids in a part (None when it cannot be read)."""
    try:
        return set(pd.read_parquet(path, columns=["episode_id"])["episode_id"].astype(str))
    except Exception:  # noqa: BLE001 - any unreadable part is left where it is
        return None


class TableStore:
    """Resumable per-episode Parquet store for the engine's tables.

    ``problems`` lists what this store found wrong on disk and set aside (quarantined
    failure records, unmigratable old parts), for reports and logs.
    """

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.problems: list[str] = []
        self._migrated: set[str] = set()

    # ---- paths ------------------------------------------------------------------------

    def _dir(self, table: str) -> Path:
        d = self.root / table
        if table not in self._migrated:
            self._migrate(table, d)
        return d

    def _part(self, table: str, episode_id: str) -> Path:
        return self._dir(table) / f"{part_key(episode_id)}.parquet"

    def _fail(self, table: str, episode_id: str) -> Path:
        return self._dir(table) / FAILURES_DIR / f"{part_key(episode_id)}.json"

    def _pending(self, table: str, episode_id: str) -> Path:
        return self._dir(table) / PENDING_DIR / part_key(episode_id)

    # ---- writing ----------------------------------------------------------------------

    def has(self, table: str, episode_id: str) -> bool:
        """True when the episode's part exists and is committed (a rerun skips it)."""
        return (
            self._part(table, episode_id).exists() and not self._pending(table, episode_id).exists()
        )

    def write(self, table: str, episode_id: str, df: pd.DataFrame) -> Path:
        """Atomically write one episode's rows; replaces an earlier part for it.

        The episode stays *pending* (redone by the next run) until
        :meth:`record_failures` records its failed items, so a crash between the two never
        marks an episode done whose failures were not recorded. :meth:`commit` does both.
        """
        missing = [c for c in COMMON_COLUMNS if c not in df.columns]
        if missing:
            raise ValueError(f"table {table!r}, episode {episode_id}: missing columns {missing}")
        path = self._part(table, episode_id)
        pending = self._pending(table, episode_id)
        _atomic_write(pending, lambda f: f.write(episode_id.encode("utf-8", "surrogatepass")))
        _atomic_write(path, lambda f: df.to_parquet(f, index=False))
        return path

    def record_failures(self, table: str, episode_id: str, failures: list[Failure]) -> None:
        """Record (or clear, with an empty list) the failed items of one episode.

        Written atomically; this also commits a part written by :meth:`write`.
        """
        path = self._fail(table, episode_id)
        if failures:
            body = json.dumps([f.__dict__ for f in failures], indent=1).encode()
            _atomic_write(path, lambda f: f.write(body))
        else:
            path.unlink(missing_ok=True)
        self._pending(table, episode_id).unlink(missing_ok=True)

    def drop(self, table: str, episode_id: str) -> bool:
        """Remove one episode's part of ``table`` (a redo that produced no rows).

        Only ``<table>/<part_key(episode_id)>.parquet`` is touched: never another episode's
        part, another table, a failure record or anything outside the store. Same
        discipline as :meth:`write`: the episode is marked pending first and stays pending
        (redone by the next run) until :meth:`record_failures` records why it has no rows,
        so a crash in between never leaves it looking done. Returns whether a part was
        removed (``False``, and nothing marked, when it had none).
        """
        if not table or table in (".", "..") or "/" in table or os.sep in table:
            raise ValueError(f"table {table!r}: not a table name")
        path = self._part(table, episode_id)
        if not path.exists():
            return False
        pending = self._pending(table, episode_id)
        _atomic_write(pending, lambda f: f.write(episode_id.encode("utf-8", "surrogatepass")))
        path.unlink(missing_ok=True)
        _fsync_dir(path.parent)
        return True

    def commit(
        self,
        table: str,
        episode_id: str,
        df: pd.DataFrame | None,
        failures: list[Failure],
    ) -> None:
        """Write one episode's rows (if any) and record its failures, crash-safely.

        Order: pending mark, part, failure record, unmark. A crash anywhere leaves the
        episode pending or failed, so the next run redoes it (its part is replaced, so no
        row is duplicated).
        """
        if df is not None:
            self.write(table, episode_id, df)
        self.record_failures(table, episode_id, failures)

    # ---- reading ----------------------------------------------------------------------

    def failures(self, table: str) -> list[Failure]:
        """Every recorded failure of ``table``.

        A record that cannot be read is moved to ``_quarantine/`` (never deleted), reported
        in :attr:`problems` and the log, and its episode is marked pending so the next run
        redoes it; it never makes the read fail.
        """
        d = self._dir(table) / FAILURES_DIR
        out: list[Failure] = []
        for p in sorted(d.glob("*.json")) if d.is_dir() else []:
            try:
                out.extend(_parse_record(p.read_bytes(), p))
            except FileNotFoundError:  # another process moved or cleared it meanwhile
                continue
            except (FailureRecordError, OSError) as e:
                moved = self._quarantine(table, p, str(e))
                if moved is not None and "~" in p.stem:
                    # Its episode id is unreadable but its key is not: redo that episode.
                    mark = self._dir(table) / PENDING_DIR / p.stem
                    _atomic_write(mark, lambda f: f.write(b""))
        return out

    def pending(self, table: str) -> list[str]:
        """Part keys of episodes written but not committed (interrupted runs)."""
        d = self._dir(table) / PENDING_DIR
        if not d.is_dir():
            return []
        return sorted(p.name for p in d.iterdir() if not p.name.startswith("."))

    def split_pending(
        self, table: str, episode_ids: Iterable[str], *, redo: bool = False
    ) -> tuple[list[str], list[str]]:
        """``(todo, skipped)`` of ``episode_ids``, order kept.

        An episode is skipped when its part exists, it has no recorded failures and its
        commit finished (a rerun redoes failed and interrupted episodes); ``redo`` puts
        every episode in ``todo``.
        """
        failed = set() if redo else {f.episode_id for f in self.failures(table)}
        pending = set() if redo else set(self.pending(table))
        todo: list[str] = []
        skipped: list[str] = []
        for eid in episode_ids:
            done = (
                not redo
                and eid not in failed
                and part_key(eid) not in pending
                and self._part(table, eid).exists()
            )
            (skipped if done else todo).append(eid)
        return todo, skipped

    def read_part(
        self, table: str, episode_id: str, columns: list[str] | None = None
    ) -> pd.DataFrame | None:
        """One episode's written rows of ``table`` (``None`` when it has no part)."""
        path = self._part(table, episode_id)
        return pd.read_parquet(path, columns=columns) if path.exists() else None

    def read(self, table: str) -> pd.DataFrame:
        """All written episodes' rows of ``table`` (empty frame if none)."""
        parts = sorted(self._dir(table).glob("*.parquet"))
        if not parts:
            return pd.DataFrame(columns=list(COMMON_COLUMNS))
        return pd.concat([pd.read_parquet(p) for p in parts], ignore_index=True)

    # ---- merging ----------------------------------------------------------------------

    def merge_from(self, table: str, source: str | Path) -> int:
        """Copy ``table``'s committed parts and failure records from the store at
        ``source`` into this one; returns how many files were copied.

        How a fan-out over disjoint episode shards becomes one table (KFP: each shard
        writes its own artifact). Idempotent: a file already here with the same bytes is
        left alone, so a retried merge copies nothing twice. Uncommitted (pending) episodes
        are not copied. The same part with different bytes is an error naming it: two
        shards wrote the same episode, which a shard plan never does.
        """
        src = TableStore(source)
        sdir = src._dir(table)
        if not sdir.is_dir():
            return 0
        pending = set(src.pending(table))
        dest = self._dir(table)
        copied = 0
        layout = sdir / LAYOUT_FILE
        files = [(p, dest / p.name) for p in sorted(sdir.glob("*.parquet"))]
        fdir = sdir / FAILURES_DIR
        files += [(p, dest / FAILURES_DIR / p.name) for p in sorted(fdir.glob("*.json"))]
        for p, target in files:
            if p.stem in pending:
                continue
            data = p.read_bytes()
            if target.exists():
                if target.read_bytes() != data:
                    raise ValueError(
                        f"table {table!r}: {target.name} differs between {sdir} and {dest} "
                        "(two shards wrote the same episode)"
                    )
                continue
            _atomic_write(target, lambda f, b=data: f.write(b))
            copied += 1
        if layout.exists() and not (dest / LAYOUT_FILE).exists():
            _atomic_write(dest / LAYOUT_FILE, lambda f: f.write(layout.read_bytes()))
        return copied

    # ---- repair -----------------------------------------------------------------------

    def _quarantine(self, table: str, path: Path, why: str) -> Path | None:
        """Move ``path`` under ``<table>/_quarantine/`` and report it.

        Never raises: on a store that cannot be changed (read-only artifact) the problem
        is reported and the file left where it is (readers skip it anyway).
        """
        qdir = self.root / table / QUARANTINE_DIR / path.parent.name
        dest = qdir / path.name
        try:
            qdir.mkdir(parents=True, exist_ok=True)
            n = 0
            while dest.exists():
                n += 1
                dest = qdir / f"{path.name}.{n}"
            os.replace(path, dest)
        except FileNotFoundError:  # already moved by a concurrent reader
            return None
        except OSError as e:
            msg = f"table {table!r}: {why}; could not move it aside ({e}), skipped"
            log.warning(msg)
            self.problems.append(msg)
            return None
        msg = f"table {table!r}: {why}; moved to {dest}"
        log.warning(msg)
        self.problems.append(msg)
        return dest

    def _migrate(self, table: str, d: Path) -> None:
        """Rename parts and failure records of an older table to injective names, once.

        An old part holding one episode's rows moves to that episode's new name; an old
        part that is empty or unreadable stays where it is (still read, never matched, so
        its episode is redone). Old names could be shared by several episodes: only the
        last one written survived there, and the others are redone by the next run.
        """
        self._migrated.add(table)
        if not d.is_dir() or (d / LAYOUT_FILE).exists():
            return
        try:
            self._migrate_files(table, d)
        except OSError as e:  # e.g. a read-only artifact: still readable as it is
            msg = f"table {table!r}: old part names not migrated ({e})"
            log.warning(msg)
            self.problems.append(msg)

    def _migrate_files(self, table: str, d: Path) -> None:
        for p in sorted(d.glob("*.parquet")):
            if "~" in p.stem:
                continue
            ids = _part_episode_ids(p)
            if ids is None or len(ids) != 1:
                self.problems.append(f"table {table!r}: old part {p.name} not migrated ({ids})")
                continue
            target = d / f"{part_key(next(iter(ids)))}.parquet"
            if target.exists():
                self._quarantine(table, p, f"old part {p.name} superseded by {target.name}")
            else:
                os.replace(p, target)
        fdir = d / FAILURES_DIR
        for p in sorted(fdir.glob("*.json")) if fdir.is_dir() else []:
            if "~" in p.stem:
                continue
            try:
                recs = _parse_record(p.read_bytes(), p)
            except (FailureRecordError, OSError) as e:
                self._quarantine(table, p, str(e))
                continue
            ids = {f.episode_id for f in recs}
            target = fdir / f"{part_key(next(iter(ids)))}.json" if len(ids) == 1 else None
            if target is None or target.exists():
                self._quarantine(table, p, f"old failure record {p.name} not migrated")
            else:
                os.replace(p, target)
        _atomic_write(d / LAYOUT_FILE, lambda f: f.write(json.dumps(LAYOUT).encode()))


__all__ = ["COMMON_COLUMNS", "Failure", "FailureRecordError", "TableStore", "part_key"]
