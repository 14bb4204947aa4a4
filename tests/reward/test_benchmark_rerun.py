"""``flora eval reward`` reruns: only this run's answers, coverage over what was asked.

Review findings: the harness scored rows an earlier run (another model) had left in its
output folder and divided coverage by every ground-truth episode instead of the requested
ones; a non-object JSONL annotation line crashed with TypeError and ``"score": true`` was
read as 1.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest

from flora.backends.base import TokenLogprob, VLMResponse
from flora.data.episode import FloraDataError
from flora.reward.benchmark import _read_annotations, run_toy_benchmark, score_tables
from flora.reward.oracle import GroundTruthRewardBackend
from flora.reward.run import StepResult
from flora.tables import TableStore


def _eid(ds, i):
    return f"{ds.name}/{i:06d}"


class AlwaysOne:
    """Outcome answers ``score: 1`` with certainty."""

    name = "always-one"
    model_version = "1"

    def generate(self, requests):
        toks = [TokenLogprob("score", 0.0, {}), TokenLogprob(":", 0.0, {}),
                TokenLogprob(" ", 0.0, {}), TokenLogprob("1", 0.0, {"1": 0.0})]  # fmt: skip
        return [VLMResponse(text="score: 1", logprobs=toks, model=self.name) for _ in requests]


# --------------------------------------------------------------------------- harness


def test_benchmark_scores_only_this_runs_rows_over_the_requested_episodes(tiny_dataset, tmp_path):
    from flora.data.ground_truth import load_ground_truth

    gt = [load_ground_truth(tiny_dataset).outcome(i) for i in range(2)]
    oracle = GroundTruthRewardBackend(tiny_dataset)
    kw = dict(modes=["outcome"], progress=False)
    m = run_toy_benchmark(tiny_dataset, oracle, tmp_path, episodes=[0, 1], **kw).metrics
    assert m["outcome.coverage"] == 1.0  # 2 of the 2 requested, not 2 of 3
    assert m["outcome.mae"] == pytest.approx(0, abs=1e-4)
    # Another model on episode 0 only: the oracle's row of episode 1 is not its answer.
    m = run_toy_benchmark(tiny_dataset, AlwaysOne(), tmp_path, episodes=[0], **kw).metrics
    assert m["outcome.mae"] == pytest.approx(gt[0] - 1) and m["outcome.coverage"] == 1.0
    # Resuming across models never scores the other model's rows: they are redone.
    r = run_toy_benchmark(tiny_dataset, AlwaysOne(), tmp_path, episodes=[0, 1], resume=True,
                          **kw)  # fmt: skip
    assert r.steps["outcome"].skipped == [_eid(tiny_dataset, 0)]  # its own row, kept
    assert r.metrics["outcome.coverage"] == 1.0
    assert r.metrics["outcome.mae"] == pytest.approx((gt[0] - 1 + gt[1] - 1) / 2)


def test_score_tables_filters_episodes_and_rows(tiny_dataset, tmp_path):
    from flora.curate.oracle import write_oracle_tables

    store = write_oracle_tables(tiny_dataset, tmp_path / "tables", "run-gt")
    whole = score_tables(tiny_dataset, store)  # the default: every row, every episode
    assert whole["outcome.coverage"] == 1.0 and whole["dense.coverage"] == 1.0
    sub = score_tables(tiny_dataset, store, episodes=[2])
    assert sub["outcome.coverage"] == 1.0 and sub["dense.coverage"] == 1.0
    oc = store.read("outcome")
    only1 = score_tables(tiny_dataset, store, episodes=[1, 2],
                         rows={"outcome": oc[oc.episode_id == _eid(tiny_dataset, 1)]})  # fmt: skip
    assert only1["outcome.coverage"] == 0.5 and only1["dense.coverage"] == 1.0


def test_run_rows_keeps_only_this_models_rows(tmp_path):
    from flora.reward.benchmark import run_rows

    store = TableStore(tmp_path)
    rows = pd.DataFrame({"episode_id": ["d/000000"] * 2, "dataset": ["d"] * 2,
                         "model": ["always-one", "garbage"], "model_version": ["1", "1"],
                         "run_id": ["r", "r"], "expected_score": [1.0, 2.0]})  # fmt: skip
    store.commit("outcome", "d/000000", rows, [])
    store.commit("outcome", "d/000001", rows.assign(episode_id="d/000001"), [])
    res = StepResult("outcome", tmp_path, "r", written=["d/000000"])
    got = run_rows(store, res, AlwaysOne())
    assert list(got.episode_id) == ["d/000000"] and list(got.model) == ["always-one"]
    assert run_rows(store, StepResult("outcome", tmp_path, "r"), AlwaysOne()).empty


# --------------------------------------------------------------------------- annotations


@pytest.mark.parametrize(
    ("line", "field", "needle"),
    [
        ('{"video": "videos/a.mp4", "task": "t", "score": true}', "score", "not an integer"),
        ('{"video": "videos/a.mp4", "task": "t", "score": false}', "score", "not an integer"),
        ("5", "row", "JSON int, not an object"),
        ('["videos/a.mp4", "t", 3]', "row", "JSON list, not an object"),
        ('"videos/a.mp4"', "row", "JSON str, not an object"),
        ('{"video": "videos/a.mp4", "task": 7, "score": 3}', "task", "not a string"),
        ('{"video": ["videos/a.mp4"], "task": "t", "score": 3}', "video", "not a string"),
        ('{"video": "videos/a.mp4", "task": "t", "score": 1e999}', "score", "not an integer"),
    ],
)
def test_bad_annotation_rows_are_typed_errors(tmp_path, line, field, needle):
    (tmp_path / "videos").mkdir()
    (tmp_path / "videos" / "a.mp4").write_bytes(b"x")
    good = json.dumps({"video": "videos/a.mp4", "task": "t", "score": 4})
    (tmp_path / "annotations.jsonl").write_text(f"{good}\n\n{line}\n")
    with pytest.raises(FloraDataError) as ei:
        _read_annotations(tmp_path)
    e = ei.value
    assert needle in str(e) and e.field == field and e.episode == 1
    assert e.file is not None and e.file.endswith("annotations.jsonl")
