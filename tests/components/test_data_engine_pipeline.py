"""KFP v2 data-engine pipeline: compiles to the committed YAML and runs under kfp.local.

The local run uses the embedded default backends (kinematic segmenter; the tiny random
VLM from the session's ``tiny_vlm_dir``, copied to ``<FLORA_HOME>/models/tiny``) with
the VLM steps bounded to one episode, one attempt and 8 new tokens: every component is a
fresh Python process here, so imports dominate the runtime.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from tests.components.helpers import assert_gpu_container, assert_on_cluster, load_compiled
from tests.faults import break_segment_on_episode

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
        for n in ("open-run-op", "finalize-op", "ingest-op", "validate-op", "plan-op",
                  "segment-op", "caption-op", "reward-op", "reward-op-2", "reward-op-3",
                  "summary-op", "check-shards-op", "curate-op", "export-op", "report-op")
    }  # fmt: skip
    for name, ex in execs.items():
        # The heavy steps are GPU steps (CUDA image, nvidia.com/gpu), as the Airflow DAG's
        # production pods; every task mounts the PVC and gets the ConfigMap and Secret.
        gpu = name.startswith(("exec-segment", "exec-caption", "exec-reward"))
        assert_gpu_container(ex["container"], gpu=gpu)
        assert_on_cluster(k8s[name], gpu=gpu)
    # open_run_op opens the MLflow parent run; finalize_op is the exit handler that closes
    # it whatever happened inside (it runs when the group has completed, failed or not).
    root = fresh["root"]["dag"]["tasks"]
    assert set(root) == {"open-run-op", "exit-handler-1", "finalize-op"}
    assert root["exit-handler-1"]["dependentTasks"] == ["open-run-op"]
    assert root["finalize-op"]["triggerPolicy"] == {"strategy": "ALL_UPSTREAM_TASKS_COMPLETED"}
    comps = fresh["components"]
    tasks = comps["comp-exit-handler-1"]["dag"]["tasks"]
    assert tasks["validate-op"]["dependentTasks"] == ["ingest-op"]
    assert tasks["plan-op"]["dependentTasks"] == ["validate-op"]
    # The engine steps fan out over the planned shards (one loop iteration per shard).
    loop = tasks["for-loop-2"]
    items = loop["parameterIterator"]["items"]
    assert items == {"inputParameter": "pipelinechannel--plan-op-Output"}
    shard = comps["comp-for-loop-2"]["dag"]["tasks"]
    assert set(shard) == {"segment-op", "caption-op", "reward-op", "reward-op-2", "reward-op-3"}
    assert shard["caption-op"]["dependentTasks"] == ["segment-op"]
    modes = {}
    for key in ("reward-op", "reward-op-2", "reward-op-3"):
        assert shard[key]["dependentTasks"] == ["caption-op"]
        # The shard's captions artifact: a shard that failed before is not rewarded.
        up = shard[key]["inputs"]["artifacts"]["captions"]["taskOutputArtifact"]
        assert up == {"outputArtifactKey": "captions", "producerTask": "caption-op"}
        params = shard[key]["inputs"]["parameters"]
        modes[params["mode"]["runtimeValue"]["constant"]] = shard[key]["taskInfo"]["name"]
    assert modes == {m: f"reward-{m}" for m in ("outcome", "dense", "rubric")}
    # summary collects every shard's tables and reports after the loop, and merges them
    # into one artifact per table, which curate, export and report read.
    assert "for-loop-2" in tasks["summary-op"]["dependentTasks"]
    arts = tasks["summary-op"]["inputs"]["artifacts"]
    names = ("events", "captions", "outcome", "dense", "rubric")
    assert set(arts) == {f"{t}_shards" for t in names}
    assert {a["taskOutputArtifact"]["producerTask"] for a in arts.values()} == {"for-loop-2"}
    # check_shards fails the run on the summary's verdict before anything is curated.
    check = tasks["check-shards-op"]
    assert check["dependentTasks"] == ["summary-op"]
    for key in ("failed_shards", "shards"):
        verdict = check["inputs"]["parameters"][key]["taskOutputParameter"]
        assert verdict == {"outputParameterKey": key, "producerTask": "summary-op"}
    assert {"summary-op", "check-shards-op"} <= set(tasks["curate-op"]["dependentTasks"])
    arts = tasks["curate-op"]["inputs"]["artifacts"]
    assert set(arts) == {"events", "captions", "outcome", "dense", "rubric"}
    assert {a["taskOutputArtifact"]["producerTask"] for a in arts.values()} == {"summary-op"}
    assert "curate-op" in tasks["export-op"]["dependentTasks"]
    assert {"curate-op", "export-op"} <= set(tasks["report-op"]["dependentTasks"])
    for dag in (root, tasks, shard):
        for t in dag.values():
            assert t.get("cachingOptions", {}) == {}  # caching off (no enableCache)
    # Every step retries twice, 30 s apart, as the DAG's tasks; not the two tasks that open
    # and close the parent run (a second open would leave a second parent).
    steps = {k: t for d in (tasks, shard) for k, t in d.items() if "componentRef" in t
             and not k.startswith("for-loop")}  # fmt: skip
    assert len(steps) == 13
    # check_shards only reads the summary's verdict: a retry could not change it.
    assert "retryPolicy" not in steps.pop("check-shards-op")
    for t in steps.values():
        assert (
            t["retryPolicy"]["maxRetryCount"] == 2 and t["retryPolicy"]["backoffDuration"] == "30s"
        )
    assert "retryPolicy" not in root["open-run-op"] and "retryPolicy" not in root["finalize-op"]


def test_the_exit_handler_closes_the_parent_run_failed_when_a_shard_failed(flora_home):
    """``finalize_op``'s function: a failed child run (one shard's segment) or a failed
    pipeline state closes the parent FAILED and names the task; otherwise FINISHED."""
    from mlflow import MlflowClient

    from flora.engine import finish_kfp_run, start_kfp_run
    from flora.tracking import mlflow_run

    ok = start_kfp_run("/data/toy", "job-ok", {"shards": 2})
    with mlflow_run("segment", {"flora.shard": "0-of-2"}, run_id=ok):
        pass
    assert finish_kfp_run("job-ok", "SUCCEEDED") == "FINISHED"
    bad = start_kfp_run("/data/toy", "job-bad", {"shards": 2})
    with mlflow_run("segment", {"flora.shard": "0-of-2"}, run_id=bad):
        pass
    with pytest.raises(OSError), mlflow_run("segment", {"flora.shard": "1-of-2"}, run_id=bad):
        raise OSError("video unreadable")
    assert finish_kfp_run("job-bad", "FAILED", "Task exit-handler-1 failed.") == "FAILED"
    client = MlflowClient()
    run = client.get_run(bad)
    assert run.info.status == "FAILED"
    assert run.data.tags["flora.failed_tasks"] == "pipeline,segment[1-of-2]"
    assert run.data.tags["flora.error"] == "Task exit-handler-1 failed."
    assert client.get_run(ok).info.status == "FINISHED"
    with pytest.raises(LookupError, match="no MLflow run tagged kfp.job_id='job-x'"):
        finish_kfp_run("job-x", "FAILED")
    # A task that failed and then succeeded on KFP's retry: its last attempt counts.
    retried = start_kfp_run("/data/toy", "job-retried", {"shards": 1})
    with pytest.raises(OSError), mlflow_run("segment", {"flora.shard": "0-of-1"}, run_id=retried):
        raise OSError("node lost")
    time.sleep(0.01)  # attempts are ordered by start time
    with mlflow_run("segment", {"flora.shard": "0-of-1"}, run_id=retried):
        pass
    assert finish_kfp_run("job-retried", "SUCCEEDED") == "FINISHED"


def test_a_shard_with_bad_input_is_reported_while_the_others_complete(
    flora_home, tiny_dataset, tiny_vlm_dir, tmp_path, monkeypatch
):
    """The shard components' own functions, in order, as the loop runs them: shard 1's
    segment hits bad input, so its later steps do not run; shard 0 completes; the summary
    merges shard 0 only and reports shard 1; ``check_shards_op`` then fails the run before
    curation. An error a retry may fix still fails the task (KFP's retries apply)."""
    import shutil

    import pandas as pd
    from kfp.dsl import Artifact, Dataset, Metrics
    from mlflow import MlflowClient

    import flora.engine
    from components.data_engine import (
        caption_op,
        check_shards_op,
        reward_op,
        segment_op,
        summary_op,
    )
    from flora.engine import REWARD_MODES, SHARD_FAILED, start_kfp_run
    from flora.tracking import child_runs

    shutil.copytree(tiny_vlm_dir(), flora_home / "models" / "tiny")
    break_segment_on_episode(monkeypatch, 1)
    parent = start_kfp_run(tiny_dataset, "job-shard", {"shards": 2})
    art = lambda kind, name: kind(name=name, uri=str(tmp_path / name))  # noqa: E731
    # No VLM episode: the test is about the hand-offs, not the tiny model's output.
    shards = [{"index": k, "count": 2, "episodes": e, "vlm_episodes": []}
              for k, e in ((0, [0, 2]), (1, [1]))]  # fmt: skip
    common = {"dataset_path": str(tiny_dataset), "mlflow_run_id": parent}
    outs: dict[str, list] = {key: [] for key in ("segment", "caption", *REWARD_MODES)}
    tables: dict[str, list] = {key: [] for key in outs}
    for sh in shards:
        k = sh["index"]
        ev = art(Dataset, f"events{k}")
        outs["segment"].append(segment_op.python_func(
            **common, shard=sh, events=ev, metrics=art(Metrics, f"m{k}")))  # fmt: skip
        cap = art(Dataset, f"captions{k}")
        outs["caption"].append(caption_op.python_func(
            **common, shard=sh, events=ev, captions=cap,
            metrics=art(Metrics, f"mc{k}")))  # fmt: skip
        tables["segment"].append(ev)
        tables["caption"].append(cap)
        for mode in REWARD_MODES:
            t = art(Dataset, f"{mode}{k}")
            outs[mode].append(reward_op.python_func(
                mode=mode, **common, shard=sh, captions=cap, table=t,
                metrics=art(Metrics, f"m{mode}{k}")))  # fmt: skip
            tables[mode].append(t)
    # Shard 1: segment failed on its bad input (recorded, no exception), the rest not run.
    seg1 = outs["segment"][1].report
    assert seg1["step"] == "segment" and seg1["ran"] is True
    assert "FloraDataError: video unreadable" in seg1[SHARD_FAILED]
    for key in ("caption", *REWARD_MODES):
        rep = outs[key][1].report
        assert rep[SHARD_FAILED] == seg1[SHARD_FAILED] and rep["ran"] is False, key
        assert tables[key][1].metadata[SHARD_FAILED] == seg1[SHARD_FAILED]
        assert SHARD_FAILED not in outs[key][0].report, key
    assert outs["segment"][0].rows > 0 and SHARD_FAILED not in tables["segment"][0].metadata

    summary = summary_op.python_func(
        **common, valid_episodes=[0, 1, 2],
        **{f"{key}_reports": [o.report for o in outs[key]] for key in outs},
        events_shards=tables["segment"], captions_shards=tables["caption"],
        **{f"{m}_shards": tables[m] for m in REWARD_MODES},
        events=art(Dataset, "events"), captions=art(Dataset, "captions"),
        **{m: art(Dataset, m) for m in REWARD_MODES}, summary=art(Artifact, "summary"),
    )  # fmt: skip
    assert summary.failed_shards == {"1-of-2": ["segment", "caption", *REWARD_MODES]}
    assert summary.shards == 2
    assert summary.tables["events"]["episodes_in"] == 2
    events = pd.concat(map(pd.read_parquet, (tmp_path / "events" / "events").glob("*.parquet")))
    assert set(events.episode_id) == {f"{tiny_dataset.name}/{i:06d}" for i in (0, 2)}
    run = MlflowClient().get_run(parent)
    assert run.data.tags["flora.failed_shards"] == "1-of-2"
    assert run.data.metrics["shards.failed"] == 1 and run.data.metrics["shards"] == 2
    status = {(c.data.tags["flora.step"], c.data.tags["flora.shard"]): c.info.status
              for c in child_runs(parent)}  # fmt: skip
    assert status[("segment", "1-of-2")] == "FAILED" and status[("segment", "0-of-2")] == "FINISHED"
    assert ("caption", "1-of-2") not in status and status[("caption", "0-of-2")] == "FINISHED"

    with pytest.raises(
        RuntimeError,
        match=r"1 of 2 shard\(s\) did not finish: shard 1-of-2: "
        r"segment, caption, outcome, dense, rubric \(the others completed\)",
    ):
        check_shards_op.python_func(failed_shards=summary.failed_shards, shards=summary.shards)
    check_shards_op.python_func(failed_shards={}, shards=2)  # all finished: passes

    # A fault a retry may fix is not bad input: the task fails and KFP retries it.
    def node_lost(*args, **kwargs):
        raise OSError("node lost")

    monkeypatch.setattr(flora.engine, "run_segment", node_lost)
    with pytest.raises(OSError, match="node lost"):
        segment_op.python_func(**common, shard=shards[0], events=art(Dataset, "e9"),
                               metrics=art(Metrics, "m9"))  # fmt: skip


def test_runs_locally_with_subprocess_runner(
    flora_home, tiny_dataset, tiny_vlm_dir, tmp_path, task_tmp
):
    import shutil

    import pandas as pd
    from kfp import local
    from mlflow.tracking import MlflowClient

    from components.data_engine_pipeline import data_engine_pipeline
    from flora.settings import get_settings

    shutil.copytree(tiny_vlm_dir(), flora_home / "models" / "tiny")
    kfp_root = tmp_path / "kfp_root"
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(kfp_root))
    data_engine_pipeline(
        dataset_path=str(tiny_dataset), vlm_max_episodes=1, max_attempts=1, max_new_tokens=8
    )
    # The tasks' temp dir holds only kfp's own launcher folders (`mktemp -d`, one
    # ephemeral_component.py each): no step left a scratch folder or file behind.
    left = [p.name for p in task_tmp.iterdir() if not p.name.startswith("tmp.")]
    assert not left, left
    assert any(task_tmp.glob("tmp.*/ephemeral_component.py"))  # TMPDIR reached the tasks
    # The per-table summary: summary_op's artifact (an exit-handler pipeline has no return).
    (summary_file,) = kfp_root.rglob("summary-op/summary")
    tables = json.loads(summary_file.read_text())
    assert set(tables) == {"events", "captions", "outcome", "dense_labels", "rubric"}

    # The validation report artifact and the manifest written by the first two components.
    reports = list(kfp_root.rglob("validate-op/report"))
    assert len(reports) == 1
    rep = json.loads(reports[0].read_text())
    assert rep["success"] is True and rep["dataset"] == tiny_dataset.name
    assert len(list(kfp_root.rglob("ingest-op/manifest"))) == 1

    # Two shards (the default) over 3 valid episodes: shard 0 takes 0 and 2, shard 1 takes 1;
    # each iteration writes its own artifact, and summary merges them into one per table.
    ids = [f"{tiny_dataset.name}/{i:06d}" for i in range(3)]
    shard_events = {
        d.parents[2].name: set(pd.concat(map(pd.read_parquet, d.glob("*.parquet"))).episode_id)
        for d in kfp_root.rglob("segment-op/events/events")
    }
    assert shard_events == {"for-loop-2-iteration-0": {ids[0], ids[2]},
                            "for-loop-2-iteration-1": {ids[1]}}  # fmt: skip
    (events_dir,) = kfp_root.rglob("summary-op/events/events")
    events = pd.concat(pd.read_parquet(p) for p in events_dir.glob("*.parquet"))
    assert set(events.episode_id) == set(ids) and set(events.model) == {"kinematic-baseline"}
    assert tables["events"]["rows"] == len(events) and tables["events"]["valid"] == "passed"
    assert tables["events"]["table_dir"] == str(events_dir)
    assert tables["events"]["episodes_in"] == 3
    assert 0.0 <= tables["events"]["metrics"]["segment.f1_at_0.5"] <= 1.0
    for table in ("captions", "outcome", "dense_labels", "rubric"):
        t = tables[table]
        # vlm_max_episodes=1 bounds the whole run: episode 0 only, in shard 0.
        assert t["episodes_in"] == 1, table
        d = Path(t["table_dir"])
        assert d.name == table and d.is_relative_to(kfp_root) and "summary-op" in d.parts
        parts = list(d.glob("*.parquet"))
        fails = [f for p in d.glob("_failures/*.json") for f in json.loads(p.read_text())]
        rows = pd.concat(pd.read_parquet(p) for p in parts) if parts else pd.DataFrame()
        assert t["rows"] == len(rows) and t["failures"] == len(fails), table
        assert set(rows.get("episode_id", [])) | {f["episode_id"] for f in fails} == {ids[0]}
        assert all(f["reason"] for f in fails)
    # The tiny model ignores the outcome grammar with 8 tokens and 1 attempt: a failure.
    assert tables["outcome"]["failures"] == 1 and tables["outcome"]["rows"] == 0
    assert "after 1 attempts" in tables["outcome"]["failure_examples"][0]

    # MLflow: one parent run for the pipeline run, one child run per task (per shard for
    # the engine steps), closed FINISHED by the exit handler.
    from flora.tracking import child_runs

    client = MlflowClient(tracking_uri=get_settings().tracking_uri)
    exp = client.get_experiment_by_name(get_settings().mlflow_experiment)
    parents = "tags.`flora.pipeline_parent` = '1'"
    (run,) = client.search_runs([exp.experiment_id], filter_string=parents)
    assert run.info.status == "FINISHED"
    assert run.data.tags["kfp.job_id"] and run.data.tags["flora.failed_tasks"] == ""
    assert run.data.tags["flora.failed_shards"] == "" and run.data.metrics["shards.failed"] == 0
    assert run.data.params["shards"] == "2" and run.data.params["vlm_max_episodes"] == "1"
    children = {(c.data.tags["flora.step"], c.data.tags.get("flora.shard")): c
                for c in child_runs(run.info.run_id)}  # fmt: skip
    engine = {(s, f"{k}-of-2") for s in ("segment", "caption", "outcome", "dense", "rubric")
              for k in (0, 1)}  # fmt: skip
    assert set(children) == engine | {(s, None) for s in ("ingest", "validate", "curate",
                                                          "export", "report")}  # fmt: skip
    assert {c.info.status for c in children.values()} == {"FINISHED"}
    assert children[("ingest", None)].data.metrics["ingest.episodes"] == 3
    assert children[("validate", None)].data.metrics["validation.raw.success"] == 1.0
    assert children[("segment", "1-of-2")].data.metrics["step.segment.episodes_in"] == 1
    m = run.data.metrics  # the run's totals, over both shards
    assert m["shards"] == 2 and m["step.segment.rows"] == len(events)
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
    curate = client.get_run(children[("curate", None)].info.run_id)
    assert curate.data.tags["validation.mixture"] == "passed"
    assert [d.dataset.name for d in curate.inputs.dataset_inputs] == [
        f"{tiny_dataset.name}-mixture"
    ]
    (info,) = kfp_root.rglob("export-op/export/meta/info.json")
    assert json.loads(info.read_text())["features"]["language_persistent"]["dtype"] == "language"
    assert list(kfp_root.rglob("export-op/export/flora_annotations/manifest.json"))
    (index,) = kfp_root.rglob("report-op/report/index.html")
    assert "Curated mixture" in index.read_text()
    report_run = children[("report", None)].info.run_id
    assert "report/index.html" in {a.path for a in client.list_artifacts(report_run, "report")}
    assert os.environ["FLORA_HOME"] == str(flora_home)
