"""``FLORA_*`` settings as the environment gives them: ``~`` in a path means the home
directory, and a value that does not parse is a usage error (exit 2) naming the
variable the user set (``FLORA_POD_SECRETS``), not the settings field."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    """No FLORA_* from the caller, no .env file (cwd is a scratch dir), fresh settings."""
    import os

    from flora.settings import get_settings

    for k in [k for k in os.environ if k.startswith("FLORA_")]:
        monkeypatch.delenv(k)
    monkeypatch.chdir(tmp_path)
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


def test_tilde_in_path_settings_is_the_home_directory(clean_env, monkeypatch, tmp_path):
    from flora.settings import FloraSettings

    home = tmp_path / "user"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("FLORA_HOME", "~/flora-home")
    monkeypatch.setenv("FLORA_DATASET", "~/data/toy")
    monkeypatch.setenv("FLORA_SHARED_MOUNT", "~/shared")
    monkeypatch.setenv("FLORA_SERVE_TOKEN_FILE", "~/token")
    s = FloraSettings()
    assert s.home == home / "flora-home"
    assert s.dataset == home / "data" / "toy"
    assert s.shared_mount == home / "shared"
    assert s.serve_token_file == home / "token"
    assert s.tracking_uri == f"sqlite:///{home / 'flora-home' / 'mlflow.db'}"
    assert not (Path.cwd() / "~").exists()
    assert FloraSettings(home=Path("~/x")).home == home / "x"  # in code too


@pytest.mark.parametrize(
    ("var", "value", "named"),
    [
        ("FLORA_POD_SECRETS", "flora-object-store,flora-hf", "FLORA_POD_SECRETS"),  # not JSON
        ("FLORA_GPU_NODE_SELECTOR", "gpu=true", "FLORA_GPU_NODE_SELECTOR"),
        ("FLORA_GPU_COUNT", "two", "FLORA_GPU_COUNT='two'"),
        ("FLORA_MODE", "prod", "FLORA_MODE='prod'"),
        # expanduser raised RuntimeError: an internal error, not a named bad value
        ("FLORA_HOME", "~nosuchuser_flora_zz/home", "FLORA_HOME="),
    ],
)
def test_bad_setting_is_a_usage_error_naming_the_variable(
    clean_env, monkeypatch, capsys, tiny_dataset, tmp_path, var, value, named
):
    from flora.cli import app
    from flora.cli_common import run_app

    monkeypatch.setenv("FLORA_HOME", str(tmp_path / "home"))
    monkeypatch.setenv(var, value)  # after FLORA_HOME: the FLORA_HOME case replaces it
    capsys.readouterr()
    code = run_app(app, ["segment", str(tiny_dataset), "--out", str(tmp_path / "seg")])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"flora segment: error: bad FLORA_* setting: {named}" in err
    assert "internal error" not in err and len(err.strip().splitlines()) == 1


def test_bad_setting_message_never_shows_a_credential(clean_env, monkeypatch):
    from pydantic import ValidationError

    from flora.cli_common import settings_error_message
    from flora.settings import FloraSettings

    monkeypatch.setenv("FLORA_SERVE_MAX_TOKENS", "s3cret-looking")
    with pytest.raises(ValidationError) as e:
        FloraSettings()
    msg = settings_error_message(e.value)
    assert msg is not None and "FLORA_SERVE_MAX_TOKENS" in msg and "s3cret" not in msg
    assert settings_error_message(ValueError("x")) is None
