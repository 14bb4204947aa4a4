"""``flora policy train`` on a tiny generated toy-world LeRobot dataset."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from flora.data.episode import FloraDataError
from flora.policy.lerobot import (
    PolicyTrainConfig,
    build_data,
    load_captions,
    load_policy,
    step_texts,
    train_policy,
)

os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MPLBACKEND", "Agg")


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    from flora.data.synth import generate

    root = tmp_path_factory.mktemp("toy") / "toy_world"
    return generate(
        root, 4, 0, durations_s=[4.0, 5.0, 4.0, 6.0], image_size=32, wrist_size=32, progress=False
    )


def _cfg(toy, out, **kw):
    base = dict(
        dataset=toy,
        out=out,
        horizon=8,
        epochs=2,
        rtc_epochs=1,
        max_delay=3,
        hidden=16,
        depth=1,
        heads=2,
        lang_vocab=128,
        batch_size=64,
        lr=1e-3,
        val_fraction=0.25,
        checkpoint_every=1,
        mlflow=False,
        progress=False,
    )
    base.update(kw)
    return PolicyTrainConfig(**base)


def test_captions_condition_the_steps(toy):
    from flora.data import open_dataset

    caps = load_captions(toy / "ground_truth" / "events.parquet")
    ep = open_dataset(toy).episode(0)
    texts, n = step_texts(ep, caps)
    assert len(texts) == len(ep.timestamps_us) and n > 0
    gt = caps[caps.key == "0"].iloc[0]
    k = int(np.searchsorted(ep.timestamps_us, gt.start_us))
    assert texts[k] == gt.caption
    assert texts[0] == ep.task  # before the first event: the task text
    # An engine events table (episode_id keyed, TableStore directory) works as well.
    texts2, n2 = step_texts(ep, caps.assign(key=ep.episode_id))
    assert n2 > 0


def test_load_captions_rejects_bad_tables(tmp_path):
    p = tmp_path / "events.parquet"
    pd.DataFrame({"episode_id": ["a/000000"], "start_us": [0], "end_us": [10]}).to_parquet(p)
    with pytest.raises(FloraDataError, match="caption"):
        load_captions(p)
    pd.DataFrame(
        {"episode_id": ["a"], "start_us": [5], "end_us": [5], "caption": ["x"]}
    ).to_parquet(p)
    with pytest.raises(FloraDataError, match="start"):
        load_captions(p)
    with pytest.raises(FloraDataError, match="not found"):
        load_captions(tmp_path / "missing.parquet")
    d = tmp_path / "events"
    d.mkdir()
    pd.DataFrame(
        {"episode_id": ["a/000001"], "start_us": [0], "end_us": [10], "caption": ["grasp"]}
    ).to_parquet(d / "a__000001.parquet")
    (d / "_failures").mkdir()
    assert load_captions(d).key.tolist() == ["a/000001"]


def test_build_data_chunks_and_failures(toy, tmp_path):
    cfg = _cfg(toy, tmp_path / "o", episodes=[0, 1, 2, 3, 99])
    data = build_data(cfg)
    assert [f.episode for f in data.failures] == [99]
    assert "out of range" in data.failures[0].reason
    assert data.val is not None and len(data.episodes) == 4
    n = len(data.train) + len(data.val)
    assert n == sum(int(d * 20) for d in (4.0, 5.0, 4.0, 6.0))
    assert data.train.chunks.shape[1:] == (8, 4)
    # Standardised with the training split's statistics.
    c0 = data.train.chunks[:, 0]
    assert torch.allclose(c0.mean(0), torch.zeros(4), atol=1e-4)


def test_image_features(toy, tmp_path):
    data = build_data(
        _cfg(toy, tmp_path / "o", episodes=[0], image_features=True, val_fraction=0.0)
    )
    img = data.train.obs["image"]
    assert img.shape == (80, 3 * 8 * 8)
    assert float(img.abs().max()) <= 0.5 and float(img.std()) > 0.01


def test_train_policy_with_mlflow_and_checkpoints(toy, tmp_path, monkeypatch):
    from flora.settings import get_settings

    monkeypatch.setenv("FLORA_HOME", str(tmp_path / "home"))
    get_settings.cache_clear()
    try:
        cfg = _cfg(
            toy, tmp_path / "out", events=toy / "ground_truth" / "events.parquet", mlflow=True
        )
        summary = train_policy(cfg)
        import mlflow

        run = mlflow.get_run(summary["run_id"])
        assert run.info.status == "FINISHED"
        assert "policy.loss" in run.data.metrics and "policy.val_loss" in run.data.metrics
        assert run.data.params["policy.rtc_epochs"] == "1"
        arts = [a.path for a in mlflow.MlflowClient().list_artifacts(run.info.run_id, "policy")]
        assert arts == ["policy/policy.pt"]
    finally:
        get_settings.cache_clear()
    assert summary["caption_steps"] > 0 and summary["episodes"] == 4
    assert (cfg.out / "checkpoint-epoch001.pt").exists()
    assert (cfg.out / "checkpoint-epoch002.pt").exists()
    assert json.loads((cfg.out / "summary.json").read_text())["checkpoint"].endswith("policy.pt")
    pol = load_policy(cfg.out / "policy.pt")
    assert pol.model.config.horizon == 8 and pol.extra["delays"]
    state = np.zeros(4, dtype=np.float32)
    prefix = np.random.default_rng(0).normal(size=(6, 4)).astype(np.float32)
    out = pol.chunk(state, "grasp the red ball", prefix=prefix, d=2, s=2, steps=3)
    assert out.shape == (8, 4)
    np.testing.assert_allclose(out[:2], prefix[:2], rtol=1e-5, atol=1e-5)  # committed
    plain = pol.chunk(state, "grasp the red ball", steps=3)
    assert plain.shape == (8, 4) and np.isfinite(plain).all()


def test_train_cli(toy, tmp_path):
    from flora.cli import app

    out = tmp_path / "cli"
    res = CliRunner().invoke(
        app,
        [
            "policy",
            "train",
            "--dataset",
            str(toy),
            "--out",
            str(out),
            "--epochs",
            "1",
            "--hidden",
            "16",
            "--depth",
            "1",
            "--horizon",
            "8",
            "--max-delay",
            "3",
            "--batch-size",
            "64",
            "--no-mlflow",
        ],
    )
    assert res.exit_code == 0, res.output
    assert (out / "policy.pt").exists()
    assert json.loads((out / "summary.json").read_text())["episodes"] == 4


def test_config_validation(toy, tmp_path):
    with pytest.raises(ValueError):
        _cfg(toy, tmp_path, max_delay=8)
    with pytest.raises(ValueError):
        _cfg(toy, tmp_path, delay_dist="gamma")
    with pytest.raises(ValueError):
        _cfg(toy, tmp_path, rtc_epochs=5)


def test_find_caption_table_prefers_tables_with_captions(tmp_path):
    from flora.policy.lerobot import find_caption_table

    out = tmp_path / "outputs"
    assert find_caption_table(out) is None
    (out / "captions").mkdir(parents=True)
    (out / "events").mkdir()
    # The segmenter's events table has empty captions; the captioner's table has none yet.
    pd.DataFrame(
        {"episode_id": ["d/000000"], "start_us": [0], "end_us": [10], "caption": [""]}
    ).to_parquet(out / "events" / "d__000000.parquet")
    pd.DataFrame(
        {
            "episode_id": pd.Series([], dtype=str),
            "start_us": pd.Series([], dtype="int64"),
            "end_us": pd.Series([], dtype="int64"),
            "caption": pd.Series([], dtype=str),
        }
    ).to_parquet(out / "captions" / "d__000000.parquet")
    assert find_caption_table(out) is None
    assert len(load_captions(out / "events")) == 0  # empty captions are dropped
    pd.DataFrame(
        {"episode_id": ["d/000000"], "start_us": [0], "end_us": [10], "caption": ["grasp the cup"]}
    ).to_parquet(out / "captions" / "d__000001.parquet")
    assert find_caption_table(out) == out / "captions"


def test_build_data_holds_out_at_least_one_episode_of_few(toy, tmp_path):
    # The pipelines' default val_fraction (0.1) on a 3-episode toy run still holds one out.
    data = build_data(_cfg(toy, tmp_path / "o", episodes=[0, 1, 2], val_fraction=0.1))
    assert len(data.val_episodes) == 1 and data.val is not None
    assert set(data.val_episodes) < set(data.episodes)
    assert build_data(_cfg(toy, tmp_path / "o", val_fraction=0.0)).val_episodes == []
    assert build_data(_cfg(toy, tmp_path / "o", episodes=[2], val_fraction=0.5)).val is None


def test_evaluate_step_scores_only_held_out_episodes(toy, tmp_path, monkeypatch):
    """Regression: the promotion gate's postfix_mse came from the training episodes too
    (evaluate_policy rebuilt the data from every episode)."""
    import mlflow

    import flora.policy.lerobot as lerobot
    from flora.policy.steps import evaluate_step
    from flora.settings import get_settings

    seen: list[list[int]] = []
    real = lerobot.build_data

    def spy(cfg, captions=None):
        data = real(cfg, captions)
        seen.append(list(data.episodes))
        return data

    monkeypatch.setattr(lerobot, "build_data", spy)
    monkeypatch.setenv("FLORA_HOME", str(tmp_path / "home"))
    get_settings.cache_clear()
    try:
        summary = train_policy(_cfg(toy, tmp_path / "out", epochs=1, mlflow=True))
        pol = load_policy(summary["checkpoint"])
        held, trained = pol.extra["val_episodes"], pol.extra["train_episodes"]
        assert held and trained and not set(held) & set(trained)
        # The recorded training episodes are the ones the training chunks came from.
        steps = {0: 80, 1: 100, 2: 80, 3: 120}
        assert summary["train_chunks"] == sum(steps[i] for i in trained)
        ev = evaluate_step(summary["checkpoint"], toy, tmp_path / "eval.json", summary["run_id"],
                           max_delay=3)  # fmt: skip
        run = mlflow.get_run(summary["run_id"])
    finally:
        get_settings.cache_clear()
    evaluated = seen[-1]  # the episodes the evaluation actually loaded
    assert sorted(evaluated) == sorted(held) and not set(evaluated) & set(trained)
    report = json.loads((tmp_path / "eval.json").read_text())
    assert report["episodes"] == ev["episodes"] == evaluated
    assert report["episode_source"] == "held_out"
    assert run.data.metrics["policy.eval.episodes"] == len(held)
    assert run.data.tags["policy.eval.episode_ids"] == ",".join(map(str, evaluated))
    assert run.data.tags["policy.eval.episode_source"] == "held_out"


def test_evaluate_policy_refuses_without_held_out_episodes(toy, tmp_path):
    from flora.policy.lerobot import evaluate_policy

    summary = train_policy(_cfg(toy, tmp_path / "out", epochs=1, val_fraction=0.0))
    ckpt = summary["checkpoint"]
    assert load_policy(ckpt).extra["val_episodes"] == []
    with pytest.raises(FloraDataError, match="no held-out episodes"):
        evaluate_policy(ckpt, toy, delays=(0, 1), latency_repeats=1)
    # A checkpoint from before held-out episodes were recorded is refused as well.
    blob = torch.load(ckpt, map_location="cpu", weights_only=False)
    for k in ("val_episodes", "train_episodes", "dataset_name"):
        del blob["extra"][k]
    old = tmp_path / "old.pt"
    torch.save(blob, old)
    with pytest.raises(FloraDataError, match="older checkpoint"):
        evaluate_policy(old, toy, delays=(0, 1), latency_repeats=1)
    # Explicit episodes are the caller's choice and are evaluated as given.
    rep = evaluate_policy(old, toy, episodes=[1], delays=(0, 1), latency_repeats=1)
    assert rep["episodes"] == [1] and rep["episode_source"] == "explicit"
    assert rep["chunks"] == 100


def test_inference_time_overlap_is_a_plan_never_the_scored_truth(toy, tmp_path, monkeypatch):
    """Offline, inference-time RTC is guided by the d executed actions (ground truth) and,
    beyond them up to H - s, by the model's own plain chunk: the truth its postfix is
    scored against never enters its guidance (it did, which flattered the method)."""
    import flora.policy.lerobot as lerobot

    summary = train_policy(_cfg(toy, tmp_path / "out", epochs=1))
    calls: list[tuple[str, int, torch.Tensor, torch.Tensor]] = []
    real = lerobot.rtc.sample

    def spy(model, obs, prefix, d, steps, method, **kw):
        out = real(model, obs, prefix, d, steps, method, **kw)
        calls.append((method, d, prefix.clone(), out))
        return out

    monkeypatch.setattr(lerobot.rtc, "sample", spy)
    lerobot.evaluate_policy(summary["checkpoint"], toy, delays=(1, 2), latency_repeats=1)
    checked = 0
    for d in (1, 2):
        got = {m: (p, o) for m, dd, p, o in calls if dd == d and p.shape[0] > 1}
        truth, _ = got["training_time"]  # the ground truth up to H - s
        guide, _ = got["inference_time"]
        plain = got["plain"][1]
        assert torch.equal(guide[:, :d], truth[:, :d])  # the executed actions
        assert torch.equal(guide[:, d:], plain[:, d : guide.shape[1]])  # a plan
        assert not torch.equal(guide[:, d:], truth[:, d:])
        checked += 1
    assert checked == 2


def test_policy_versions_scored_on_other_episodes_do_not_compare(toy, tmp_path, monkeypatch):
    """Each registered policy carries the fingerprint of what its postfix_mse scored; a
    challenger held out on other episodes than the champion's is refused by the gate (the
    same-set comparison itself: tests/registry/test_promotion.py). The refusal's advice is
    the policy's own (it was `flora eval model --model policy`, which refuses policies) and,
    followed as written, makes the two versions comparable."""
    from flora.policy.registry import NAME, register_step
    from flora.policy.steps import evaluate_step
    from flora.settings import get_settings
    from flora.tracking import start_pipeline_run
    from model_registry.promotion import EVAL_SET_TAG, evaluate_gates, promote

    monkeypatch.setenv("FLORA_HOME", str(tmp_path / "home"))
    get_settings.cache_clear()
    try:
        versions = {}
        evals = {}
        for seed in (0, 1):  # seed 1 holds out another episode; neither sees episode 3
            out = tmp_path / f"out{seed}"
            summary = train_policy(_cfg(toy, out, epochs=1, seed=seed, episodes=[0, 1, 2]))
            parent = start_pipeline_run("policy-rtc")
            ev = evaluate_step(summary["checkpoint"], toy, out / "eval.json", parent, max_delay=2)
            evals[seed] = (summary["checkpoint"], out / "eval.json", parent, ev["episodes"])
        for k, seed in enumerate((0, 1)):
            ckpt, report, parent, episodes = evals[seed]
            reg = register_step(ckpt, report, dataset=str(toy), recipe={"seed": seed},
                                pipeline_run_id=parent)  # fmt: skip
            versions[k] = (reg["version"], episodes)
        from mlflow import MlflowClient

        tags = {k: MlflowClient().get_model_version(NAME, v).tags for k, (v, _) in versions.items()}
        assert versions[0][1] != versions[1][1]
        assert len(tags[0][EVAL_SET_TAG]) == 64 and tags[0][EVAL_SET_TAG] != tags[1][EVAL_SET_TAG]
        # Requirements are pinned from the environment, not inferred in a subprocess.
        import mlflow

        deps = Path(mlflow.pyfunc.get_model_dependencies(f"models:/{NAME}/{versions[0][0]}"))
        pinned = deps.read_text().split()
        assert f"torch=={torch.__version__}" in pinned and any(
            r.startswith("cloudpickle==") for r in pinned
        )
        promote("policy", versions[0][0], force=True)
        other = evaluate_gates("policy", versions[1][0])
        assert not other.passed and any("not scored on the same held-out" in r
                                        for r in other.reasons)  # fmt: skip
        (advice,) = [r for r in other.reasons if "re-evaluate" in r]
        assert "flora eval model" not in advice
        import re

        code = re.search(r'`python -c "(.*?)"`', advice).group(1)
        assert "evaluate_versions" in code and str(toy) in code
        exec(code, {})  # what the refusal tells the user to run
        again = evaluate_gates("policy", versions[1][0])
        assert not any("eval set" in r for r in again.reasons), again.reasons
        tags = {k: MlflowClient().get_model_version(NAME, v).tags for k, (v, _) in versions.items()}
        assert tags[0][EVAL_SET_TAG] == tags[1][EVAL_SET_TAG]
        assert tags[0]["flora.eval_episode_ids"] == tags[1]["flora.eval_episode_ids"] == "3"
    finally:
        get_settings.cache_clear()


# ------------------------------------------------------------------ review 2026-12-07
def _variant(toy, dst, edit, drop_feature=None):
    """A copy of ``toy`` at ``dst`` whose data Parquet files went through ``edit``
    (a pandas frame -> frame), optionally without ``drop_feature`` in meta/info.json."""
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq

    shutil.copytree(toy, dst)
    for f in sorted((dst / "data").rglob("*.parquet")):
        df = edit(pq.read_table(f).to_pandas())
        schema = pq.read_schema(f)
        schema = pa.schema([fld for fld in schema if fld.name in df.columns])
        pq.write_table(pa.Table.from_pandas(df, schema=schema, preserve_index=False), f)
    if drop_feature:
        info = json.loads((dst / "meta" / "info.json").read_text())
        info["features"].pop(drop_feature, None)
        (dst / "meta" / "info.json").write_text(json.dumps(info))
    return dst


@pytest.mark.parametrize("column", ["observation.state", "action"])
def test_build_data_refuses_zero_width_state_or_action(toy, tmp_path, column):
    """A dataset without observation.state trained silently with state_dim 0; one without
    action ended in a bare DiTConfig ValueError. Both are a FloraDataError naming the
    dataset, the data file and the field."""
    bad = _variant(toy, tmp_path / "toy_world", lambda df: df.drop(columns=[column]), column)
    with pytest.raises(FloraDataError) as ei:
        build_data(_cfg(bad, tmp_path / "o"))
    e = ei.value
    assert e.field == column and e.dataset == "toy_world"
    assert e.file is not None and e.file.endswith(".parquet") and Path(e.file).is_file()
    assert f"no {column} values" in str(e)


def test_non_finite_state_names_the_state_and_the_file(toy, tmp_path):
    """A NaN in observation.state was reported as field=action, with no file."""

    def nan_state(df):
        row = df.index[df.episode_index == 1][3]
        v = np.array(df.at[row, "observation.state"], dtype=np.float32)
        v[0] = np.nan
        df.at[row, "observation.state"] = v
        return df

    bad = _variant(toy, tmp_path / "toy_world", nan_state)
    data = build_data(_cfg(bad, tmp_path / "o", val_fraction=0.0))
    (f,) = data.failures
    assert f.episode == 1
    assert "field=observation.state" in f.reason and "non-finite observation.state" in f.reason
    assert "file=" in f.reason and ".parquet" in f.reason


def test_gated_postfix_mse_is_in_the_datasets_units(toy, tmp_path):
    """The gated postfix_mse was in each checkpoint's own standardised units: the same
    network with its recorded action_std x3 (every action 3x farther from the mean, a worse
    policy) scored better and was promoted. Now both are scored in the dataset's
    standardised units, and the report records what the figure depends on."""
    from flora.data import open_dataset
    from flora.policy.lerobot import dataset_action_stats, evaluate_policy
    from flora.policy.registry import policy_metrics

    summary = train_policy(_cfg(toy, tmp_path / "a", epochs=1))
    ck_a = Path(summary["checkpoint"])
    blob = torch.load(ck_a, map_location="cpu", weights_only=False)
    blob["extra"]["stats"]["action_std"] = [3 * x for x in blob["extra"]["stats"]["action_std"]]
    ck_b = tmp_path / "b.pt"
    torch.save(blob, ck_b)
    kw = dict(delays=(0, 1, 2), latency_repeats=1, max_chunks=64)
    ra, rb = evaluate_policy(ck_a, toy, **kw), evaluate_policy(ck_b, toy, **kw)
    assert ra["episodes"] == rb["episodes"]
    assert policy_metrics(rb)["postfix_mse"] > 1.5 * policy_metrics(ra)["postfix_mse"]
    assert ra["metric_version"] == 3
    assert ra["horizon"] == 8 and ra["delays"] == [0, 1, 2] and ra["steps"] == 5
    assert len(ra["dataset_sha256"]) == 64 and ra["events_sha256"] is None
    assert ra["dataset_sha256"] == load_policy(ck_a).extra["dataset_sha256"]
    units = dataset_action_stats(open_dataset(toy))
    assert ra["metric_action_std"] == rb["metric_action_std"] == units["action_std"]


def test_metric_units_are_the_whole_datasets_actions(toy, tmp_path):
    """LeRobot's meta/stats.json where it has an action entry, else every episode's actions:
    never one held-out episode's own spread (a joint still there got std 0.001 and its
    small errors dominated the figure)."""
    import json
    import shutil

    from flora.data import open_dataset
    from flora.policy.lerobot import _check_signals, dataset_action_stats

    ds = open_dataset(toy)
    acts = np.concatenate([_check_signals(ds, ds.episode(i))[1] for i in ds.episode_indices()])
    copy = tmp_path / "toy_world"
    shutil.copytree(toy, copy)
    (copy / "meta" / "stats.json").unlink(missing_ok=True)
    computed = dataset_action_stats(open_dataset(copy))
    assert np.allclose(computed["action_mean"], acts.mean(0), atol=1e-6)
    assert np.allclose(computed["action_std"], np.maximum(acts.std(0), 1e-3), atol=1e-6)
    declared = {"action": {"mean": [0.5] * acts.shape[1], "std": [2.0] * acts.shape[1]}}
    (copy / "meta" / "stats.json").write_text(json.dumps(declared))
    assert dataset_action_stats(open_dataset(copy)) == {
        "action_mean": [0.5] * acts.shape[1], "action_std": [2.0] * acts.shape[1]}  # fmt: skip


def test_same_named_dataset_with_other_content_is_not_the_held_out_data(toy, tmp_path):
    """A dataset was identified by its folder name only: another dataset of the same name
    passed as the checkpoint's held-out data and got the same eval-set fingerprint."""
    from flora.policy.lerobot import evaluate_policy
    from flora.policy.registry import policy_eval_set
    from model_registry.promotion import EVAL_SET_TAG

    summary = train_policy(_cfg(toy, tmp_path / "out", epochs=1))
    ckpt = summary["checkpoint"]

    def scale(df):
        df["action"] = [np.asarray(a, dtype=np.float32) * 2 for a in df["action"]]
        return df

    other = _variant(toy, tmp_path / "elsewhere" / "toy_world", scale)
    assert other.name == toy.name
    with pytest.raises(FloraDataError, match="content sha256") as ei:
        evaluate_policy(ckpt, other, delays=(1,), latency_repeats=1)
    from flora.policy.lerobot import dataset_sha256

    assert dataset_sha256(other) != dataset_sha256(toy)
    msg = str(ei.value)
    assert dataset_sha256(toy)[:16] in msg and dataset_sha256(other)[:16] in msg
    # Evaluated on purpose (explicit episodes): the fingerprints tell the data apart.
    held = load_policy(ckpt).extra["val_episodes"]
    kw = dict(episodes=held, delays=(1,), latency_repeats=1, max_chunks=32)
    ra, rb = evaluate_policy(ckpt, toy, **kw), evaluate_policy(ckpt, other, **kw)
    assert ra["episodes"] == rb["episodes"]
    assert (
        policy_eval_set(ra, str(toy))[EVAL_SET_TAG] != policy_eval_set(rb, str(other))[EVAL_SET_TAG]
    )
    # A checkpoint from before the identity was recorded is still loaded and checked by name.
    blob = torch.load(ckpt, map_location="cpu", weights_only=False)
    del blob["extra"]["dataset_sha256"]
    old = tmp_path / "old.pt"
    torch.save(blob, old)
    assert evaluate_policy(old, other, delays=(1,), latency_repeats=1)["episodes"] == held


