"""``flora serve --model`` that names no loadable model: a usage error (exit 2) before the
token banner, not a banner followed by an "internal error" (exit 1)."""

from __future__ import annotations

import pytest


@pytest.fixture
def serve(isolated_home, monkeypatch, capsys):
    """``serve(*args) -> (code, stderr)``: ``flora serve`` in-process through ``run_app``."""
    from flora.cli import app
    from flora.cli_common import run_app

    monkeypatch.delenv("FLORA_DEBUG", raising=False)
    monkeypatch.delenv("FLORA_MODEL_PATH", raising=False)

    def run(*args: str) -> tuple[int, str]:
        capsys.readouterr()
        code = run_app(app, ["serve", "--port", "0", *map(str, args)])
        return code, capsys.readouterr().err

    return run


def _no_banner(err: str) -> bool:
    return "!!!!" not in err and "NO bearer token" not in err


def test_missing_model_path_is_a_usage_error(serve, tmp_path):
    code, err = serve("--model", tmp_path / "no-such-checkpoint")
    assert code == 2, err
    assert "--model" in err and "does not exist" in err and _no_banner(err)


def test_directory_without_a_checkpoint_is_a_usage_error(serve, tmp_path):
    (tmp_path / "empty").mkdir()
    code, err = serve("--model", tmp_path / "empty")
    assert code == 2, err
    assert "config.json" in err and _no_banner(err)


def test_unresolvable_hub_id_is_a_usage_error(serve, monkeypatch):
    import flora.backends.transformers_backend as tb
    from flora.backends.base import BackendError

    def offline(model_path):  # what an unknown id gives, offline or not
        raise BackendError(f"cannot resolve model {model_path!r} locally or from the hub")

    monkeypatch.setattr(tb, "resolve_local", offline)
    code, err = serve("--model", "no-such-org/no-such-model")
    assert code == 2, err
    assert "cannot resolve model 'no-such-org/no-such-model'" in err
    assert "internal error" not in err
