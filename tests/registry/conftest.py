"""Registry fixtures: real MLflow (SQLite under an isolated FLORA_HOME) with real versions."""

from __future__ import annotations

import pytest

EPISODES = ("toy/ep0", "toy/ep1", "toy/ep2")  # the held-out set versions are scored on


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def registry_home(request, tmp_path_factory):
    """One FLORA_HOME (one SQLite store) per module: creating the MLflow schema is the
    slow part, so tests share it and start from an empty registry instead.

    Every test runs twice: on SQLite, and on the MLflow server backed by a real
    PostgreSQL (``mlflow_pg_server``, which fails loudly if PostgreSQL cannot start)."""
    from flora.settings import get_settings

    home = tmp_path_factory.mktemp("registry") / "flora_home"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FLORA_HOME", str(home))
        mp.delenv("FLORA_MLFLOW_TRACKING_URI", raising=False)
        if request.param == "postgres":
            server = request.getfixturevalue("mlflow_pg_server")
            mp.setenv("FLORA_MLFLOW_TRACKING_URI", server.url)
        get_settings.cache_clear()
        yield home
    get_settings.cache_clear()


@pytest.fixture
def make_version(registry_home, tmp_path):
    """``make_version(model, metrics, suites=True, episodes=EPISODES) -> version`` registered
    in MLflow.

    Each version is a real run with a small logged artifact, registered through the
    MLflow client; its held-out metrics are recorded the way ``flora eval model`` does,
    with the fingerprint of an evaluation on ``episodes`` (None: no fingerprint).
    """
    import mlflow
    from mlflow import MlflowClient

    from flora.tracking import configure, ensure_experiment
    from model_registry.promotion import eval_set_tags, record_evaluation, registered_name

    configure()
    exp = ensure_experiment("flora-test-registry")
    client = MlflowClient()
    for rm in client.search_registered_models():  # every test starts from an empty registry
        client.delete_registered_model(rm.name)

    def make(
        model: str,
        metrics: dict[str, float],
        suites: bool | None = True,
        episodes: tuple[str, ...] | None = EPISODES,
    ) -> str:
        name = registered_name(model)
        try:
            client.create_registered_model(name)
        except mlflow.exceptions.MlflowException:
            pass
        with mlflow.start_run(experiment_id=exp) as run:
            # The layout of a logged Flora model that deploy reads: MLmodel naming the
            # exported folder (artifacts/model) of the "checkpoint" artifact.
            d = tmp_path / f"mv-{run.info.run_id}"
            (d / "artifacts" / "model").mkdir(parents=True)
            (d / "artifacts" / "model" / "weights.txt").write_text("weights")
            (d / "MLmodel").write_text(
                "flavors:\n  python_function:\n    artifacts:\n      checkpoint:\n"
                "        path: artifacts/model\n"
            )
            mlflow.log_artifacts(str(d), artifact_path="model")
        src = f"{run.info.artifact_uri}/model"
        mv = client.create_model_version(name, src, run_id=run.info.run_id)
        fp = eval_set_tags(episodes) if episodes is not None and metrics else None
        record_evaluation(model, mv.version, metrics, suites_passed=suites, eval_set=fp)
        return str(mv.version)

    return make