def test_dataset_identity_reads_the_signals_not_what_an_export_adds(toy, tmp_path):
    """An in-place export adds ``language_persistent`` to the data files and edits
    ``info.json``: a policy trained before it could no longer be evaluated on its own
    dataset. The identity reads only the signal columns; a changed action still changes it."""
    import json
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq

    from flora.policy.lerobot import dataset_sha256

    copy = tmp_path / "toy_world"
    shutil.copytree(toy, copy)
    before = dataset_sha256(copy)
    part = sorted((copy / "data").rglob("*.parquet"))[0]
    t = pq.read_table(part)
    lang = pa.array([[]] * t.num_rows, pa.list_(pa.string()))
    pq.write_table(t.append_column("language_persistent", lang), part)
    info = json.loads((copy / "meta" / "info.json").read_text())
    info["features"]["language_persistent"] = {"dtype": "language", "shape": [1]}
    (copy / "meta" / "info.json").write_text(json.dumps(info))
    assert dataset_sha256(copy) == before
    acts = t.column("action").to_pylist()
    acts[0] = [a + 1.0 for a in acts[0]]
    t = t.set_column(t.schema.get_field_index("action"), "action",
                     pa.array(acts, t.schema.field("action").type))  # fmt: skip
    pq.write_table(t, part)
    assert dataset_sha256(copy) != before
