"""KFP v2 data-engine pipeline: compiles to the committed YAML and runs under kfp.local.

The local run uses the embedded default backends (kinematic segmenter; the tiny random
VLM from the session's ``tiny_vlm_dir``, copied to ``<FLORA_HOME>/models/tiny``) with
the VLM steps bounded to one episode, one attempt and 8 new tokens: every component is a
fresh Python process here, so imports dominate the runtime.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.components.helpers import assert_gpu_container, assert_on_cluster, load_compiled

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def flora_home(tmp_path, monkeypatch):
    from flora.settings import get_settings

    home = tmp_path / "flora_home"
    # kfp.local subprocesses inherit this environment, so they log to the same store.
    monkeypatch.setenv("FLORA_HOME", str(home))
    monkeypatch.delenv("FLORA_MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("GX_ANALYTICS_ENABLED", "false")
    get_settings.cache_clear()
    yield home
    get_settings.cache_clear()


def test_compiles_to_committed_yaml(tmp_path, monkeypatch):
    monkeypatch.delenv("FLORA_IMAGE", raising=False)
    monkeypatch.delenv("FLORA_CUDA_IMAGE", raising=False)
    from components.data_engine_pipeline import PIPELINE_YAML, compile_pipeline

    fresh, k8s = load_compiled(compile_pipeline(tmp_path / "p.yaml"))
    assert (fresh, k8s) == load_compiled(PIPELINE_YAML), (
        "run `python -m components.data_engine_pipeline` and commit"
    )
    execs = fresh["deploymentSpec"]["executors"]
    assert set(execs) == set(k8s) == {
        f"exec-{n}"
        for n in ("ingest-op", "validate-op", "segment-op", "caption-op", "summary-op",
                  "reward-op", "reward-op-2", "reward-op-3", "curate-op", "export-op",
                  "report-op")
    }  # fmt: skip
    for name, ex in execs.items():
        # The heavy steps are GPU steps (CUDA image, nvidia.com/gpu), as the Airflow DAG's
        # production pods; every task mounts the PVC and gets the ConfigMap and Secret.
        gpu = name.startswith(("exec-segment", "exec-caption", "exec-reward"))
        assert_gpu_container(ex["container"], gpu=gpu)
        assert_on_cluster(k8s[name], gpu=gpu)
    tasks = fresh["root"]["dag"]["tasks"]
    assert tasks["validate-op"]["dependentTasks"] == ["ingest-op"]
    assert "validate-op" in tasks["segment-op"]["dependentTasks"]
    assert "segment-op" in tasks["caption-op"]["dependentTasks"]
    modes = {}
    for key in ("reward-op", "reward-op-2", "reward-op-3"):
        assert "caption-op" in tasks[key]["dependentTasks"]
        params = tasks[key]["inputs"]["parameters"]
        modes[params["mode"]["runtimeValue"]["constant"]] = tasks[key]["taskInfo"]["name"]
    assert modes == {m: f"reward-{m}" for m in ("outcome", "dense", "rubric")}
    assert {"reward-op", "reward-op-2", "reward-op-3", "segment-op", "caption-op"} <= set(
        tasks["summary-op"]["dependentTasks"]
    )
    # curate reads every table artifact and runs after the summary; export and report
    # read the curated mixture artifact.
    assert {"summary-op", "segment-op", "caption-op", "reward-op", "reward-op-2",
            "reward-op-3"} <= set(tasks["curate-op"]["dependentTasks"])  # fmt: skip
    assert "curate-op" in tasks["export-op"]["dependentTasks"]
    assert {"curate-op", "export-op"} <= set(tasks["report-op"]["dependentTasks"])
    arts = tasks["curate-op"]["inputs"]["artifacts"]
    assert set(arts) == {"events", "captions", "outcome", "dense", "rubric"}
    for t in tasks.values():
        assert t["cachingOptions"] == {}  # caching off (enableCache absent = false)


def test_runs_locally_with_subprocess_runner(flora_home, tiny_dataset, tiny_vlm_dir, tmp_path):
    import shutil

    import pandas as pd
    from kfp import local
    from mlflow.tracking import MlflowClient

    from components.data_engine_pipeline import data_engine_pipeline
    from flora.settings import get_settings

    shutil.copytree(tiny_vlm_dir(), flora_home / "models" / "tiny")
    kfp_root = tmp_path / "kfp_root"
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(kfp_root))
    task = data_engine_pipeline(
        dataset_path=str(tiny_dataset), vlm_max_episodes=1, max_attempts=1, max_new_tokens=8
    )
    tables = task.output
    assert set(tables) == {"events", "captions", "outcome", "dense_labels", "rubric"}

    # The validation report artifact and the manifest written by the first two components.
    reports = list(kfp_root.rglob("validate-op/report"))
    assert len(reports) == 1
    rep = json.loads(reports[0].read_text())
    assert rep["success"] is True and rep["dataset"] == tiny_dataset.name
    assert len(list(kfp_root.rglob("ingest-op/manifest"))) == 1

    # Tables travel as Dataset artifacts: <artifact>/<table>/ parts (+ _failures/).
    ids = [f"{tiny_dataset.name}/{i:06d}" for i in range(3)]
    (events_dir,) = kfp_root.rglob("segment-op/events/events")
    events = pd.concat(pd.read_parquet(p) for p in events_dir.glob("*.parquet"))
    assert set(events.episode_id) == set(ids) and set(events.model) == {"kinematic-baseline"}
    assert tables["events"]["rows"] == len(events) and tables["events"]["valid"] == "passed"
    assert tables["events"]["table_dir"] == str(events_dir)
    assert 0.0 <= tables["events"]["metrics"]["segment.f1_at_0.5"] <= 1.0
    for table in ("captions", "outcome", "dense_labels", "rubric"):
        t = tables[table]
        assert t["episodes_in"] == 1, table  # vlm_max_episodes=1: episode 0 only
        d = Path(t["table_dir"])
        assert d.name == table and d.is_relative_to(kfp_root)
        parts = list(d.glob("*.parquet"))
        fails = [f for p in d.glob("_failures/*.json") for f in json.loads(p.read_text())]
        rows = pd.concat(pd.read_parquet(p) for p in parts) if parts else pd.DataFrame()
        assert t["rows"] == len(rows) and t["failures"] == len(fails), table
        assert set(rows.get("episode_id", [])) | {f["episode_id"] for f in fails} == {ids[0]}
        assert all(f["reason"] for f in fails)
    # The tiny model ignores the outcome grammar with 8 tokens and 1 attempt: a failure.
    assert tables["outcome"]["failures"] == 1 and tables["outcome"]["rows"] == 0
    assert "after 1 attempts" in tables["outcome"]["failure_examples"][0]

    client = MlflowClient(tracking_uri=get_settings().tracking_uri)
    exp = client.get_experiment_by_name(get_settings().mlflow_experiment)
    runs = client.search_runs([exp.experiment_id])
    assert len(runs) == 1
    run = runs[0]
    assert run.info.status == "FINISHED"
    assert run.data.tags["orchestrator"] == "kfp"
    steps = run.data.tags["flora.steps"].split(",")
    assert steps[:4] == ["ingest", "validate", "segment", "caption"]
    assert sorted(steps[4:7]) == ["dense", "outcome", "rubric"]
    assert steps[7:] == ["summary", "curate", "export", "report"]
    m = run.data.metrics
    assert m["validation.raw.success"] == 1.0 and m["ingest.episodes"] == 3
    assert m["step.segment.rows"] == len(events) and m["validation.events.success"] == 1.0
    assert m["segment.f1_at_0.5"] == tables["events"]["metrics"]["segment.f1_at_0.5"]
    for step, table in (("caption", "captions"), ("outcome", "outcome"),
                        ("dense", "dense_labels"), ("rubric", "rubric")):  # fmt: skip
        assert m[f"step.{step}.failures"] == tables[table]["failures"]
        assert m[f"step.{step}.episodes_in"] == 1
    assert "engine_summary.json" in {a.path for a in client.list_artifacts(run.info.run_id)}

    # Curate -> export -> report, each from the artifacts of the steps before it.
    (mix_path,) = kfp_root.rglob(f"curate-op/mixture/curated/{tiny_dataset.name}/mixture.parquet")
    mix = pd.read_parquet(mix_path)
    assert len(mix) > 0 and set(mix.episode_id) <= set(ids)
    assert abs(mix.groupby("split").weight.sum() - 1).max() < 1e-9
    assert run.data.tags["validation.mixture"] == "passed"
    assert [d.dataset.name for d in run.inputs.dataset_inputs] == [f"{tiny_dataset.name}-mixture"]
    (info,) = kfp_root.rglob("export-op/export/meta/info.json")
    assert json.loads(info.read_text())["features"]["language_persistent"]["dtype"] == "language"
    assert list(kfp_root.rglob("export-op/export/flora_annotations/manifest.json"))
    (index,) = kfp_root.rglob("report-op/report/index.html")
    assert "Curated mixture" in index.read_text()
    assert "report/index.html" in {a.path for a in client.list_artifacts(run.info.run_id, "report")}
    assert os.environ["FLORA_HOME"] == str(flora_home)
