"""The suite's migrated-schema template (tests/mlflow_template.py) gives a fresh SQLite store
exactly what MLflow's migrations give it: the schema head, and the store's own default
experiment under its own artifact root."""

from __future__ import annotations

import sqlite3


def test_fresh_stores_from_the_template_are_at_head_with_their_own_artifact_root(tmp_path):
    import sqlalchemy
    from mlflow.store.db.utils import _get_latest_schema_revision, _verify_schema
    from mlflow.store.model_registry.sqlalchemy_store import SqlAlchemyStore as Registry
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore as Tracking

    for k in range(2):  # the first may build the template, the second copies it
        db = tmp_path / f"home{k}" / "mlflow.db"
        db.parent.mkdir()
        uri = f"sqlite:///{db}"
        root = tmp_path / f"home{k}" / "artifacts"
        store = Tracking(uri, root.as_uri())
        Registry(uri)  # the registry's tables come with the same schema
        _verify_schema(sqlalchemy.create_engine(uri))
        (rev,) = sqlite3.connect(db).execute("select version_num from alembic_version").fetchone()
        assert rev == _get_latest_schema_revision()
        default = store.get_experiment("0")
        assert default.artifact_location.startswith(root.as_uri())
        exp = store.create_experiment(f"e{k}")
        assert [e.name for e in store.search_experiments()] == [f"e{k}", "Default"]
        assert store.get_experiment(exp).name == f"e{k}"
