"""Pieces of ``make demo`` that are cheap to check (the full demo is measured in docs)."""

from __future__ import annotations

from pathlib import Path

from flora.demo import DAG_ID, _dvc_md5, demo_env, generate_dataset
from flora.settings import FloraSettings

REPO = Path(__file__).resolve().parents[2]


def test_generate_is_skipped_only_when_an_identical_dataset_exists(tmp_path):
    root = tmp_path / "toy_world"
    assert generate_dataset(root, episodes=1, seed=3) is True
    assert generate_dataset(root, episodes=1, seed=3) is False  # same config: kept
    assert generate_dataset(root, episodes=1, seed=4) is True  # other seed: regenerated


def test_demo_environment_keeps_all_state_under_flora_home(tmp_path):
    env = demo_env(REPO, FloraSettings(home=Path(".flora")))
    home = Path(env["FLORA_HOME"])
    assert home == (REPO / ".flora").resolve()
    assert Path(env["AIRFLOW_HOME"]) == home / "airflow"
    assert Path(env["DVC_SITE_CACHE_DIR"]).is_relative_to(REPO)
    assert env["AIRFLOW__CORE__DAGS_FOLDER"] == str(REPO / "dags")
    assert (REPO / "dags" / f"{DAG_ID}.py").exists()


def test_committed_pointer_is_readable():
    md5 = _dvc_md5(REPO / "datasets.dvc")
    assert md5 is not None and md5.endswith(".dir") and len(md5) == 36


def test_train_conf_uses_the_demo_recipes_and_project_gates(tmp_path):
    from flora.demo import DEMO_MODELS, train_conf
    from training.pipeline import recipe_for

    conf = train_conf(tmp_path / "toy")
    assert conf["recipe"] == "demo" and conf["gates"] == "project"
    assert conf["models"] == list(DEMO_MODELS)
    for m in DEMO_MODELS:  # every demo recipe exists and is the small size, cut short
        r = recipe_for(m, conf["recipe"])
        assert r.size == "small" and r.max_steps <= 100


def test_serve_stage_serves_the_champion_and_stops_it(tmp_path, monkeypatch, tiny_dataset):
    """A tiny captioner promoted through the pipeline is served as a pod is reached; the
    second pass's settings point the captioner at it and keep the segmenter kinematic."""
    import json
    import urllib.error
    import urllib.request

    import torch

    from flora.demo import pick_version, serve_models, served_env
    from flora.engine import segment_backend
    from flora.settings import get_settings
    from training.pipeline import run_model

    home = tmp_path / "home"
    monkeypatch.setenv("FLORA_HOME", str(home))
    monkeypatch.delenv("FLORA_MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("FLORA_DEVICE", "cpu")
    get_settings.cache_clear()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out = run_model("captioner", "tiny", tiny_dataset, tmp_path / "work", sft_steps=1,
                        grpo_steps=1, eval_episodes=1, n_boot=10, gates="mechanics")  # fmt: skip
    finally:
        torch.set_num_threads(threads)
    assert out["promote"]["promoted"]
    assert pick_version("captioner") == ("champion", "1")
    assert pick_version("segmenter") is None and pick_version("rewarder") is None

    env = demo_env(REPO, FloraSettings(home=home))
    log = tmp_path / "demo.log"
    with serve_models(("segmenter", "captioner", "rewarder"), env, log, "tok3n") as served:
        assert set(served) == {"captioner"}
        sv = served["captioner"]
        req = urllib.request.Request(sv.url + "/models", headers={"Authorization": "Bearer tok3n"})
        with urllib.request.urlopen(req, timeout=30) as r:
            assert r.status == 200 and "flora" in json.loads(r.read())["data"][0]["id"]
        try:
            urllib.request.urlopen(sv.url + "/models", timeout=30)
            raise AssertionError("served without the token")
        except urllib.error.HTTPError as e:
            assert e.code == 401
        env2 = served_env(env, served, "tok3n", get_settings().tracking_uri)
    assert sv.proc is not None and sv.proc.poll() is not None  # stopped on exit
    assert env2["FLORA_CAPTIONER_BASE_URL"] == sv.url and env2["FLORA_BACKEND"] == "openai"
    assert env2["FLORA_SEGMENTER_BACKEND"] == "kinematic"
    assert env2["FLORA_HOME"] != env["FLORA_HOME"]  # new tables, not resumed ones
    s2 = FloraSettings(**{k[6:].lower(): v for k, v in env2.items()
                          if k.startswith("FLORA_") and k not in ("FLORA_HOME",)})  # fmt: skip
    assert segment_backend(s2) is None  # kinematic
    assert s2.for_model("captioner").openai_base_url == sv.url
    get_settings.cache_clear()


def test_models_table_puts_each_metric_beside_the_untrained_model():
    from flora.demo import SUMMARY_METRICS, model_rows

    reports = {
        "rewarder": {
            "flat": {"eval.outcome.mae": 0.01, "eval.dense.accuracy": 0.9,
                     "eval.rubric.l1": 0.2, "eval.parse_rate": 1.0},
            "baseline": {"eval.parse_rate": 0.0},
        }
    }  # fmt: skip
    rows = model_rows(reports, {"rewarder": ("champion", 3)})
    rew = [r for r in rows if r[2] in SUMMARY_METRICS["rewarder"]]
    assert [r[2] for r in rew] == list(SUMMARY_METRICS["rewarder"])
    assert rew[0][:2] == ("rewarder", "v3 (champion)") and rew[0][5] == "1.000 / 0.000"
    assert rew[1][:2] == ("", "") and rew[1][3:5] == ("0.900", "–")  # untrained never parsed
    assert rew[2][3] == "–"  # a metric the report lacks is shown missing, not zero
    seg = next(r for r in rows if r[0] == "segmenter")
    assert seg[1] == "not served" and seg[3] == "–"
