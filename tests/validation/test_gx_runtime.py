"""The process-wide GX runtime: results kept for Data Docs are bounded."""

from __future__ import annotations

import pandas as pd

from flora.validation import core


def _events() -> pd.DataFrame:
    return pd.DataFrame([{"episode_id": "toy/000000", "dataset": "toy", "model": "m",
                          "model_version": "1", "run_id": "r", "event_index": 0,
                          "start_us": 0, "end_us": 10, "duration_us": 20, "caption": "c",
                          "source": "s", "n_windows": 1}])  # fmt: skip


def test_old_results_are_evicted_and_left_out_of_data_docs(monkeypatch, tmp_path):
    monkeypatch.setattr(core, "KEEP_RESULTS", 2)
    reports = [core.validate_table("events", _events()) for _ in range(4)]
    assert all(r.success for r in reports)
    ids = [r.gx_result_id for r in reports]
    assert len(set(ids)) == 4  # every Checkpoint run has its own result
    rt = core._GX.get()
    store = rt.context.validation_results_store
    assert list(rt.kept) == ids[2:]
    assert [store.has_key(rt.kept[i]) for i in ids[2:]] == [True, True]
    # The two oldest were removed from the in-memory store: nothing left to render.
    assert core.write_data_docs(reports[:2], tmp_path / "old") is None
    index = core.write_data_docs(reports[2:], tmp_path / "new")
    assert index is not None and index.exists()
    assert len(list((tmp_path / "new" / "validations").rglob("*.html"))) == 2
