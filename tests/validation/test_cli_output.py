"""``flora validate`` / ``validate-table`` output off a terminal, ``--json -``, GX
Checkpoints and Data Docs (issue 9 item 4)."""

from __future__ import annotations

import json
import re

import pandas as pd
import typer
from typer.testing import CliRunner

from flora.validation.cli import problem_line

# <severity> <dataset>/<episode> <field> <check>: <reason> [<file>]
LINE = re.compile(r"^(error|warning) (\S+)/(\S+) (\S+) ([^:]+): (.+) \[(.+)\]$")


def _cli() -> typer.Typer:
    from flora.validation.cli import register

    app, eval_app = typer.Typer(), typer.Typer()
    app.add_typer(eval_app, name="eval")
    register(app, eval_app)
    return app


def test_problem_line_shape():
    line = problem_line(
        "toy", 3, "action", "action is finite", "raw_frames:\n 1 row", "/d/f.parquet"
    )
    assert line == "error toy/3 action action is finite: raw_frames: 1 row [/d/f.parquet]"
    assert problem_line("toy", None, None, "load", "bad", None) == "error toy/- - load: bad [-]"
    # Table rows carry episode ids that already name the dataset.
    assert problem_line("toy", "toy/000003", "end_us", "c", "r", "x").startswith(
        "error toy/000003 "
    )


def test_piped_validate_prints_one_unwrapped_line_per_problem(damaged_copy, tmp_path):
    root, _ = damaged_copy("nan_action", 1)
    long_root = tmp_path / ("a_rather_long_folder_name_" * 4) / root.name
    long_root.parent.mkdir(parents=True)
    root.rename(long_root)
    res = CliRunner().invoke(
        _cli(), ["validate", str(long_root), "-q", "--no-docs"], env={"COLUMNS": "40"}
    )
    assert res.exit_code == 3, res.output
    out = res.stdout.splitlines()
    problems = [ln for ln in out if not ln.startswith("summary: ")]
    (line,) = problems  # one problem, one line, however narrow the "terminal"
    m = LINE.match(line)
    assert m, line
    sev, ds, ep, field, check, reason, file = m.groups()
    assert (sev, ds, ep, field, check) == ("error", root.name, "1", "action", "action is finite")
    assert "frame 5" in reason
    assert file == str(long_root / "data" / "chunk-000" / "file-000.parquet")
    assert out[-1] == f"summary: {root.name} FAILED 2/3 episodes valid, 1 problem(s)"
    assert "┃" not in res.stdout and "│" not in res.stdout  # no rich table off a terminal

    table = CliRunner().invoke(_cli(), ["validate", str(long_root), "-q", "--no-docs", "--table"])
    assert table.exit_code == 3 and "│" in table.stdout  # a terminal may keep the table


def test_json_dash_keeps_stdout_machine_readable(damaged_copy):
    root, _ = damaged_copy("nan_action", 1)
    res = CliRunner().invoke(_cli(), ["validate", str(root), "-q", "--json", "-"])
    assert res.exit_code == 3, res.output
    saved = json.loads(res.stdout)
    assert saved["exit_code"] == 3 and saved["invalid_episodes"] == [1]
    assert saved["data_docs"] is None  # no report folder, no --docs
    assert any(ln.startswith(f"error {root.name}/1 action ") for ln in res.stderr.splitlines())


def test_checkpoint_runs_and_data_docs_beside_the_report(tiny_dataset, tmp_path):
    from flora.validation.core import _GX

    out = tmp_path / "reports" / "tiny.json"
    res = CliRunner().invoke(_cli(), ["validate", str(tiny_dataset), "-q", "--json", str(out)])
    assert res.exit_code == 0, res.output
    saved = json.loads(out.read_text())
    docs = tmp_path / "reports" / "tiny_data_docs"
    assert saved["data_docs"] == str(docs / "index.html")
    pages = sorted(docs.glob("validations/**/*.html"))
    # One validation page per suite, each the result of that suite's Checkpoint run.
    assert {p.relative_to(docs / "validations").parts[0] for p in pages} == {
        "raw_frames_suite",
        "raw_episodes_suite",
        "raw_cameras_suite",
    }
    ctx = _GX.get().context
    for table, rep in saved["tables"].items():
        cp = ctx.checkpoints.get(f"{table}_checkpoint")
        assert [vd.name for vd in cp.validation_definitions] == [f"{table}_validation"]
        assert rep["gx_result_id"].startswith(f"{table}_suite/")
    assert "raw_cameras_suite" in (docs / "index.html").read_text()


def test_validate_table_lines_and_exit_status(tmp_path):
    """A table whose failures are confined to one episode: one line, exit 3 (--strict 1)."""
    rows = []
    for e in range(2):
        for k in range(2):
            rows.append({"episode_id": f"toy/{e:06d}", "dataset": "toy", "model": "m",
                         "model_version": "1", "run_id": "r", "event_index": k,
                         "start_us": k * 1000, "end_us": k * 1000 + 500, "duration_us": 5000,
                         "caption": f"c{k}", "source": "s", "n_windows": 1})  # fmt: skip
    df = pd.DataFrame(rows)
    df.loc[3, "end_us"] = 6000  # past the episode end: eq. (1)
    path = tmp_path / "events.parquet"
    df.to_parquet(path)
    res = CliRunner().invoke(_cli(), ["validate-table", "events", str(path), "--no-docs"])
    assert res.exit_code == 3, res.output
    (line,) = [ln for ln in res.stdout.splitlines() if ln.startswith("error ")]
    assert line.startswith("error toy/000001 duration_us,end_us ")
    assert "1 of 4 rows fail" in line and line.endswith(f"[{path}]")
    strict = CliRunner().invoke(_cli(), ["validate-table", "events", str(path), "--strict"])
    assert strict.exit_code == 1
    unknown = CliRunner().invoke(_cli(), ["validate-table", "nope", str(path)])
    assert unknown.exit_code == 2


def test_validate_a_hub_dataset_from_the_cache(tiny_dataset, tmp_path, monkeypatch):
    """A Hub id resolves into the HF cache, whose files are symlinks to blobs outside the
    snapshot: the metadata path checks are lexical, so the cache layout validates."""
    from tests.data.test_lerobot_input import SHA, _hf_cache

    cache = tmp_path / "hf_cache"
    snap = _hf_cache(cache, tiny_dataset, "lerobot/toy_tiny", {"main": SHA})
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    res = CliRunner().invoke(
        _cli(), ["validate", "lerobot/toy_tiny", "--revision", "main", "-q", "--json", "-"]
    )
    assert res.exit_code == 0, res.output
    saved = json.loads(res.stdout)
    assert saved["dataset"] == "toy_tiny" and saved["path"] == str(snap)
    assert saved["valid_episodes"] == [0, 1, 2]
    missing = CliRunner().invoke(_cli(), ["validate", "./no/such folder!"])
    assert missing.exit_code == 2
