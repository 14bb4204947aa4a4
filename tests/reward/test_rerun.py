"""Reruns of the rewarder steps: no stale rows, no other model's or rubric's rows kept.

Review findings: a redone episode that produced no rows kept the previous run's part
beside the new failure records; resume skipped an episode whatever model or rubric wrote
its rows. (The harness side is in test_benchmark_rerun.py.)
"""

from __future__ import annotations

import pandas as pd
import pytest

from flora.backends.base import VLMResponse
from flora.reward.oracle import GroundTruthRewardBackend
from flora.reward.rubric import Rubric, render_rubric
from flora.reward.run import StepResult, _finish_episode, outcome_dataset, rubric_dataset
from flora.tables import Failure, TableStore


def _eid(ds, i):
    return f"{ds.name}/{i:06d}"


class OtherOracle(GroundTruthRewardBackend):
    """The oracle's answers under another model name / version."""

    def __init__(self, root, name="other-oracle", version="gt"):
        super().__init__(root)
        self.name, self.model_version = name, version


# --------------------------------------------------------------------------- stale rows


def _dense_row(eid: str, run_id: str, label: int = 3, reason: str = "") -> dict:
    return dict(episode_id=eid, dataset=eid.split("/")[0], model="m", model_version="v",
                run_id=run_id, t_us=0, label=label, reason=reason, source_window=0,
                source_group=1)  # fmt: skip


@pytest.mark.parametrize("new_rows", ["none", "invalid"])
def test_redone_episode_without_new_rows_loses_its_old_part(tmp_path, new_rows):
    store = TableStore(tmp_path)
    a, b = "d/000000", "d/000001"
    for eid in (a, b):
        _finish_episode(store, "dense_labels", eid, [_dense_row(eid, "run1")], [],
                        StepResult("dense_labels", tmp_path, "run1"))  # fmt: skip
    store.commit("outcome", a, pd.DataFrame([_dense_row(a, "run1")]), [])  # another table
    res = StepResult("dense_labels", tmp_path, "run2")
    # All windows failed (no rows), or the rows failed the table's suite (label 1, no reason).
    rows = [] if new_rows == "none" else [_dense_row(a, "run2", label=1)]
    fails = [Failure("dense_labels", a, "window 0 [0, 16000000) us", "parse: bad")]
    _finish_episode(store, "dense_labels", a, rows, fails, res)
    assert res.written == [] and not store.has("dense_labels", a)
    assert store.read_part("dense_labels", a) is None  # no run1 row beside run2's failure
    assert {f.episode_id for f in store.failures("dense_labels")} == {a}
    assert store.pending("dense_labels") == []  # committed: the failure record is in
    assert set(store.read("dense_labels").episode_id) == {b}  # the other episode kept
    assert store.has("outcome", a)  # the other table untouched


def test_outcome_redo_rejected_keeps_no_row_of_the_older_run(tiny_dataset, tmp_path):
    store, e0 = TableStore(tmp_path), _eid(tiny_dataset, 0)
    outcome_dataset(tiny_dataset, GroundTruthRewardBackend(tiny_dataset), store,
                    run_id="run1", episodes=[0, 1], progress=False)  # fmt: skip
    be = GroundTruthRewardBackend(tiny_dataset, faults={f"{e0}|outcome|episode": 99})
    r2 = outcome_dataset(tiny_dataset, be, store, run_id="run2", episodes=[0, 1],
                         resume=False, progress=False)  # fmt: skip
    assert [f.episode_id for f in r2.failures] == [e0]
    df = store.read("outcome")
    assert list(df.episode_id) == [_eid(tiny_dataset, 1)] and set(df.run_id) == {"run2"}


# --------------------------------------------------------------------------- resume


def test_resume_redoes_rows_of_another_model_or_version(tiny_dataset, tmp_path):
    store, e0 = TableStore(tmp_path), _eid(tiny_dataset, 0)
    kw = dict(episodes=[0], progress=False)
    outcome_dataset(tiny_dataset, GroundTruthRewardBackend(tiny_dataset), store, **kw)
    same = outcome_dataset(tiny_dataset, GroundTruthRewardBackend(tiny_dataset), store, **kw)
    assert same.skipped == [e0] and same.written == []
    other = outcome_dataset(tiny_dataset, OtherOracle(tiny_dataset), store, **kw)
    assert other.skipped == [] and other.written == [e0]
    assert list(store.read("outcome").model) == ["other-oracle"]
    newer = outcome_dataset(tiny_dataset, OtherOracle(tiny_dataset, version="gt2"), store, **kw)
    assert newer.written == [e0] and list(store.read("outcome").model_version) == ["gt2"]


class ServedOracle(GroundTruthRewardBackend):
    """Like the OpenAI client against ``flora serve``: ``openai:<model>`` until an answer
    brings the server's fingerprint, which the ``/v1/models`` listing also gives."""

    name = "openai"

    def __init__(self, root, listing: str | None = "weights-abc"):
        super().__init__(root)
        self.model, self._listing, self._seen = "flora", listing, None

    @property
    def model_version(self):
        return self._seen or f"openai:{self.model}"

    def models(self):
        if self._listing is None:
            raise ConnectionError("no listing")
        return {"data": [{"id": "other", "model_version": "x"},
                         {"id": self.model, "model_version": self._listing}]}  # fmt: skip

    def generate(self, requests):
        self._seen = "weights-abc"
        return super().generate(requests)


def test_resume_knows_a_served_models_version_before_it_answers(tiny_dataset, tmp_path):
    e0, kw = _eid(tiny_dataset, 0), dict(episodes=[0], progress=False)
    outcome_dataset(tiny_dataset, ServedOracle(tiny_dataset), tmp_path, **kw)
    assert list(TableStore(tmp_path).read("outcome").model_version) == ["weights-abc"]
    again = outcome_dataset(tiny_dataset, ServedOracle(tiny_dataset), tmp_path, **kw)
    assert again.skipped == [e0]  # not redone only because no answer was seen yet
    # A server that lists another version (new weights): redone.
    other = outcome_dataset(tiny_dataset, ServedOracle(tiny_dataset, "weights-new"), tmp_path,
                            **kw)  # fmt: skip
    assert other.written == [e0]


class MaxScorer:
    name = "max"
    model_version = "1"

    def __init__(self, rub):
        self.rub = rub

    def generate(self, requests):
        scores = {s.name: max(s.allowed) for s in self.rub.steps}
        return [VLMResponse(text=render_rubric(self.rub, scores), model=self.name)
                for _ in requests]  # fmt: skip


def test_resume_redoes_rows_of_another_rubric(tiny_dataset, tmp_path):
    a = Rubric(task="t", steps=[{"name": "done", "allowed": [0, 1]}])
    b = Rubric(task="t", steps=[{"name": "reach", "allowed": [0, 0.5]},
                                {"name": "place", "allowed": [0, 0.5]}])  # fmt: skip
    e0, kw = _eid(tiny_dataset, 0), dict(episodes=[0], progress=False)
    rubric_dataset(tiny_dataset, MaxScorer(a), tmp_path, a, **kw)
    again = rubric_dataset(tiny_dataset, MaxScorer(a), tmp_path, a.model_dump(), **kw)
    assert again.skipped == [e0]  # the same rubric, given as a dict: still done
    other = rubric_dataset(tiny_dataset, MaxScorer(b), tmp_path, lambda _e: b, **kw)
    assert other.skipped == [] and other.written == [e0] and other.ok
    assert list(TableStore(tmp_path).read("rubric").step_names.iloc[0]) == ["reach", "place"]
