"""Usage errors exit 2, data errors exit 1, each as one line on stderr without a traceback."""

from __future__ import annotations

import pytest
import typer

from flora.cli_common import EXIT_FAILED, EXIT_USAGE, run_app


def _one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err and "╭" not in err and "│" not in err, err
    return lines[0]


def test_missing_path_is_one_line_exit_2(flora, tmp_path):
    r = flora("segment", tmp_path / "no_such_dataset")
    assert r.code == EXIT_USAGE and r.out == ""
    line = _one_line(r.err)
    assert line.startswith("flora segment: error:") and "no_such_dataset" in line
    assert "does not exist" in line


def test_unknown_choice_exit_2_names_the_choices(flora, tiny_dataset):
    r = flora("segment", tiny_dataset, "--profile", "medium")
    assert r.code == EXIT_USAGE
    line = _one_line(r.err)
    assert "--profile" in line and "'standard'" in line and "'long_horizon'" in line


def test_bad_option_exit_2(flora, tiny_dataset):
    r = flora("reward", "outcome", tiny_dataset, "--no-such-option")
    assert r.code == EXIT_USAGE
    assert "No such option: --no-such-option" in _one_line(r.err)
    r = flora("segment", tiny_dataset, "--episodes", "1,two")
    assert r.code == EXIT_USAGE
    assert "--episodes" in _one_line(r.err)


def test_module_and_script_behave_the_same(flora, tmp_path):
    a = flora("caption", tmp_path / "nope", "--events", tmp_path)
    b = flora("caption", tmp_path / "nope", "--events", tmp_path, module=True)
    assert a.code == b.code == EXIT_USAGE
    assert _one_line(a.err) == _one_line(b.err)
    assert a.err.startswith("flora caption: error:")


def test_data_error_exit_1_names_the_file(flora, tmp_path):
    not_a_dataset = tmp_path / "empty"
    not_a_dataset.mkdir()
    r = flora("segment", not_a_dataset, "--out", tmp_path / "tables")
    assert r.code == EXIT_FAILED
    line = _one_line(r.err)
    assert line.startswith("flora segment: data error:")
    assert f"file={not_a_dataset}" in line


def test_bad_setting_exit_2(flora, tiny_dataset):
    r = flora("segment", tiny_dataset, env={"FLORA_BACKEND": "gpt-9"})
    assert r.code == EXIT_USAGE
    assert "FLORA_" in _one_line(r.err)


def _boom_app() -> typer.Typer:
    app = typer.Typer(add_completion=False)

    @app.command()
    def boom() -> None:
        raise RuntimeError("kaput\nsecond line")

    @app.command()
    def other() -> None:
        pass

    return app


def test_internal_error_one_line_traceback_only_in_debug(capsys, monkeypatch):
    monkeypatch.delenv("FLORA_DEBUG", raising=False)
    assert run_app(_boom_app(), ["boom"]) == EXIT_FAILED
    err = capsys.readouterr().err
    line = _one_line(err)
    assert line.startswith("flora boom: internal error: RuntimeError: kaput second line")
    assert "FLORA_DEBUG=1" in line
    assert run_app(_boom_app(), ["boom", "--debug"]) == EXIT_FAILED
    assert "Traceback" in capsys.readouterr().err
    monkeypatch.setenv("FLORA_DEBUG", "1")
    assert run_app(_boom_app(), ["boom"]) == EXIT_FAILED
    assert "Traceback" in capsys.readouterr().err


@pytest.mark.parametrize("exc_name", ["FloraDataError", "ContractError", "RubricError"])
def test_data_error_types_exit_1(capsys, monkeypatch, exc_name):
    import flora.contract
    import flora.data.episode
    import flora.reward.rubric

    exc = {
        "FloraDataError": lambda: flora.data.episode.FloraDataError(
            "bad fps", dataset="d", episode=3, file="meta/info.json", field="fps"
        ),
        "ContractError": lambda: flora.contract.ContractError("end before start"),
        "RubricError": lambda: flora.reward.rubric.RubricError("maxima sum to 0.9"),
    }[exc_name]
    app = typer.Typer(add_completion=False)

    @app.command()
    def step() -> None:
        raise exc()

    @app.command()
    def other() -> None:
        pass

    monkeypatch.delenv("FLORA_DEBUG", raising=False)
    assert run_app(app, ["step"]) == EXIT_FAILED
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("flora step: data error:")
    if exc_name == "FloraDataError":
        assert "episode=3" in line and "file=meta/info.json" in line and "field=fps" in line


def test_backend_misconfigured_is_a_usage_error(capsys, monkeypatch, tiny_dataset, tmp_path):
    from flora.cli import app
    from flora.settings import get_settings

    monkeypatch.setenv("FLORA_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("FLORA_OPENAI_BASE_URL", raising=False)
    get_settings.cache_clear()
    try:
        code = run_app(app, ["segment", str(tiny_dataset), "--backend", "openai"])
    finally:
        get_settings.cache_clear()
    assert code == EXIT_USAGE
    line = _one_line(capsys.readouterr().err)
    assert "FLORA_OPENAI_BASE_URL" in line and line.startswith("flora segment: error:")
    assert not (tmp_path / "home" / "outputs" / "events").exists()


def test_bare_group_prints_help_and_exits_2(capsys):
    from flora.cli import app

    assert run_app(app, ["reward"]) == EXIT_USAGE
    got = capsys.readouterr()
    assert got.out == "" and "Usage: flora reward" in got.err and "outcome" in got.err
    assert run_app(app, ["--help"]) == 0
    assert "Usage: flora" in capsys.readouterr().out
