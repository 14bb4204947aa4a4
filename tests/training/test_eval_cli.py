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


def test_also_unseen_by_leaves_out_the_other_models_lineage(tmp_path, capsys):
    """``--also-unseen-by``: what re-evaluates champion and challenger on the same episodes
    (the promotion gates' advice) reaches the held-out selection — here the other model's
    lineage is lost, so the evaluation is refused before any model is loaded."""
    from flora.cli_common import run_app
    from tests.training.helpers import mini_examples, write_set
    from tests.training.test_lineage import _export

    s = write_set(tmp_path / "set", mini_examples(n_heldout=2))
    model = _export(tmp_path / "model", ["mini/000000"])
    other = _export(tmp_path / "other", ["mini/000001"], init_from=tmp_path / "gone")
    args = ["eval", "model", "--model", "captioner", "--path", str(model), "--set", str(s),
            "--no-mlflow", "--also-unseen-by", str(other)]  # fmt: skip
    assert run_app(app, args) != 0
    err = capsys.readouterr().err
    assert "continued from" in err and "not on disk" in err
