"""Engine tables written straight from a toy world's ground truth (the oracle annotator).

Curation, export and reports are downstream of the models; on the toy world their
correctness is checked against tables that say exactly what the ground truth says:
``events`` and ``captions`` (the ground-truth events and captions), ``outcome`` (a
one-hot score distribution at the true score, reward ``(score - 1) / 4``) and
``dense_labels`` (the true label of every 0.5 s group). Model name ``oracle``.
The benchmark (``benchmarks/curation.py``) and the tests use them; nothing here is a
model output.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from flora.data.dataset import local_dataset_name
from flora.data.episode import make_episode_id
from flora.data.ground_truth import load_ground_truth
from flora.tables import TableStore

ORACLE_MODEL = "oracle"


def write_oracle_tables(
    root: str | Path,
    out: str | Path,
    run_id: str = "oracle",
    *,
    dataset: str | None = None,
    tables: tuple[str, ...] = ("events", "captions", "outcome", "dense_labels"),
) -> TableStore:
    """Write the chosen tables for every ground-truth episode of ``root`` under ``out``."""
    root = Path(root)
    name = dataset or local_dataset_name(root)
    gt = load_ground_truth(root)
    eps = gt.tables["episodes"].set_index("episode_index")
    store = TableStore(out)
    for i in gt.episode_indices():
        eid = make_episode_id(name, i)
        T = int(eps.loc[i, "duration_us"])
        common = {"episode_id": eid, "dataset": name, "model": ORACLE_MODEL,
                  "model_version": "gt", "run_id": run_id}  # fmt: skip
        evs = gt.events(i)
        ev_rows = [{**common, "event_index": k, "start_us": e.start_us, "end_us": e.end_us,
                    "duration_us": T, "caption": e.caption, "source": "oracle",
                    "n_windows": 1} for k, e in enumerate(evs)]  # fmt: skip
        if "events" in tables and ev_rows:
            store.write("events", eid, pd.DataFrame(ev_rows))
        if "captions" in tables and ev_rows:
            store.write("captions", eid, pd.DataFrame(ev_rows).drop(columns=["source"]))
        if "outcome" in tables:
            s = gt.outcome(i)
            probs = [1.0 if k == s else 0.0 for k in range(1, 6)]
            store.write("outcome", eid, pd.DataFrame([{
                **common, "task": str(eps.loc[i, "task"]), "score_probs": probs,
                "expected_score": float(s), "reward": (s - 1) / 4.0, "argmax_score": s,
            }]))  # fmt: skip
        if "dense_labels" in tables:
            rows = [{**common, "t_us": t, "label": lab, "reason": rs, "source_window": 0,
                     "source_group": 1} for t, lab, rs in gt.dense(i)]  # fmt: skip
            store.write("dense_labels", eid, pd.DataFrame(rows))
    return store


__all__ = ["ORACLE_MODEL", "write_oracle_tables"]
