"""A migrated MLflow SQLite schema, built once per test worker and copied into fresh stores.

Most tests point FLORA_HOME at a fresh folder, so each opens a new ``mlflow.db`` and MLflow
runs its whole alembic history on it: about seven seconds on two cores, more than most of
those tests take otherwise. Here the first fresh SQLite store of a worker runs the real
migrations into a template database, and every later fresh store gets that database's
content through SQLite's backup API. MLflow itself is untouched otherwise: its store still
checks the tables, creates its default experiment with its own artifact root and verifies
the schema head. Anything but a local SQLite file goes through the real migrations.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

_lock = threading.Lock()


def _sqlite_file(engine: Any) -> str | None:
    url = engine.url
    if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
        return None
    return url.database


def template_initializer(real: Callable[[Any], None], template: Path) -> Callable[[Any], None]:
    """Wrap MLflow's ``_initialize_tables``: migrate ``template`` once, copy it after."""

    def initialize(engine: Any) -> None:
        if _sqlite_file(engine) is None:
            return real(engine)
        import sqlalchemy

        with _lock:
            if not template.exists():
                scratch = template.with_suffix(".partial")
                scratch.unlink(missing_ok=True)
                eng = sqlalchemy.create_engine(f"sqlite:///{scratch}")
                try:
                    real(eng)
                finally:
                    eng.dispose()
                scratch.rename(template)
            from mlflow.store.db.utils import _all_tables_exist

            if _all_tables_exist(engine):  # another thread's store got here first
                return None
            src = sqlite3.connect(template)
            try:
                with engine.connect() as conn:
                    src.backup(conn.connection.dbapi_connection)
            finally:
                src.close()
            engine.dispose()  # no pooled connection keeps the empty schema it saw before
        return None

    return initialize


def patched_mlflow_migrations(template: Path) -> Iterator[None]:
    """Install the wrapper where MLflow's stores call it; restore on exit."""
    import mlflow.store.db.utils as db_utils
    import mlflow.store.model_registry.sqlalchemy_store as registry_store

    real = db_utils._initialize_tables
    wrapped = template_initializer(real, template)
    db_utils._initialize_tables = wrapped
    registry_store._initialize_tables = wrapped
    try:
        yield
    finally:
        db_utils._initialize_tables = real
        registry_store._initialize_tables = real
