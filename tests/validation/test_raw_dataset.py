"""validate_dataset on the tiny toy dataset: clean, and with one damaged episode each way."""

from __future__ import annotations

import json

import typer
from typer.testing import CliRunner

from flora.validation.raw import RAW_TABLES, validate_dataset


def test_clean_tiny_dataset_passes(tiny_dataset):
    report = validate_dataset(tiny_dataset, progress=False)
    assert report.success, [i.describe() for i in report.issues]
    assert report.format == "lerobot_v3.0"
    assert report.episodes == report.valid_episodes == [0, 1, 2]
    assert set(report.tables) == set(RAW_TABLES)
    assert all(r.success for r in report.tables.values())
    # 6 s + 14 s + 26 s at 20 fps; two cameras per episode.
    assert report.tables["raw_frames"].row_count == 20 * (6 + 14 + 26)
    assert report.tables["raw_cameras"].row_count == 6
    json.dumps(report.to_dict())


def test_nan_action_reports_that_episode_and_validates_the_rest(damaged_copy):
    root, _ = damaged_copy("nan_action", 1)
    report = validate_dataset(root, progress=False)
    assert not report.success
    assert report.invalid_episodes == [1]
    assert report.valid_episodes == [0, 2]
    (issue,) = report.issues
    assert issue.dataset == root.name and issue.episode == 1
    assert issue.field == "action"
    assert issue.file.endswith("data/chunk-000/file-000.parquet")
    assert "frame 5" in issue.reason
    # The other episodes were loaded and checked by every suite.
    assert report.tables["raw_episodes"].row_count == 3
    assert report.tables["raw_episodes"].success and report.tables["raw_cameras"].success
    assert report.tables["raw_frames"].failing_episodes == [f"{root.name}/000001"]


def test_unloadable_episode_is_reported_with_reader_location(damaged_copy):
    root, _ = damaged_copy("backwards_timestamp", 0)
    report = validate_dataset(root, progress=False)
    assert report.invalid_episodes == [0] and report.valid_episodes == [1, 2]
    (issue,) = report.issues
    assert issue.check == "load" and issue.field == "timestamp"
    assert issue.file.endswith("data/chunk-000/file-000.parquet")
    assert "not strictly increasing" in issue.reason
    # Episodes 1 and 2 still went through the suites.
    assert report.tables["raw_episodes"].row_count == 2
    assert all(r.success for r in report.tables.values())


def test_undecodable_camera_is_reported_by_file_and_field(damaged_copy):
    root, video = damaged_copy("corrupt_video", 2)
    report = validate_dataset(root, progress=False)
    assert report.invalid_episodes == [2] and report.valid_episodes == [0, 1]
    assert report.issues, "corrupt video not detected"
    assert {i.episode for i in report.issues} == {2}
    assert {i.file for i in report.issues} == {video}
    assert {i.field for i in report.issues} == {"observation.images.wrist"}
    assert not report.tables["raw_cameras"].success
    assert report.tables["raw_frames"].success  # frames/state/action were fine


def test_unopenable_dataset_is_one_dataset_level_issue(tmp_path):
    root = tmp_path / "empty_ds"
    root.mkdir()
    report = validate_dataset(root, progress=False)
    assert not report.success and report.valid_episodes == []
    (issue,) = report.issues
    assert issue.episode is None and issue.check == "load"


def _cli() -> typer.Typer:
    from flora.validation.cli import register

    app, eval_app = typer.Typer(), typer.Typer()
    app.add_typer(eval_app, name="eval")
    register(app, eval_app)
    return app


def test_cli_exit_codes_and_report(tiny_dataset, damaged_copy, tmp_path):
    runner = CliRunner()
    ok = runner.invoke(_cli(), ["validate", str(tiny_dataset), "-q"])
    assert ok.exit_code == 0, ok.output
    assert "PASSED" in ok.output and "3/3 episodes valid" in ok.output

    root, _ = damaged_copy("nan_action", 1)
    out = tmp_path / "report.json"
    bad = runner.invoke(
        _cli(), ["validate", str(root), "-q", "--json", str(out)], env={"COLUMNS": "200"}
    )
    # Some episodes failed, others are valid: 3 (the documented rule), 1 with --strict.
    assert bad.exit_code == 3, bad.output
    assert "FAILED" in bad.output and "action is finite" in bad.output
    saved = json.loads(out.read_text())
    assert saved["invalid_episodes"] == [1] and saved["valid_episodes"] == [0, 2]
    assert saved["exit_code"] == 3
    strict = runner.invoke(_cli(), ["validate", str(root), "-q", "--strict", "--no-docs"])
    assert strict.exit_code == 1, strict.output
