"""Production mode: the same DAG files build GPU pods for the heavy steps.

With ``FLORA_MODE=production`` (and the cluster settings a deployment sets) each DAG is
imported through a ``DagBag`` — no cluster — and its heavy tasks must be
``KubernetesPodOperator`` s whose pod request carries the CUDA image, ``nvidia.com/gpu``
limits = requests, the GPU tolerations and node selector, the shared PVC and its mount,
the environment from the ``flora-pipeline-env`` ConfigMap and Secrets by reference, and
the command ``python -m flora.orchestration.pod <step>`` whose templated ``--inputs``
render to the upstream XCom values. With default settings the same files build in-process
``@task`` s. The pod command itself is run on the tiny toy world with arguments rendered
from the production DAG, and its result compared with the in-process step's.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[2]
CUDA_IMAGE = "registry.example/flora:cuda-test"

#: DAG -> heavy task id -> the step its pod runs.
HEAVY = {
    "flora_data_engine": {
        "shard.segment": "segment",
        "shard.caption": "caption",
        "shard.reward_outcome": "reward",
        "shard.reward_dense": "reward",
        "shard.reward_rubric": "reward",
    },
    "flora_train_models": {
        **{f"{m}.{s}": s for m in ("segmenter", "captioner") for s in ("sft", "grpo", "evaluate")},
        **{f"rewarder.{s}": s for s in ("sft", "evaluate")},
    },
    "flora_policy_rtc": {"train": "policy_train"},
}
#: The run params each step gets in its inputs (the VLM steps read StepOptions from them).
WITH_PARAMS = {"caption", "reward"}


def _production_env(monkeypatch, home: str = "/shared/flora") -> None:
    from flora.settings import get_settings

    env = {
        "FLORA_MODE": "production",
        "FLORA_HOME": home,
        "FLORA_CUDA_IMAGE": CUDA_IMAGE,
        "FLORA_POD_NAMESPACE": "flora",
        "FLORA_GPU_COUNT": "2",
        "FLORA_GPU_NODE_SELECTOR": '{"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}',
        "FLORA_POD_SECRETS": '["flora-object-store", "flora-hf", "team-extra"]',
        "FLORA_GPU_TOLERATIONS": '[{"key": "nvidia.com/gpu", "operator": "Exists", '
        '"effect": "NoSchedule"}, {"key": "spot", "operator": "Exists", '
        '"effect": "NoExecute", "tolerationSeconds": 60}]',
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    get_settings.cache_clear()


@pytest.fixture
def settings_reset():
    from flora.settings import get_settings

    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


def _dagbag():
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(REPO / "dags"))
    assert bag.import_errors == {}
    assert set(HEAVY) <= set(bag.dag_ids)
    return bag


class _TI:
    """What the templates call: ``ti.xcom_pull`` answered from a dict of task results (a
    mapped task's results: a list indexed by map index) and the instance's ``map_index``."""

    def __init__(self, results: dict[str, object], map_index: int = -1):
        self.results = results
        self.map_index = map_index
        self.pulls: list[tuple[str, str, int | None]] = []

    def xcom_pull(self, task_ids: str, key: str = "return_value", map_indexes=None):
        self.pulls.append((task_ids, key, map_indexes))
        value = self.results[task_ids]
        return value if map_indexes is None else value[map_indexes]


class _NoClusterHook:
    is_in_cluster = False

    def get_namespace(self):
        return None

    def get_xcom_sidecar_container_image(self):
        return None

    def get_xcom_sidecar_container_resources(self):
        return None


def _render_args(
    op, results: dict[str, object], params: dict, map_index: int = -1
) -> tuple[list[str], _TI]:
    ti = _TI(results, map_index)
    rendered = op.render_template(op.arguments, {"ti": ti, "params": params})
    return rendered, ti


def test_production_dags_run_heavy_steps_as_gpu_pods(airflow_home, monkeypatch, settings_reset):
    from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator
    from airflow.serialization.serialized_objects import DagSerialization

    _production_env(monkeypatch)
    # No cluster: the hook only answers what building the pod request asks of it.
    monkeypatch.setattr(KubernetesPodOperator, "hook", _NoClusterHook())
    bag = _dagbag()
    for dag_id, heavy in HEAVY.items():
        dag = bag.get_dag(dag_id)
        pods = {t.task_id for t in dag.tasks if isinstance(t, KubernetesPodOperator)}
        assert pods == set(heavy), dag_id  # the light steps stay in-process
        # What the dag-processor stores: the pods' k8s objects must serialize.
        json.dumps(DagSerialization.to_dict(dag))
        for task_id, step in heavy.items():
            op = dag.get_task(task_id)
            assert op.image == CUDA_IMAGE and op.namespace == "flora"
            assert op.do_xcom_push, "the step's result must come back as XCom"
            pod = op.build_pod_request_obj()
            spec = pod.spec
            containers = {c.name: c for c in spec.containers}
            # The step's container and the sidecar that hands /airflow/xcom back as XCom.
            assert set(containers) == {"base", "airflow-xcom-sidecar"}
            c = containers["base"]
            assert c.image == CUDA_IMAGE
            assert c.command == ["python", "-m", "flora.orchestration.pod"]
            assert c.args[0] == step and c.args[1] == "--inputs" and c.args[-1] == "--xcom"
            res = c.resources
            assert res.limits == res.requests
            assert res.limits["nvidia.com/gpu"] == "2"
            assert {"cpu", "memory"} <= set(res.limits)
            assert [
                (t.key, t.operator, t.effect, t.toleration_seconds) for t in spec.tolerations
            ] == [
                ("nvidia.com/gpu", "Exists", "NoSchedule", None),
                ("spot", "Exists", "NoExecute", 60),
            ]
            assert spec.node_selector == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
            vols = {v.name: v for v in spec.volumes}
            assert vols["shared"].persistent_volume_claim.claim_name == "flora-shared"
            mounts = {m.name: m.mount_path for m in c.volume_mounts}
            assert mounts["shared"] == "/shared"
            # The ConfigMap whole; Secrets by reference only: the infra/ Secrets' keys
            # mapped to variable names, an unmapped Secret whole.
            assert [e.config_map_ref.name for e in c.env_from if e.config_map_ref] == [
                "flora-pipeline-env"
            ]
            assert [e.secret_ref.name for e in c.env_from if e.secret_ref] == ["team-extra"]
            refs = {
                e.name: (e.value_from.secret_key_ref.name, e.value_from.secret_key_ref.key)
                for e in c.env
            }
            assert refs == {
                "AWS_ACCESS_KEY_ID": ("flora-object-store", "access-key-id"),
                "AWS_SECRET_ACCESS_KEY": ("flora-object-store", "secret-access-key"),
                "HF_TOKEN": ("flora-hf", "token"),
            }
            assert all(e.value is None for e in c.env)
            sc = spec.security_context  # the workers' user: both write the same files
            assert (sc.run_as_user, sc.run_as_group, sc.fs_group, sc.run_as_non_root) == (
                50000,
                0,
                0,
                True,
            )
            assert pod.metadata.labels["flora.ai/role"] == "pipeline"
            assert pod.metadata.name.startswith("flora-" + re.sub(r"[._]", "-", task_id))
            assert pod.metadata.namespace == "flora"


def test_pod_inputs_render_to_the_upstream_xcom_values(airflow_home, monkeypatch, settings_reset):
    _production_env(monkeypatch)
    bag = _dagbag()
    params = {"vlm_max_episodes": 1, "max_new_tokens": 8}
    state = {"dataset_path": "/shared/data/toy", "mlflow_run_id": "r1", "note": "a'b<c>&"}

    # A shard's pod: its own segment's result (same map index) and its own shard.
    engine = bag.get_dag("flora_data_engine")
    plan = [{"index": 0, "count": 2}, {"index": 1, "count": 2}]
    caption = engine.get_task("shard.caption")
    seg_results = [{**state, "shard": plan[0]}, {**state, "shard": plan[1]}]
    args, ti = _render_args(caption, {"shard.segment": seg_results, "plan_shards": plan},
                            params, map_index=1)  # fmt: skip
    assert json.loads(args[2]) == {"state": seg_results[1], "shard": plan[1], "params": params}
    assert ti.pulls == [("shard.segment", "return_value", 1), ("plan_shards", "return_value", None)]
    assert caption.upstream_task_ids == {"shard.segment", "plan_shards"}
    segment = engine.get_task("shard.segment")
    args, ti = _render_args(segment, {"validate": state, "plan_shards": plan}, {}, map_index=0)
    assert json.loads(args[2]) == {"state": state, "shard": plan[0]}
    assert ti.pulls[0] == ("validate", "return_value", None)  # not mapped: its one value

    built, trained = {"set": "/shared/flora/set"}, {"model_dir": "/shared/flora/m"}
    grpo = bag.get_dag("flora_train_models").get_task("captioner.grpo")
    results = {"prepare": state, "captioner.build_set": built, "captioner.sft": trained}
    args, _ = _render_args(grpo, results, params)
    assert json.loads(args[2]) == {
        "state": state,
        "built": built,
        "model": "captioner",
        "trained": trained,
    }
    assert grpo.upstream_task_ids == {"prepare", "captioner.build_set", "captioner.sft"}


def test_default_settings_build_the_same_dags_in_process(airflow_home, monkeypatch, settings_reset):
    from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator

    monkeypatch.delenv("FLORA_MODE", raising=False)
    bag = _dagbag()
    prod_graph = {}
    for dag_id, heavy in HEAVY.items():
        dag = bag.get_dag(dag_id)
        assert not [t for t in dag.tasks if isinstance(t, KubernetesPodOperator)]
        for task_id in heavy:
            assert type(dag.get_task(task_id)).__name__ == "_PythonDecoratedOperator"
        prod_graph[dag_id] = {t.task_id: t.upstream_task_ids for t in dag.tasks}
    # Same task graph in production.
    _production_env(monkeypatch)
    bag = _dagbag()
    for dag_id, graph in prod_graph.items():
        dag = bag.get_dag(dag_id)
        assert {t.task_id: t.upstream_task_ids for t in dag.tasks} == graph


def test_a_path_off_the_shared_volume_is_refused_in_production(
    monkeypatch, settings_reset, tmp_path
):
    from flora.orchestration import shared_path
    from flora.settings import FloraSettings

    prod = FloraSettings(mode="production", shared_mount=tmp_path / "shared")
    inside = (tmp_path / "shared" / "d").resolve()
    assert shared_path(tmp_path / "shared" / "d", "dataset", prod) == str(inside)
    with pytest.raises(ValueError, match=r"dataset .*/elsewhere is not on the shared volume"):
        shared_path(tmp_path / "elsewhere", "dataset", prod)
    # Relative paths resolve against the worker's cwd: refused too.
    with pytest.raises(ValueError, match="not on the shared volume"):
        shared_path("datasets/toy_world", "dataset", prod)
    embedded = FloraSettings(mode="embedded", shared_mount=tmp_path / "shared")
    assert shared_path(tmp_path / "elsewhere", "x", embedded) == str(
        (tmp_path / "elsewhere").resolve()
    )


def _engine_state(dataset: Path, out: Path, run_id: str, valid: list[int]) -> dict:
    """A data-engine state as ``validate`` hands it on: the valid episodes by reference."""
    from flora.orchestration.shards import write_episode_sets

    state = {"dataset": dataset.name, "dataset_path": str(dataset), "outputs_dir": str(out),
             "mlflow_run_id": run_id}  # fmt: skip
    return {**state, "episode_sets": write_episode_sets(state, valid=valid)}


def _validated_state(dataset: Path, home: Path) -> dict:
    """The state ``ingest`` + ``validate`` hand to ``segment`` (same functions)."""
    from flora.engine import ingest_tracked
    from flora.validation.raw import validate_dataset

    out = home / "outputs"
    result, run_id = ingest_tracked(dataset, out / "manifest" / f"{dataset.name}.parquet",
                                    tags={"dataset": dataset.name}, run_name="t")  # fmt: skip
    report = validate_dataset(dataset, progress=False)
    valid = [i for i in report.valid_episodes if i in set(result.ok_indices())]
    return _engine_state(dataset, out, run_id, valid)


def test_pod_command_runs_the_step_as_the_task_does(
    airflow_home, monkeypatch, settings_reset, tiny_dataset, tmp_path
):
    """The production DAG's segment command, rendered and run here, equals the @task's step."""
    from flora.orchestration.shards import episode_set
    from flora.orchestration.steps import run_step
    from flora.settings import get_settings

    # The "shared volume" is tmp_path: FLORA_HOME and the dataset under it.
    shared = tmp_path / "shared"
    dataset = shared / "data" / tiny_dataset.name
    dataset.parent.mkdir(parents=True)
    os.symlink(tiny_dataset, dataset)  # read-only fixture; the path is what matters
    pod_home, local_home = shared / "pod", shared / "local"
    monkeypatch.setenv("FLORA_HOME", str(pod_home))
    get_settings.cache_clear()
    state = _validated_state(dataset, pod_home)
    assert episode_set(state, "valid") == [0, 1, 2]

    _production_env(monkeypatch, home=str(pod_home))
    monkeypatch.setenv("FLORA_SHARED_MOUNT", str(shared))
    op = _dagbag().get_dag("flora_data_engine").get_task("shard.segment")
    plan = [{"index": 0, "count": 1}]  # one shard: all three episodes
    args, _ = _render_args(op, {"validate": state, "plan_shards": plan}, {}, map_index=0)
    xcom = tmp_path / "xcom" / "return.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "FLORA_MODE": "production"}
    proc = subprocess.run(
        [sys.executable, *op.cmds[1:], *args, str(xcom)],
        env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    pushed = json.loads(xcom.read_text())
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == pushed
    rep = pushed["segment"]
    assert {k: pushed[k] for k in state} == state  # the state passes through
    assert pushed["shard"] == plan[0]
    assert rep["table_dir"].startswith(str(pod_home))
    assert rep["rows"] > 0 and rep["n_failures"] == 0 and rep["valid"] == "passed"
    assert json.loads(Path(rep["report"]).read_text())["episodes_in"] == [0, 1, 2]

    # The in-process @task path: the same function on the same inputs, another store.
    monkeypatch.setenv("FLORA_MODE", "embedded")
    monkeypatch.setenv("FLORA_HOME", str(local_home))
    get_settings.cache_clear()
    local_state = _validated_state(dataset, local_home)
    local = run_step("segment", {"state": local_state, "shard": plan[0]})["segment"]
    assert (local["rows"], local["n_failures"]) == (rep["rows"], rep["n_failures"])
    cols = ["episode_id", "start_us", "end_us", "caption"]
    pod_events = pd.read_parquet(rep["table_dir"])[cols].sort_values(cols[:3])
    local_events = pd.read_parquet(local["table_dir"])[cols].sort_values(cols[:3])
    pd.testing.assert_frame_equal(
        pod_events.reset_index(drop=True), local_events.reset_index(drop=True)
    )


def test_pod_command_refuses_bad_input(airflow_home):
    # airflow_home: airflow reads its configuration on first import (conftest).
    """An unknown step or non-JSON inputs: a usage error naming the problem (exit 2)."""
    from flora.orchestration.pod import main
    from flora.orchestration.tasks import step_task

    with pytest.raises(ValueError, match="unknown step 'tokenize'; known steps: caption"):
        step_task("tokenize")

    with pytest.raises(SystemExit) as e:
        main(["tokenize", "--inputs", "{}"])
    assert e.value.code == 2
    with pytest.raises(SystemExit) as e:
        main(["segment", "--inputs", "{not json"])
    assert e.value.code == 2
    with pytest.raises(SystemExit) as e:
        main(["segment", "--inputs", "[1]"])
    assert e.value.code == 2


def test_a_step_killed_mid_way_and_retried_leaves_the_table_exact(
    monkeypatch, settings_reset, tmp_path
):
    """A pod evicted mid-step (SIGKILL) and its retry: every episode once, rows as a clean run."""
    import signal
    import time

    from flora.data.synth import generate
    from flora.engine import ingest_tracked
    from flora.settings import get_settings
    from flora.tables import TableStore

    dataset = generate(tmp_path / "data" / "toy12", episodes=12, seed=3, progress=False)
    ids = [f"toy12/{i:06d}" for i in range(12)]

    def state_for(home: Path) -> dict:
        monkeypatch.setenv("FLORA_HOME", str(home))
        get_settings.cache_clear()
        out = home / "outputs"
        result, run_id = ingest_tracked(dataset, out / "manifest" / "toy12.parquet",
                                        tags={"dataset": "toy12"}, run_name="t")  # fmt: skip
        assert result.ok_indices() == list(range(12))
        return _engine_state(dataset, out, run_id, list(range(12)))

    def command(state: dict) -> list[str]:
        return [sys.executable, "-m", "flora.orchestration.pod", "segment",
                "--inputs", json.dumps({"state": state})]  # fmt: skip

    killed = state_for(tmp_path / "killed")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # FLORA_HOME: this run's home
    parts = Path(killed["outputs_dir"]) / "events"
    # Niced, so that on a loaded machine this poller still sees the first commit long
    # before the step could finish all 12 episodes (≈ 3 s of work after it).
    proc = subprocess.Popen(command(killed), env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, cwd=tmp_path,
                            preexec_fn=lambda: os.nice(19))  # fmt: skip
    store = TableStore(killed["outputs_dir"])
    for _ in range(100_000):  # kill once an episode is committed (polls, not a clock)
        if any(store.has("events", i) for i in ids):
            break
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
        time.sleep(0.005)
    else:
        proc.kill()
        pytest.fail("the segment step committed no episode")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stderr.close()
    # Episodes are committed one by one (flora.tables), so the kill lands mid-step; the
    # episode being written may be left pending (part written, commit not finished).
    finished = [i for i in ids if store.has("events", i)]
    assert 1 <= len(finished) < 12, f"the step was not interrupted mid-way ({finished})"

    retry = subprocess.run(command(killed), env=env, capture_output=True, text=True,
                           timeout=600, cwd=tmp_path)  # fmt: skip
    assert retry.returncode == 0, retry.stderr[-3000:]
    handed = json.loads(retry.stdout.strip().splitlines()[-1])["segment"]
    rep = json.loads(Path(handed["report"]).read_text())
    assert rep["episodes_in"] == list(range(12)) and rep["n_failures"] == 0
    assert rep["skipped"] == finished  # committed episodes are not redone, the rest are

    clean = state_for(tmp_path / "clean")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command(clean), env=env, capture_output=True, text=True,
                          timeout=600, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]

    ref_store = TableStore(clean["outputs_dir"])
    assert sorted(p.stem for p in parts.glob("*.parquet")) == sorted(
        p.stem for p in (Path(clean["outputs_dir"]) / "events").glob("*.parquet")
    )
    assert store.pending("events") == [] and store.failures("events") == []
    got, ref = store.read("events"), ref_store.read("events")
    assert set(got.episode_id) == set(ids) and set(got.run_id) == {killed["mlflow_run_id"]}
    cols = [c for c in ref.columns if c != "run_id"]  # the two runs have their own ids
    key = ["episode_id", "start_us", "end_us"]
    pd.testing.assert_frame_equal(
        got[cols].sort_values(key).reset_index(drop=True),
        ref[cols].sort_values(key).reset_index(drop=True),
    )
