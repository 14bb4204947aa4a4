"""``flora eval caption``: mean ``r_cap`` of a captions table against ground truth.

Each caption row is matched to a ground-truth event of the same episode: exact
boundaries first, else the event with the highest tIoU if it is >= ``min_tiou`` (the
captioner may run on segmenter events whose boundaries differ slightly). Each matched
caption is judged against that event's requirements; a judge rejection (LLM judge whose
answers kept failing its grammar) is counted.

Two means are reported. The headline ``r_cap_all`` is over **every reference event** of
the evaluated episodes: an event with no scored caption (the captioner failed, the row
did not match, the judge rejected it) counts 0, so a captioner cannot look good by
answering only the easy events. ``r_cap_mean`` is the matched-only mean (what a scored
caption is worth) and ``coverage`` the fraction of reference events with a scored caption;
``r_cap_all`` ≈ ``coverage × r_cap_mean`` (exactly, when no two rows match one event).

``ground_truth_control`` is the judge's sanity check on the toy world: the ground-truth
captions scored against their own requirements (should be near 1) and the same captions
permuted across events (should be clearly lower).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from flora.data.episode import FloraDataError
from flora.metrics.caption import FAMILIES, CapScore, Judge, score_captions
from flora.parsing import Rejection


@dataclass
class CaptionEval:
    """Per-caption scores and their summary."""

    scores: pd.DataFrame  # one row per scored caption
    n_rows: int
    n_unmatched: int
    n_rejected: int
    judge: str
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def mean_r_cap(self) -> float:
        """Matched-only mean r_cap (scored captions only)."""
        return float(self.metrics.get("r_cap_mean", float("nan")))

    @property
    def r_cap_all(self) -> float:
        """Headline: mean r_cap over every reference event, a missing caption scoring 0."""
        return float(self.metrics.get("r_cap_all", float("nan")))


def load_captions(captions: str | Path | pd.DataFrame) -> pd.DataFrame:
    """A captions table from a DataFrame, a Parquet file, a parts folder or a store root."""
    if isinstance(captions, pd.DataFrame):
        return captions.copy()
    p = Path(captions)
    if p.is_dir() and (p / "captions").is_dir():
        p = p / "captions"
    if p.is_dir():
        parts = sorted(p.glob("*.parquet"))
        if not parts:
            raise FloraDataError("no captions parquet parts", file=p)
        return pd.concat([pd.read_parquet(q) for q in parts], ignore_index=True)
    if p.is_file():
        return pd.read_parquet(p)
    raise FloraDataError("captions table not found", file=p)


def _tiou(a: tuple[int, int], b: tuple[int, int]) -> float:
    inter = max(0, min(a[1], b[1]) - max(a[0], b[0]))
    union = max(a[1], b[1]) - min(a[0], b[0])
    return inter / union if union > 0 else 0.0


def _summarise(scores: list[CapScore], families: list[list[str]]) -> dict[str, float]:
    r = np.array([s.reward for s in scores], dtype=float)
    out = {
        "r_cap_mean": float(r.mean()) if len(r) else float("nan"),
        "r_cap_median": float(np.median(r)) if len(r) else float("nan"),
        "M_over_R_mean": float(np.mean([s.M / s.R if s.R else 1.0 for s in scores]))
        if scores
        else float("nan"),
        "F_mean": float(np.mean([s.F for s in scores])) if scores else float("nan"),
    }
    for fam in FAMILIES:
        # coverage rate of each requirement family, and how often it carried an error
        tot = cov = 0
        err = 0
        for s, fams in zip(scores, families, strict=True):
            idx = [k for k, f in enumerate(fams) if f == fam]
            tot += len(idx)
            cov += sum(k in s.covered for k in idx)
            err += fam in s.family_penalty
        if tot:
            out[f"coverage.{fam}"] = cov / tot
        out[f"error_rate.{fam}"] = err / len(scores) if scores else float("nan")
    return out


def _reference_best(
    gt: Any, episodes: list[int], rows: list[dict[str, Any]]
) -> tuple[int, dict[tuple[int, int, int], float]]:
    """Number of reference events and, per event with a scored caption, its r_cap.

    A reference event is keyed by (episode, start, end); when several caption rows match
    one event, the one with the highest tIoU counts (then the higher score), never their sum.
    """
    keys = {(i, e.start_us, e.end_us) for i in episodes for e in gt.events(i)}
    best: dict[tuple[int, int, int], tuple[float, float]] = {}
    for r in rows:
        ev = (r["episode_index"], r["gt_start_us"], r["gt_end_us"])
        if ev not in keys:
            continue
        cand = (float(r["tiou"]), float(r["r_cap"]))
        if ev not in best or cand > best[ev]:
            best[ev] = cand
    return len(keys), {k: v[1] for k, v in best.items()}


def _check_dataset(df: pd.DataFrame, name: str, src: str) -> None:
    """Refuse caption rows of another dataset than ``name`` (field ``dataset`` or
    ``episode_id``): they would be scored against the wrong ground truth."""
    if df.empty:
        return
    checks = [("episode_id", df["episode_id"].astype(str).str.rpartition("/")[0])]
    if "dataset" in df.columns:  # a null dataset is left to the episode_id check
        checks.insert(0, ("dataset", df["dataset"].dropna().astype(str)))
    for col, names in checks:
        other = sorted(set(names[names != name]))
        if other:
            raise FloraDataError(
                f"captions of dataset(s) {other[:3]} cannot be scored against the ground "
                f"truth of dataset {name!r}",
                dataset=name,
                file=src,
                field=col,
            )


def evaluate_captions(
    captions: str | Path | pd.DataFrame,
    dataset_root: str | Path,
    judge: Judge | None = None,
    *,
    min_tiou: float = 0.5,
    episodes: list[int] | None = None,
) -> CaptionEval:
    """Score every caption row against the matching ground-truth event's requirements.

    ``episodes`` names the reference episodes of the all-events mean (default: every
    episode of the ground truth — an episode the captioner never wrote counts 0 too).
    Every row must be of the dataset at ``dataset_root`` (its ``dataset`` column, when
    present, and its ``episode_id``'s ``<dataset>/`` prefix name it, as the readers do:
    :func:`flora.data.dataset.dataset_name`); another dataset's row is a
    ``FloraDataError`` naming the dataset and field, never scored against this ground truth.
    """
    from flora.caption.judges import EmbeddingJudge
    from flora.data.dataset import dataset_name
    from flora.data.ground_truth import load_ground_truth

    judge = judge or EmbeddingJudge()
    df = load_captions(captions)
    for col in ("episode_id", "start_us", "end_us", "caption"):
        if col not in df.columns:
            raise FloraDataError("captions table lacks a column", file=str(captions), field=col)
    src = "<DataFrame>" if isinstance(captions, pd.DataFrame) else str(captions)
    _check_dataset(df, dataset_name(dataset_root), src)
    gt = load_ground_truth(dataset_root)
    have = set(gt.episode_indices())
    items: list[tuple[str, Any]] = []
    keys: list[dict[str, Any]] = []
    fams: list[list[str]] = []
    unmatched = 0
    for row in df.itertuples(index=False):
        i = int(row.episode_index) if hasattr(row, "episode_index") else None
        if i is None:
            i = int(str(row.episode_id).rsplit("/", 1)[1])
        if i not in have:
            unmatched += 1
            continue
        span = (int(row.start_us), int(row.end_us))
        cands = gt.events(i)
        ious = [_tiou(span, (e.start_us, e.end_us)) for e in cands]
        if not ious or max(ious) < min_tiou:
            unmatched += 1
            continue
        best_iou = max(ious)
        best = cands[ious.index(best_iou)]  # exact boundaries give tIoU 1 and win
        items.append((str(row.caption), best.requirements))
        fams.append([q.family for q in best.requirements])
        keys.append(
            {
                "episode_id": row.episode_id,
                "episode_index": i,
                "start_us": span[0],
                "end_us": span[1],
                "caption": str(row.caption),
                "gt_caption": best.caption,
                "gt_start_us": best.start_us,
                "gt_end_us": best.end_us,
                "tiou": best_iou,
            }
        )
    results = score_captions(judge, items)
    rows, ok_scores, ok_fams, rejected = [], [], [], 0
    for k, res, f in zip(keys, results, fams, strict=True):
        if isinstance(res, Rejection):
            rejected += 1
            continue
        ok_scores.append(res)
        ok_fams.append(f)
        rows.append(
            {
                **k,
                "R": res.R,
                "M": res.M,
                "F": res.F,
                "r_cap": res.reward,
                "error_families": ",".join(res.family_penalty),
            }
        )
    metrics = _summarise(ok_scores, ok_fams)
    ref_eps = sorted(have) if episodes is None else [int(i) for i in episodes]
    n_ref, best = _reference_best(gt, ref_eps, rows)
    metrics = {
        "r_cap_all": float(sum(best.values()) / n_ref) if n_ref else float("nan"),
        "coverage": float(len(best) / n_ref) if n_ref else float("nan"),
        "n_reference_events": float(n_ref),
        **metrics,
    }
    metrics.update(
        {"n_scored": float(len(rows)), "n_unmatched": float(unmatched), "n_rejected": rejected}
    )
    return CaptionEval(
        scores=pd.DataFrame(rows),
        n_rows=len(df),
        n_unmatched=unmatched,
        n_rejected=rejected,
        judge=judge.name,
        metrics=metrics,
    )


def log_to_mlflow(
    result: CaptionEval,
    *,
    captions_path: str,
    dataset_root: str,
    control: dict[str, float] | None = None,
) -> str:
    """Log ``caption.*`` metrics (and the control, if given) plus per-caption scores."""
    import math

    import mlflow

    from flora.tracking import mlflow_run

    tags = {"flora.captions": captions_path, "flora.dataset": dataset_root, "judge": result.judge}
    metrics = {f"caption.{k}": float(v) for k, v in result.metrics.items()}
    metrics.update({f"caption.control.{k}": float(v) for k, v in (control or {}).items()})
    with mlflow_run("eval_caption", tags=tags) as run:
        mlflow.log_metrics({k: v for k, v in metrics.items() if math.isfinite(v)})
        mlflow.log_table(result.scores, artifact_file="eval/caption_scores.json")
        return run.info.run_id


def ground_truth_control(
    dataset_root: str | Path, judge: Judge | None = None, *, seed: int = 0
) -> dict[str, float]:
    """Ground-truth captions vs their own requirements, and a permuted-caption control.

    The permutation is a derangement-like shuffle over all events of the dataset (a
    caption may land on an event with the same text, which then legitimately scores 1).
    """
    from flora.caption.judges import EmbeddingJudge
    from flora.data.ground_truth import load_ground_truth

    judge = judge or EmbeddingJudge()
    gt = load_ground_truth(dataset_root)
    events = [e for i in gt.episode_indices() for e in gt.events(i)]
    if not events:
        raise FloraDataError("ground truth has no events", file=str(dataset_root))
    caps = [e.caption for e in events]
    perm = np.random.default_rng(seed).permutation(len(caps))
    if len(caps) > 1:
        # rotate fixed points away so no event keeps its own caption
        for k in np.flatnonzero(perm == np.arange(len(caps))):
            j = (k + 1) % len(caps)
            perm[k], perm[j] = perm[j], perm[k]
    own = score_captions(judge, [(c, e.requirements) for c, e in zip(caps, events, strict=True)])
    shuf = score_captions(
        judge, [(caps[p], e.requirements) for p, e in zip(perm, events, strict=True)]
    )

    def mean(xs: list[CapScore | Rejection]) -> float:
        return float(np.mean([x.reward for x in xs if not isinstance(x, Rejection)]))

    return {
        "n_events": float(len(events)),
        "gt_r_cap_mean": mean(own),
        "shuffled_r_cap_mean": mean(shuf),
        "same_caption_after_shuffle": float(
            np.mean([caps[p] == c for p, c in zip(perm, caps, strict=True)])
        ),
    }


__all__ = [
    "CaptionEval",
    "evaluate_captions",
    "ground_truth_control",
    "load_captions",
    "log_to_mlflow",
]
