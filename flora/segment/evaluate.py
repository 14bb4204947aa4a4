"""Score an ``events`` table against a dataset's ground truth (``flora eval segment``).

Definitions (also in ``docs/segmentation.md``):

* per episode, one-to-one maximum matching at each tIoU threshold (``flora.metrics``);
* pooled ("micro") over the evaluated episodes: ``P@θ = Σ matched / Σ |pred|``,
  ``R@θ = Σ matched / Σ |ref|``, ``F1@θ = 2PR/(P+R)``;
* ``mean_tiou``: mean over every ground-truth event of its best tIoU with any predicted
  event of the same episode (0 when it has none);
* ``macro_f1@θ``: mean of the per-episode F1 values.

Every ground-truth episode is evaluated; an episode absent from the table counts as
"predicted nothing" (it lowers recall) and is reported in ``missing_episodes``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from flora.contract import Event
from flora.data.episode import FloraDataError
from flora.metrics.segment import match, tiou_matrix

THRESHOLDS = (0.5, 0.75)


def read_events(path: str | Path) -> pd.DataFrame:
    """Read an events table: a TableStore root, its ``events/`` folder, or one Parquet file."""
    p = Path(path)
    if p.is_dir() and (p / "events").is_dir():
        p = p / "events"
    if p.is_dir():
        parts = sorted(p.glob("*.parquet"))
        frames = [pd.read_parquet(x) for x in parts]
        frames = [f for f in frames if len(f)]
        df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    elif p.is_file():
        df = pd.read_parquet(p)
    else:
        raise FloraDataError("events table not found", file=p)
    for c in ("episode_id", "start_us", "end_us"):
        if len(df) and c not in df.columns:
            raise FloraDataError("events table column missing", file=p, field=c)
    return df


def _episode_index(episode_id: str) -> int:
    try:
        return int(str(episode_id).rsplit("/", 1)[-1])
    except ValueError as e:
        raise FloraDataError(
            f"episode_id {episode_id!r} does not end in an episode index", field="episode_id"
        ) from e


@dataclass
class SegmentEval:
    """Pooled metrics plus the per-episode table."""

    metrics: dict[str, float]
    per_episode: pd.DataFrame
    missing_episodes: list[int] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "metrics": self.metrics,
            "missing_episodes": self.missing_episodes,
            "per_episode": self.per_episode.to_dict(orient="records"),
        }


def evaluate_events(
    events: pd.DataFrame,
    dataset_root: str | Path,
    *,
    thresholds: Sequence[float] = THRESHOLDS,
    run_id: str | None = None,
) -> SegmentEval:
    """Compare predicted events with ``<dataset_root>/ground_truth/events.parquet``."""
    from flora.data.dataset import local_dataset_name
    from flora.data.ground_truth import load_ground_truth

    root = Path(dataset_root)
    gt = load_ground_truth(root)
    df = events
    if len(df) and "dataset" in df.columns:
        df = df[df["dataset"].astype(str) == local_dataset_name(root)]
    if run_id is not None and len(df) and "run_id" in df.columns:
        df = df[df["run_id"].astype(str) == run_id]
    pred_by_ep: dict[int, list[Event]] = {}
    if len(df):
        for eid, g in df.groupby("episode_id"):
            pred_by_ep[_episode_index(str(eid))] = [
                Event(int(a), int(b)) for a, b in zip(g["start_us"], g["end_us"], strict=True)
            ]
    rows = []
    tot = {th: 0 for th in thresholds}
    n_pred = n_ref = 0
    best_sum = 0.0
    for i in gt.episode_indices():
        ref = [Event(e.start_us, e.end_us) for e in gt.events(i)]
        pred = pred_by_ep.get(i, [])
        row: dict[str, Any] = {"episode_index": i, "n_ref": len(ref), "n_pred": len(pred)}
        for th in thresholds:
            m = match(pred, ref, th)
            tot[th] += m.matched
            row[f"f1@{th:g}"] = m.f1
            row[f"precision@{th:g}"] = m.precision
            row[f"recall@{th:g}"] = m.recall
        if ref:
            best = tiou_matrix(pred, ref).max(axis=0) if pred else [0.0] * len(ref)
            best_sum += float(sum(best))
            row["mean_tiou"] = float(sum(best)) / len(ref)
        else:
            row["mean_tiou"] = float("nan")
        n_pred += len(pred)
        n_ref += len(ref)
        rows.append(row)
    per = pd.DataFrame(rows)
    metrics: dict[str, float] = {
        "episodes": float(len(rows)),
        "n_pred": float(n_pred),
        "n_ref": float(n_ref),
        "mean_tiou": best_sum / n_ref if n_ref else 0.0,
    }
    for th in thresholds:
        p = tot[th] / n_pred if n_pred else (1.0 if n_ref == 0 else 0.0)
        r = tot[th] / n_ref if n_ref else (1.0 if n_pred == 0 else 0.0)
        metrics[f"precision@{th:g}"] = p
        metrics[f"recall@{th:g}"] = r
        metrics[f"f1@{th:g}"] = 2 * p * r / (p + r) if p + r > 0 else 0.0
        metrics[f"macro_f1@{th:g}"] = float(per[f"f1@{th:g}"].mean()) if len(per) else 0.0
    missing = sorted(set(gt.episode_indices()) - set(pred_by_ep))
    return SegmentEval(metrics, per, missing)


def log_to_mlflow(result: SegmentEval, *, events_path: str, dataset_root: str) -> str:
    """Log the metrics (``segment.*``) and the per-episode table to an MLflow run."""
    import mlflow

    from flora.tracking import mlflow_run

    tags = {"flora.events": events_path, "flora.dataset": dataset_root}
    with mlflow_run("eval_segment", tags=tags) as run:
        mlflow.log_metrics(
            {f"segment.{k}".replace("@", "_at_"): v for k, v in result.metrics.items()}
        )
        mlflow.log_dict(result.to_dict(), "eval/segment.json")
        return run.info.run_id
