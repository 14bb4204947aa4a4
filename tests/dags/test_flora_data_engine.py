"""The flora_data_engine DAG: parses cleanly and runs end to end under ``dag.test()``.

The end-to-end run uses the embedded default backends (kinematic segmenter, the tiny
random VLM for captions and rewards: the session's ``tiny_vlm_dir`` checkpoint copied to
``<FLORA_HOME>/models/tiny``), with the VLM steps bounded to one episode and a small
token budget so the run stays short on 2 CPU cores.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.faults import break_segment_on_episode

REPO = Path(__file__).resolve().parents[2]


def test_dagbag_imports_without_errors(airflow_home):
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(REPO / "dags"))
    assert bag.import_errors == {}
    dag = bag.get_dag("flora_data_engine")
    assert dag is not None
    heavy = {"shard.segment", "shard.caption"} | {f"shard.reward_{m}" for m in
                                                   ("outcome", "dense", "rubric")}  # fmt: skip
    rewards = {t for t in heavy if "reward" in t}
    tail = {"summary", "curate", "export", "report", "finalize"}
    assert set(dag.task_ids) == {"ingest", "validate", "plan_shards"} | heavy | tail
    up = {t.task_id: t.upstream_task_ids for t in dag.tasks}
    assert up["validate"] == {"ingest"} and up["plan_shards"] == {"validate"}
    # The engine steps: one task group mapped over plan_shards' shards.
    group = dag.task_group.children["shard"]
    assert type(group).__name__ == "MappedTaskGroup"
    assert set(group.children) == heavy
    assert up["shard.segment"] == {"validate", "plan_shards"}
    assert up["shard.caption"] == {"shard.segment", "plan_shards"}
    for t in rewards:
        assert up[t] == {"shard.caption", "plan_shards"}
    # summary runs whatever the shards did (all_done): it reports a failed shard.
    assert up["summary"] == rewards | {"validate", "plan_shards"}
    assert dag.get_task("summary").trigger_rule == "all_done"
    assert up["curate"] == {"summary"}
    assert up["export"] == {"curate"} and up["report"] == {"export"}
    (asset,) = dag.get_task("curate").outlets
    assert asset.name == "flora_curated_mixture"
    # Every task retries transient faults (steps resume from their tables); finalize
    # only reads task states.
    retries = {t.task_id: t.retries for t in dag.tasks}
    assert retries.pop("finalize") == 0 and set(retries.values()) == {2}
    assert up["finalize"] == {"report"}
    assert dag.get_task("finalize").trigger_rule == "all_done"
    assert dag.params["shards"] == 2
    assert dag.schedule is None or str(dag.schedule) == "None"


def _nan_action(root: Path, episode: int) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    for p in sorted((root / "data").rglob("*.parquet")):
        df = pq.read_table(p).to_pandas()
        rows = df.index[df.episode_index == episode]
        if len(rows):
            a = np.array(df.at[rows[3], "action"], dtype=np.float32)
            a[1] = np.inf
            df.at[rows[3], "action"] = a
            pq.write_table(pa.Table.from_pandas(df, preserve_index=False), p)
            return
    raise AssertionError("episode not found")


def _events_of(df, episode_id):
    return df[df.episode_id == episode_id]


def _values(obj):
    """Every value nested in a JSON-like object (dicts walked, lists yielded whole)."""
    if isinstance(obj, dict):
        for v in obj.values():
            yield v
            yield from _values(v)


def test_dag_run_logs_mlflow_and_quarantines_bad_episode(
    airflow_home, tiny_dataset, tiny_vlm_dir, tmp_path
):
    import pandas as pd
    from airflow.dag_processing.dagbag import DagBag
    from mlflow.tracking import MlflowClient

    from flora.orchestration.shards import episode_set
    from flora.settings import get_settings
    from flora.tables import TableStore
    from flora.tracking import child_runs

    _, flora_home = airflow_home
    # The embedded VLM: the session's tiny checkpoint where flora.engine looks for it.
    shutil.copytree(tiny_vlm_dir(), flora_home / "models" / "tiny")
    # A copy of the tiny dataset with one damaged episode: the run must succeed, log
    # everything to MLflow, and hand only the valid episodes downstream.
    root = tmp_path / tiny_dataset.name
    shutil.copytree(tiny_dataset, root)
    _nan_action(root, 1)

    dag = DagBag(dag_folder=str(REPO / "dags")).get_dag("flora_data_engine")
    conf = {"dataset": str(root), "vlm_max_episodes": 1, "max_attempts": 1, "max_new_tokens": 16}
    dr = dag.test(run_conf=conf)
    states = {ti.task_id: ti.state for ti in dr.get_task_instances()}
    assert str(dr.state) in ("success", "DagRunState.SUCCESS"), states

    ti = next(t for t in dr.get_task_instances() if t.task_id == "report")
    state = ti.xcom_pull(task_ids="report")
    # Two shards (the default), one valid episode each; XCom carries references only.
    shard_tis = sorted((t.task_id, t.map_index, str(t.state)) for t in dr.get_task_instances()
                       if t.task_id.startswith("shard."))  # fmt: skip
    assert [(t, m) for t, m, _ in shard_tis] == [
        (t, m) for t in sorted(f"shard.{x}" for x in ("caption", "reward_dense", "reward_outcome",
                                                       "reward_rubric", "segment"))
        for m in (0, 1)
    ]  # fmt: skip
    assert all(st.endswith("success") for _, _, st in shard_tis)
    int_lists = [v for v in _values(state)
                 if isinstance(v, list) and v and all(isinstance(x, int) for x in v)]  # fmt: skip
    assert not int_lists, f"episode lists in XCom: {int_lists}"
    assert state["dataset"] == root.name and state["n_episodes"] == 3
    assert (state["n_valid"], state["n_invalid"]) == (2, 1)
    assert episode_set(state, "episodes") == [0, 1, 2]
    assert episode_set(state, "valid") == [0, 2] and episode_set(state, "invalid") == [1]
    assert state["validation_success"] is False and state["failed_shards"] == {}
    report = json.loads(Path(state["validation_report"]).read_text())
    assert report["issues"][0]["episode"] == 1 and report["issues"][0]["field"] == "action"
    assert Path(state["manifest"]) == Path(state["outputs_dir"], "manifest", f"{root.name}.parquet")
    assert Path(state["manifest"]).exists()
    assert Path(state["validation_report"]).parent == Path(state["outputs_dir"], "validation")
    assert str(flora_home) in state["outputs_dir"]

    def full(step: str) -> dict:
        return json.loads(Path(state[step]["report"]).read_text())

    ids = [f"{root.name}/{i:06d}" for i in range(3)]
    store = TableStore(state["outputs_dir"])
    # Segment: every valid episode (kinematic baseline), never the quarantined one; each
    # shard segmented its own episode.
    events = store.read("events")
    assert set(events.episode_id) == {ids[0], ids[2]}
    assert set(events.model) == {"kinematic-baseline"}
    assert set(events.run_id) == {state["mlflow_run_id"]}
    seg = state["segment"]
    assert seg["valid"] == "passed" and seg["rows"] == len(events) > 0
    assert full("segment")["episodes_in"] == [0, 2]
    assert Path(seg["table_dir"]) == store.root / "events"
    steps_dir = Path(seg["report"]).parent
    assert json.loads((steps_dir / "segment.0-of-2.json").read_text())["episodes_in"] == [0]
    assert json.loads((steps_dir / "segment.1-of-2.json").read_text())["episodes_in"] == [2]

    # VLM steps: the first valid episode only (vlm_max_episodes=1, applied to the whole run
    # before sharding: shard 1 gets none). Every event / episode ends as a validated row
    # or as a recorded failure with its reason — nothing filled.
    assert json.loads((steps_dir / "caption.1-of-2.json").read_text())["episodes_in"] == []
    ev0 = _events_of(events, ids[0])
    caps, cap_fails = store.read("captions"), store.failures("captions")
    assert set(caps.episode_id) <= {ids[0]} and {f.episode_id for f in cap_fails} <= {ids[0]}
    captioned = set(_events_of(caps, ids[0]).event_index) if len(caps) else set()
    failed = {int(f.item.split()[1]) for f in cap_fails}
    assert captioned | failed == set(ev0.event_index) and not captioned & failed
    assert all(f.reason for f in cap_fails)
    assert full("caption")["episodes_in"] == [0]
    assert state["caption"]["n_failures"] == len(cap_fails)
    for step, table in (("outcome", "outcome"), ("dense", "dense_labels"), ("rubric", "rubric")):
        df, fails = store.read(table), store.failures(table)
        rows_for = set(df.episode_id) if len(df) else set()
        failed_for = {f.episode_id for f in fails}
        assert ids[0] in rows_for | failed_for, table  # processed: a row or a failure
        assert ids[2] not in rows_for | failed_for, table  # beyond vlm_max_episodes
        assert all(f.reason and f.item for f in fails), table
        rep = state[step]
        assert rep["table"] == table and rep["n_failures"] == len(fails)
        assert rep["rows"] == len(df) and full(step)["episodes_in"] == [0]
        if len(df):
            assert rep["valid"] == "passed" and set(df.run_id) == {state["mlflow_run_id"]}
        else:
            assert rep["valid"] == "empty"
        assert state["tables"][table]["failures"] == len(fails)
    # The tiny random model does not follow the grammars: its failures name the grammar.
    assert any("attempt" in f.reason for t in ("outcome", "rubric") for f in store.failures(t))
    summary = json.loads(Path(state["summary_path"]).read_text())
    assert set(summary) == {"events", "captions", "outcome", "dense_labels", "rubric"}
    assert summary["events"]["rows"] == len(events)

    # MLflow: a parent run for the DAG run with the run's totals, a child run per task.
    s = get_settings()
    assert str(flora_home) in s.tracking_uri
    client = MlflowClient(tracking_uri=s.tracking_uri)
    run = client.get_run(state["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    assert client.get_experiment(run.info.experiment_id).name == s.mlflow_experiment
    assert run.data.tags["dataset"] == root.name
    assert run.data.tags["orchestrator"] == "airflow"
    assert run.data.tags["airflow.run_id"] == dr.run_id
    assert run.data.tags["flora.git_commit"] and run.data.params["vlm_max_episodes"] == "1"
    assert run.data.tags["validation.raw"] == "failed"
    assert run.data.tags["validation.events"] == "passed"
    assert run.data.tags["step.segment.model"] == "kinematic-baseline"
    assert run.data.tags["step.caption.model"] == "transformers"
    m = run.data.metrics
    assert m["ingest.episodes"] == 3 and m["validation.valid_episodes"] == 2
    assert m["step.segment.rows"] == len(events) and m["step.segment.episodes_in"] == 2
    assert m["table.events.rows"] == len(events) and m["shards.failed"] == 0
    assert 0.0 <= m["segment.f1_at_0.5"] <= 1.0 and m["segment.n_ref"] > 0
    assert m["segment.missing_episodes"] == 1  # the quarantined episode predicts nothing
    for step, table in (("caption", "captions"), ("outcome", "outcome"),
                        ("dense", "dense_labels"), ("rubric", "rubric")):  # fmt: skip
        assert m[f"step.{step}.episodes_in"] == 1
        assert m[f"step.{step}.failures"] == len(store.failures(table))
        assert m[f"table.{table}.rows"] == state[step]["rows"]
    steps_arts = {a.path for a in client.list_artifacts(run.info.run_id, "steps")}
    assert steps_arts == {f"steps/{s}.json" for s in ("segment", "caption", "outcome",
                                                      "dense", "rubric")}  # fmt: skip
    assert "engine_summary.json" in {a.path for a in client.list_artifacts(run.info.run_id)}
    children = child_runs(run.info.run_id)
    by_step: dict[str, list] = {}
    for c in children:
        assert c.info.status == "FINISHED" and c.data.tags["airflow.run_id"] == dr.run_id
        by_step.setdefault(c.data.tags["flora.step"], []).append(c)
    engine = ("segment", "caption", "outcome", "dense", "rubric")
    assert {k: len(v) for k, v in by_step.items()} == {
        "ingest": 1, "validate": 1, **dict.fromkeys(engine, 2), "curate": 1, "export": 1,
        "report": 1}  # fmt: skip
    for step in engine:
        assert sorted(c.data.tags["flora.shard"] for c in by_step[step]) == ["0-of-2", "1-of-2"]
    (ingest_run,) = by_step["ingest"]
    assert ingest_run.data.metrics["table.manifest.rows"] == 3
    (validate_run,) = by_step["validate"]
    assert validate_run.data.metrics["validation.raw.success"] == 0.0
    vid = validate_run.info.run_id
    assert "validation/raw.json" in {a.path for a in client.list_artifacts(vid, "validation")}
    shard0 = next(c for c in by_step["segment"] if c.data.tags["flora.shard"] == "0-of-2")
    assert shard0.data.metrics["step.segment.episodes_in"] == 1
    assert shard0.data.metrics["validation.events.success"] == 1.0

    # Curate -> export -> report. The tiny model's captions and rewards are mostly rejected,
    # so the mixture is the kinematic events of the valid episodes in the policy split,
    # each row saying which table it could not use and why.
    cur = state["curate"]
    mix = pd.read_parquet(cur["mixture_path"])
    assert cur["rows"] == len(mix) > 0 and set(mix.episode_id) <= {ids[0], ids[2]}
    assert "policy" in set(mix.split) and ids[1] not in set(mix.episode_id)
    assert all(w > 0 for w in mix.weight)
    assert abs(mix.groupby("split").weight.sum() - 1).max() < 1e-9
    assert all("events" in t for t in mix.source_tables)
    (curate_run,) = by_step["curate"]
    curate_run = client.get_run(curate_run.info.run_id)
    assert curate_run.data.tags["validation.mixture"] == "passed"
    assert cur["summary"]["dvc"] == {"skipped": "no dvc_repo configured"}
    (ds_input,) = curate_run.inputs.dataset_inputs
    assert ds_input.dataset.name == f"{root.name}-mixture"
    assert {t.key: t.value for t in ds_input.tags}["mlflow.data.context"] == "curated-mixture"
    cm = curate_run.data.metrics
    assert cm["curate.mixture.policy.rows"] == float((mix.split == "policy").sum())
    exp = state["export"]
    assert exp["episodes"] == 3 and Path(exp["root"], "meta", "info.json").exists()
    assert exp["n_episodes_without_events"] == 3  # no caption passed: no language rows
    info = json.loads(Path(exp["root"], "meta", "info.json").read_text())
    assert info["features"]["language_persistent"]["dtype"] == "language"
    rep = state["report"]
    assert Path(rep["index"]).exists() and rep["episode_pages"] == 2
    assert Path(rep["root"]).is_relative_to(Path(state["outputs_dir"], "reports"))
    (report_run,) = by_step["report"]
    arts = {a.path for a in client.list_artifacts(report_run.info.run_id, "report")}
    assert "report/index.html" in arts

    from airflow.models.asset import AssetEvent
    from airflow.utils.session import create_session

    with create_session() as session:
        events = [e for e in session.query(AssetEvent).all()
                  if e.extra.get("mlflow_run_id") == state["mlflow_run_id"]]  # fmt: skip
    assert len(events) == 1 and events[0].extra["path"] == cur["mixture_path"]


def test_table_failing_its_suite_stops_the_run(airflow_home, tiny_dataset, tmp_path, monkeypatch):
    """A corrupt events table fails ``segment``: nothing downstream runs, MLflow run FAILED."""
    import pandas as pd
    from airflow.dag_processing.dagbag import DagBag
    from mlflow.tracking import MlflowClient

    from flora.segment.run import EVENT_DTYPES
    from flora.settings import get_settings
    from flora.tables import TableStore
    from flora.tracking import child_runs

    home = tmp_path / "flora_home"
    monkeypatch.setenv("FLORA_HOME", str(home))
    get_settings.cache_clear()
    # Another dataset's part already in the shared store, with an inverted interval.
    bad = {"episode_id": "other/000003", "dataset": "other", "model": "m", "model_version": "1",
           "run_id": "r", "event_index": 0, "start_us": 2_000_000, "end_us": 1_000_000,
           "duration_us": 5_000_000, "caption": "", "source": "stitch", "n_windows": 1,
           "windows": "0", "profile": "standard", "start_refined": False,
           "end_refined": False}  # fmt: skip
    TableStore(home / "outputs").write(
        "events", "other/000003", pd.DataFrame([bad]).astype(EVENT_DTYPES)
    )
    dag = DagBag(dag_folder=str(REPO / "dags")).get_dag("flora_data_engine")
    dr = dag.test(run_conf={"dataset": str(tiny_dataset)})
    tis = dr.get_task_instances()
    states = {(ti.task_id, ti.map_index): str(ti.state) for ti in tis}
    assert "failed" in str(dr.state).lower(), states
    get_settings.cache_clear()  # this test's FLORA_HOME must not outlive it
    assert states[("validate", -1)].endswith("success")
    # Every shard validates the whole table after writing: each one refuses it, once (a
    # table failing its suite fails alike on every try: no retry).
    segs = [ti for ti in tis if ti.task_id == "shard.segment"]
    assert sorted(ti.map_index for ti in segs) == [0, 1]
    assert all(str(ti.state).endswith("failed") and ti.try_number == 1 for ti in segs)
    for (t, _), st in states.items():
        if t.startswith("shard.") and t != "shard.segment" or t in ("curate", "export", "report"):
            assert st.endswith("upstream_failed"), (t, states)
    # summary still ran (all_done): it reports the failed shards, then fails.
    assert states[("summary", -1)].endswith("failed")

    client = MlflowClient(tracking_uri=get_settings().tracking_uri)
    exp = client.get_experiment_by_name(get_settings().mlflow_experiment)
    (run,) = client.search_runs([exp.experiment_id], "tags.`flora.pipeline_parent` = '1'")
    assert run.info.status == "FAILED"
    assert run.data.tags["flora.failed_shards"] == "0-of-2,1-of-2"
    failed = set(run.data.tags["flora.failed_tasks"].split(","))
    assert {"shard.segment_0", "shard.segment_1", "summary"} <= failed
    seg_runs = [c for c in child_runs(run.info.run_id) if c.data.tags["flora.step"] == "segment"]
    assert len(seg_runs) == 2 and {c.info.status for c in seg_runs} == {"FAILED"}
    seg = seg_runs[0]
    assert seg.data.tags["validation.events"] == "failed"
    assert seg.data.metrics["validation.events.success"] == 0.0
    report = json.loads(
        Path(
            client.download_artifacts(seg.info.run_id, "validation/events.json", str(tmp_path))
        ).read_text()
    )
    assert report["failing_episodes"] == ["other/000003"]
    assert not (home / "outputs" / "captions").exists()


def test_kubernetes_provider_with_airflow_3(airflow_home):
    """Provider 10.5.0 (kubernetes<31, shared with kfp) works with Airflow 3 (docs/dependencies)."""
    import kubernetes
    import pendulum
    from airflow.providers.cncf.kubernetes.executors.kubernetes_executor import (
        KubernetesExecutor,
    )
    from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator
    from airflow.sdk import DAG, task
    from kubernetes.client import models as k8s

    assert int(kubernetes.__version__.split(".")[0]) < 31
    assert KubernetesExecutor is not None and hasattr(task, "kubernetes")
    with DAG("gpu_step_probe", schedule=None, start_date=pendulum.datetime(2026, 1, 1)) as dag:
        op = KubernetesPodOperator(
            task_id="segment_gpu",
            name="flora-segment",
            image="ghcr.io/flora-robotics/flora:cuda",
            cmds=["python", "-m", "flora.cli"],
            container_resources=k8s.V1ResourceRequirements(limits={"nvidia.com/gpu": "1"}),
        )
    assert dag.get_task("segment_gpu") is op
    assert op.container_resources.limits == {"nvidia.com/gpu": "1"}


def test_step_options_and_backend_choice(tmp_path):
    """What the adapters pass on: episode bound, token cap, and FLORA_BACKEND -> backends."""
    import pytest

    from flora.backends.openai_backend import OpenAIBackend
    from flora.engine import (
        StepOptions,
        ensure_tiny_vlm,
        segment_backend,
        tiny_model_dir,
        vlm_backend,
    )
    from flora.settings import FloraSettings

    opts = StepOptions.from_mapping({"vlm_max_episodes": 2, "max_new_tokens": 16, "x": 1})
    assert opts.vlm_episodes([5, 1, 3]) == [1, 3]
    assert (opts.tokens(8), opts.tokens(768)) == (8, 16)
    default = StepOptions.from_mapping({"vlm_max_episodes": None, "max_new_tokens": None})
    assert default == StepOptions() and default.vlm_episodes([2, 0]) == [0, 2]
    assert default.tokens(768) == 768 and default.max_attempts == 3
    with pytest.raises(ValueError, match="max_attempts"):
        StepOptions(max_attempts=0)

    # Production: one configured backend for every VLM step; no tiny model is built.
    served = FloraSettings(home=tmp_path / "a", backend="openai",
                           openai_base_url="http://127.0.0.1:9")  # fmt: skip
    assert isinstance(segment_backend(served), OpenAIBackend)
    assert isinstance(vlm_backend(served), OpenAIBackend)
    assert vlm_backend(served) is vlm_backend(served)  # loaded once per process
    assert not tiny_model_dir(served).exists()
    # Embedded default: kinematic segmenter; the tiny model is built once, atomically.
    embedded = FloraSettings(home=tmp_path / "b")
    assert segment_backend(embedded) is None
    path = ensure_tiny_vlm(tiny_model_dir(embedded))
    assert path == tmp_path / "b" / "models" / "tiny" and (path / "flora_tiny.json").exists()
    stamp = (path / "config.json").stat().st_mtime_ns
    assert ensure_tiny_vlm(path) == path and (path / "config.json").stat().st_mtime_ns == stamp
    assert sorted(p.name for p in path.parent.iterdir()) == ["tiny"]  # no temp dir left


def test_bad_input_fails_at_once_and_other_faults_retry(airflow_home):
    # airflow_home: airflow reads its configuration on first import (conftest).
    from airflow.sdk.exceptions import AirflowFailException

    from flora.data.episode import FloraDataError
    from flora.orchestration.tasks import fail_fast_on_bad_input

    def bad():
        raise FloraDataError("action has NaN", episode=3, field="action")

    with pytest.raises(AirflowFailException, match="segment: FloraDataError: .*episode=3"):
        fail_fast_on_bad_input("segment", bad)

    def lost_node():
        raise ConnectionError("worker lost")

    with pytest.raises(ConnectionError):  # propagates as is: Airflow retries it
        fail_fast_on_bad_input("segment", lost_node)
    assert fail_fast_on_bad_input("segment", lambda x, y=0: x + y, 1, y=2) == 3


def test_a_failed_ingest_closes_the_parent_run_it_opened(airflow_home, tmp_path, monkeypatch):
    """ingest opens the pipeline's parent run, then fails on a folder that is no dataset:
    finalize never learns that run's id (no XCom), so ingest closes it FAILED itself;
    before, each try (Airflow retries twice) left one more parent RUNNING."""
    from mlflow import MlflowClient

    from dags.flora_data_engine import dag_object
    from flora.settings import get_settings
    from flora.tracking import PARENT_TAG, configure

    monkeypatch.setenv("FLORA_HOME", str(tmp_path / "home"))
    get_settings.cache_clear()
    empty = tmp_path / "not_a_dataset"
    empty.mkdir()
    ingest = dag_object.get_task("ingest")
    for _ in range(2):  # a first try and Airflow's retry
        with pytest.raises(Exception, match="not a dataset"):
            ingest.python_callable(params={"dataset": str(empty)}, dag_run=None)
    configure()
    runs = MlflowClient().search_runs(
        [e.experiment_id for e in MlflowClient().search_experiments()],
        f"tags.`{PARENT_TAG}` = '1'",
    )
    assert len(runs) == 2
    assert {r.info.status for r in runs} == {"FAILED"}
    assert {r.data.tags["flora.failed_tasks"] for r in runs} == {"ingest"}
    get_settings.cache_clear()


def test_a_failed_shard_is_reported_while_the_others_complete(
    airflow_home, tiny_dataset, tiny_vlm_dir, monkeypatch, tmp_path
):
    """One shard's segment fails: the other shards run every step, ``summary`` records what
    they did and names the failed shard, and the MLflow parent run and the DAG run fail."""
    from airflow.dag_processing.dagbag import DagBag
    from mlflow.tracking import MlflowClient

    from flora.settings import get_settings
    from flora.tables import TableStore

    flora_home = tmp_path / "flora_home"
    monkeypatch.setenv("FLORA_HOME", str(flora_home))
    get_settings.cache_clear()
    shutil.copytree(tiny_vlm_dir(), flora_home / "models" / "tiny")
    break_segment_on_episode(monkeypatch, 1)
    dag = DagBag(dag_folder=str(REPO / "dags")).get_dag("flora_data_engine")
    conf = {"dataset": str(tiny_dataset), "shards": 3, "max_attempts": 1, "max_new_tokens": 8}
    dr = dag.test(run_conf=conf)
    tis = dr.get_task_instances()
    states = {(ti.task_id, ti.map_index): str(ti.state) for ti in tis}
    get_settings.cache_clear()
    heavy = ("segment", "caption", "reward_outcome", "reward_dense", "reward_rubric")
    for k in (0, 2):  # the other shards: every step
        for t in heavy:
            assert states[(f"shard.{t}", k)].endswith("success"), (t, k, states)
    assert states[("shard.segment", 1)].endswith("failed")
    assert next(t for t in tis if t.task_id == "shard.segment" and t.map_index == 1).try_number == 1
    for t in heavy[1:]:
        assert states[(f"shard.{t}", 1)].endswith("upstream_failed")
    assert states[("summary", -1)].endswith("failed")
    for t in ("curate", "export", "report"):  # no mixture from a partial run
        assert states[(t, -1)].endswith("upstream_failed")
    # finalize closes the MLflow run FAILED, then fails so the DAG run shows the failure.
    assert states[("finalize", -1)].endswith("failed")
    assert "failed" in str(dr.state).lower()

    run_id = next(t for t in tis if t.task_id == "ingest").xcom_pull(task_ids="ingest")[
        "mlflow_run_id"
    ]
    run = MlflowClient(tracking_uri=get_settings().tracking_uri).get_run(run_id)
    assert run.info.status == "FAILED"
    failed = set(run.data.tags["flora.failed_tasks"].split(","))
    assert {"shard.segment_1", "summary"} <= failed and "shard.segment_0" not in failed
    assert run.data.tags["flora.failed_shards"] == "1-of-3"
    # What the completed shards did is recorded: their episodes' rows and the summary.
    out = flora_home / "outputs"
    summary = json.loads((out / "runs" / tiny_dataset.name / f"{run_id}.json").read_text())
    assert summary["events"]["episodes_in"] == 2 and summary["captions"]["episodes_in"] == 2
    assert run.data.metrics["step.segment.episodes_in"] == 2
    events = TableStore(out).read("events")
    assert set(events.episode_id) == {f"{tiny_dataset.name}/{i:06d}" for i in (0, 2)}
