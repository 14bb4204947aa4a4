"""``flora registry`` as users run it: list, show, promote (and refusal), rollback, deploy."""

from __future__ import annotations

import json

import yaml
from typer.testing import CliRunner

GOOD = {"r_cap": 0.50, "parse_rate": 0.99}


def _run(*args: str):
    from flora.cli import app

    return CliRunner().invoke(app, ["registry", *args])


def test_promote_refuse_rollback_and_deploy_through_the_cli(make_version, tmp_path):
    v1 = make_version("captioner", GOOD)
    r = _run("promote", "captioner", v1)
    assert r.exit_code == 0 and f"-> v{v1}" in r.output
    v2 = make_version("captioner", {**GOOD, "r_cap": 0.40})
    r = _run("promote", "captioner", v2)
    assert r.exit_code == 1 and "refused" in r.output and "r_cap=0.4" in r.output
    v3 = make_version("captioner", {**GOOD, "r_cap": 0.70})
    assert _run("promote", "captioner", v3).exit_code == 0

    r = _run("list", "captioner", "--json", "-")
    assert r.exit_code == 0
    rows = json.loads(r.stdout[r.stdout.index("{") :])["versions"]
    assert [x["aliases"] for x in rows] == [[], [], ["champion"]]

    r = _run("show", "captioner", "champion")
    assert r.exit_code == 0 and "eval r_cap = 0.7" in r.output and "promoted" in r.output

    out = tmp_path / "isvc.yaml"
    r = _run("deploy", "captioner", "--no-apply", "--out", str(out))
    assert r.exit_code == 0, r.output
    isvc = yaml.safe_load(out.read_text())
    assert isvc["metadata"]["annotations"]["flora.ai/model-version"] == v3
    from mlflow import MlflowClient

    uri = MlflowClient().get_model_version_download_uri("flora-captioner", v3)
    assert isvc["spec"]["predictor"]["model"]["storageUri"] == uri
    # vLLM is pointed at the version's own model folder, not the manifest's placeholder.
    assert "--model=/mnt/models/artifacts/model/model" in isvc["spec"]["predictor"]["model"]["args"]

    r = _run("rollback", "captioner")
    assert r.exit_code == 0 and f"v{v3} -> v{v1}" in r.output
    assert _run("deploy", "captioner", "--no-apply", "--out", str(out)).exit_code == 0
    rolled = yaml.safe_load(out.read_text())
    assert rolled["metadata"]["annotations"]["flora.ai/model-version"] == v1
    r = _run("rollback", "captioner")
    assert r.exit_code == 1 and "no previous champion" in r.output


def test_unknown_model_is_a_usage_error(make_version):
    r = _run("promote", "planner")
    assert r.exit_code == 2
