"""``flora eval model`` argument checks (the scoring itself: test_eval_model / the KFP test)."""

from __future__ import annotations

from typer.testing import CliRunner

from flora.cli import app


def test_eval_model_is_registered_and_checks_its_arguments(tmp_path):
    r = CliRunner().invoke(app, ["eval", "model", "--help"])
    assert r.exit_code == 0 and "--version" in r.output and "--path" in r.output
    r = CliRunner().invoke(app, ["eval", "model", "--model", "policy", "--path", str(tmp_path)])
    assert r.exit_code != 0 and "segmenter" in r.output
    r = CliRunner().invoke(app, ["eval", "model", "--model", "segmenter"])
    assert r.exit_code != 0 and "exactly one of --version and --path" in r.output
    r = CliRunner().invoke(
        app, ["eval", "model", "--model", "segmenter", "--path", str(tmp_path), "--no-mlflow"]
    )
    assert r.exit_code != 0 and "--set or --dataset" in r.output
    r = CliRunner().invoke(
        app, ["eval", "model", "--model", "segmenter", "--path", str(tmp_path), "--attempts", "0"]
    )
    assert r.exit_code != 0 and "--attempts" in r.output
