"""The data-validation checks CI runs (issue 9 item 4): ``make test`` fails on a violated
expectation in the DVC-tracked toy world or in any table a small engine run writes.

Both checks call the CLI users call (``flora validate``, ``flora validate-table``) in a
subprocess, piped (not a terminal), so the output is one grep-able line per problem and
the exit status is the documented one; any problem line or non-zero status fails here.

1. The DVC-tracked toy world: a fresh clone has only ``datasets.dvc`` (the DVC remote is
   local and empty), so the dataset is regenerated exactly as ``make demo`` does (the
   session fixture ``demo_repo`` in tests/conftest.py, shared with tests/dags/test_dvc.py),
   its DVC directory hash must equal the committed ``datasets.dvc`` (else the validated
   bytes are not the tracked ones), and then ``flora validate`` must pass.
2. A small engine run on two short episodes (6 s and 8 s): the kinematic segmenter through
   ``flora.engine.run_segment``, then the captioner and the three rewarder modes through
   their step functions with the ground-truth oracle backends (real prompts, grammars and
   parsers, no model to load), and ``flora validate-table all`` on the table root.

Measured on 2 shared cores (2026-11-30): see docs/validation.md.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FLORA = str(Path(sys.executable).parent / "flora")
ENGINE_TABLES = {"events", "captions", "outcome", "dense_labels", "rubric"}


def _flora(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the ``flora`` CLI piped, as CI does."""
    return subprocess.run([FLORA, *args], capture_output=True, text=True, cwd=REPO)


def _problems(p: subprocess.CompletedProcess[str]) -> list[str]:
    """Problem lines (``<severity> <dataset>/<episode> ...``) of a piped run."""
    return [ln for ln in p.stdout.splitlines() if ln.startswith(("error ", "warning "))]


def test_dvc_tracked_toy_world_passes_flora_validate(demo_repo, tmp_path):
    from tests.conftest import demo_repo_as_committed

    # The validated bytes are the tracked ones (a second generation if the first met the
    # rare byte flip; a stale pointer fails there).
    repo = demo_repo_as_committed(demo_repo, tmp_path)
    dataset = repo / "datasets" / "toy_world"
    report = tmp_path / "toy_world.json"
    p = _flora("validate", str(dataset), "--json", str(report))
    assert _problems(p) == [], "\n".join(_problems(p))
    assert p.returncode == 0, p.stdout + p.stderr
    saved = json.loads(report.read_text())
    assert saved["success"] and saved["valid_episodes"] == list(range(10))
    assert set(saved["tables"]) == {"raw_frames", "raw_episodes", "raw_cameras"}
    assert all(t["success"] for t in saved["tables"].values())
    assert saved["tables"]["raw_cameras"]["row_count"] == 20  # 10 episodes x 2 cameras
    # GX Data Docs (HTML) beside the JSON report, one page per suite's Checkpoint run.
    docs = Path(saved["data_docs"])
    assert docs == tmp_path / "toy_world_data_docs" / "index.html" and docs.exists()
    assert len(list(docs.parent.glob("validations/**/*.html"))) == 3


@pytest.fixture(scope="module")
def engine_tables(tmp_path_factory):
    """A small engine run on a 2-episode toy world: (dataset root, table root)."""
    from flora.caption.oracle import GroundTruthCaptionBackend
    from flora.caption.run import caption_dataset
    from flora.data import open_dataset
    from flora.data.synth import generate
    from flora.engine import rubric_source, run_segment
    from flora.reward import run as rr
    from flora.reward.oracle import GroundTruthRewardBackend
    from flora.settings import FloraSettings

    base = tmp_path_factory.mktemp("engine")
    root = generate(base / "ci_world", episodes=2, seed=11, durations_s=(6.0, 8.0),
                    progress=False)  # fmt: skip
    out = base / "tables"
    eps = [0, 1]
    settings = FloraSettings(home=base / "home", backend="kinematic")
    seg = run_segment(root, out, eps, "ci", settings=settings, progress=False)
    assert seg.rows > 0, seg.failures
    caption_dataset(root, out, out, GroundTruthCaptionBackend(root), "ci", episodes=eps,
                    progress=False)  # fmt: skip
    ds = open_dataset(root)
    rb = GroundTruthRewardBackend(root)
    for mode in ("outcome", "dense"):
        rr.reward_dataset(mode, ds, rb, out, run_id="ci", episodes=eps, progress=False)
    rr.rubric_dataset(ds, rb, out, rubric_source(root), run_id="ci", episodes=eps,
                      progress=False)  # fmt: skip
    return root, out


def test_every_table_of_a_small_engine_run_passes_flora_validate_table(engine_tables, tmp_path):
    _, out = engine_tables
    written = {d.name for d in out.iterdir() if d.is_dir() and any(d.glob("*.parquet"))}
    assert written == ENGINE_TABLES, written  # every step wrote rows
    report = tmp_path / "tables.json"
    p = _flora("validate-table", "all", str(out), "--json", str(report))
    assert _problems(p) == [], "\n".join(_problems(p))
    assert p.returncode == 0, p.stdout + p.stderr
    saved = json.loads(report.read_text())
    assert set(saved["tables"]) == ENGINE_TABLES
    for name, t in saved["tables"].items():
        assert t["success"] and t["row_count"] > 0, name
        assert t["dataset"] == "ci_world", name
    summaries = [ln for ln in p.stdout.splitlines() if ln.startswith("summary: ")]
    assert len(summaries) == len(ENGINE_TABLES)
    assert Path(saved["data_docs"]).exists()


def test_a_violated_expectation_fails_the_ci_check(engine_tables, tmp_path, capsys):
    """The same command on a damaged copy: one problem line naming the episode, exit != 0
    (so the two tests above would fail ``make test``). In process through the CLI's own
    entry (``run_app``, as the ``flora`` script) to spare one interpreter start."""
    import pandas as pd

    from flora.cli import app
    from flora.cli_common import run_app

    _, out = engine_tables
    events = pd.concat(
        [pd.read_parquet(p) for p in sorted((out / "events").glob("*.parquet"))],
        ignore_index=True,
    )
    bad = events.copy()
    row = bad.index[bad.episode_id == "ci_world/000001"][0]
    bad.loc[row, "end_us"] = int(bad.loc[row, "duration_us"]) + 1  # eq. (1) violated
    damaged = tmp_path / "events.parquet"
    bad.to_parquet(damaged)
    capsys.readouterr()
    code = run_app(app, ["validate-table", "events", str(damaged), "--no-docs"])
    stdout = capsys.readouterr().out
    assert code == 3, stdout  # episode 0 is still fine
    (line,) = [ln for ln in stdout.splitlines() if ln.startswith("error ")]
    assert line.startswith("error ci_world/000001 duration_us,end_us ")
    assert line.endswith(f"[{damaged}]")
