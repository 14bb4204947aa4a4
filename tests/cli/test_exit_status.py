"""The exit-status rule of step commands (docs/cli.md) and ``--json -`` on stdout.

0: every item good; 3: some items failed, the others were written; 1: nothing usable
(every item failed, no rows) or ``--strict`` with any failure. An episode index outside
the dataset is a recorded item failure of the step (the rest completes), which makes
partial and total failure cheap to produce on the tiny toy world.
"""

from __future__ import annotations

import json

from flora.cli_common import EXIT_FAILED, EXIT_OK, EXIT_PARTIAL, step_exit_code


def test_rule_table():
    assert step_exit_code(rows=5, failed=0) == EXIT_OK
    assert step_exit_code(rows=5, failed=2) == EXIT_PARTIAL
    assert step_exit_code(rows=5, failed=2, strict=True) == EXIT_FAILED
    assert step_exit_code(rows=0, failed=2) == EXIT_FAILED
    assert step_exit_code(rows=0, failed=0) == EXIT_FAILED  # no rows: nothing usable
    assert step_exit_code(rows=5, failed=0, valid=False) == EXIT_FAILED


def test_segment_some_failed_json_on_stdout_only(flora, tiny_dataset, tmp_path):
    r = flora("segment", tiny_dataset, "--out", tmp_path / "t", "--episodes", "0,99",
              "--json", "-")  # fmt: skip
    assert r.code == EXIT_PARTIAL, r.err
    report = json.loads(r.out)  # stdout holds the report and nothing else
    assert report["exit_code"] == EXIT_PARTIAL and report["rows"] > 0
    assert [f["episode_id"] for f in report["failures"]] == [f"{tiny_dataset.name}/000099"]
    assert "out of range" in report["failures"][0]["reason"]
    assert "episodes segmented" in r.err and "exit 3" in r.err  # human text on stderr


def test_segment_strict_and_all_failed(run_flora, tiny_dataset, tmp_path):
    code, out, err = run_flora("segment", tiny_dataset, "--out", tmp_path / "a",
                               "--episodes", "0,99", "--strict")  # fmt: skip
    assert code == EXIT_FAILED, err
    assert "episodes segmented" in out  # without --json - the human text is on stdout
    code, _, err = run_flora("segment", tiny_dataset, "--out", tmp_path / "b", "--episodes", "0")
    assert code == EXIT_OK, err
    code, _, err = run_flora("segment", tiny_dataset, "--out", tmp_path / "c",
                             "--episodes", "98,99")  # fmt: skip
    assert code == EXIT_FAILED and "nothing usable" in err


def test_reward_outcome_exit_statuses(run_flora, tiny_dataset, tmp_path):
    """Every episode failed and no rows is 1, not 0 (issue 15, finding 7)."""
    code, _, err = run_flora("reward", "outcome", tiny_dataset, "--oracle",
                             "--out", tmp_path / "a", "--episodes", "98,99")  # fmt: skip
    assert code == EXIT_FAILED and "nothing usable" in err
    code, _, err = run_flora("reward", "outcome", tiny_dataset, "--oracle",
                             "--out", tmp_path / "b", "--episodes", "0,99")  # fmt: skip
    assert code == EXIT_PARTIAL, err
    report = tmp_path / "r.json"
    code, _, err = run_flora("reward", "outcome", tiny_dataset, "--oracle", "--out",
                             tmp_path / "b", "--episodes", "0,99", "--strict",
                             "--json", report)  # fmt: skip
    assert code == EXIT_FAILED, err
    got = json.loads(report.read_text())
    # The resumed run wrote nothing new (episode 0 was done); the table holds its row.
    assert got["exit_code"] == EXIT_FAILED and got["table_rows"] == 1 and got["failures"]
    # A resumed run that only skips finished episodes is all good, not "no rows".
    code, _, err = run_flora("reward", "outcome", tiny_dataset, "--oracle",
                             "--out", tmp_path / "b", "--episodes", "0")  # fmt: skip
    assert code == EXIT_OK, err


def test_caption_json_stdout(run_flora, tiny_dataset, tmp_path):
    code, out, err = run_flora("caption", tiny_dataset, "--oracle", "--events",
                               tiny_dataset / "ground_truth" / "events.parquet",
                               "--out", tmp_path, "--json", "-")  # fmt: skip
    assert code == EXIT_OK, err
    report = json.loads(out)
    assert report["table"] == "captions" and report["rows"] > 0 and report["failures"] == []
    assert "captions in" in err


def test_dataset_info_json(run_flora, tiny_dataset):
    code, out, _ = run_flora("dataset-info", tiny_dataset, "--json", "-")
    assert code == EXIT_OK
    assert json.loads(out)["episodes"] == 3


def test_report_json_is_strict():
    """NaN metrics (an episode without reference events) are null, not bare NaN."""
    from pathlib import Path

    import numpy as np

    from flora.cli_common import dumps

    text = dumps({"m": float("nan"), "x": [np.float32(0.5), float("inf")], "p": Path("/a")})
    assert json.loads(text) == {"m": None, "x": [0.5, None], "p": "/a"}
    assert "NaN" not in text and "Infinity" not in text
