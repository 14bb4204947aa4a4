"""``flora eval reward``: rewarder quality on toy-world ground truth or RoboRewardBench.

Toy world (a dataset with ``ground_truth/``): the three steps run on the dataset and their
tables are scored against ``flora.data.ground_truth``: outcome MAE on the 1–5 scale (E[s]
and argmax), dense per-group accuracy and failure recall over the 0.5 s group starts,
rubric L1 per episode (Σ_j |ŷ_j − y_j|) and total error. Every metric comes with its
coverage (items that produced a validated row / items the run was asked to do): failed
items are recorded and reported, never scored as if they had an answer. Only the rows this
run's steps wrote (or, with ``resume=True``, kept because the same model and model_version
wrote them) for the requested episodes are scored: rows an earlier run with another model
left in the output folder never count as this model's answers.

RoboRewardBench layout (accepted here; the public split is 2,831 videos with human scores):

    <root>/annotations.jsonl   one object per line: {"video": "videos/x.mp4",
                               "task": "fold the towel", "score": 4}
    or <root>/annotations.csv  header: video,task,score
    <root>/videos/...          the mp4 files (paths in ``video`` are relative to root)

Only outcome applies there (metric: MAE of E[s] against the human 1–5 score).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from flora.backends.base import VLMBackend
from flora.data.dataset import local_dataset_name
from flora.data.episode import Episode, FloraDataError
from flora.metrics.reward import dense_group_accuracy, failure_recall, outcome_mae, rubric_l1
from flora.reward.rubric import Rubric
from flora.reward.run import (
    TABLES,
    StepResult,
    dense_dataset,
    outcome_dataset,
    rubric_dataset,
)
from flora.steps_common import stored_identity
from flora.tables import COMMON_COLUMNS, TableStore

MODES = ("outcome", "dense", "rubric")


# --------------------------------------------------------------------------- toy world


def score_tables(
    dataset_root: str | Path,
    store: TableStore | str | Path,
    *,
    episodes: Iterable[int] | None = None,
    rows: Mapping[str, pd.DataFrame] | None = None,
) -> dict[str, float]:
    """Score the rewarder tables in ``store`` against the dataset's ground truth.

    ``episodes``: the episode indices a run was asked to do (default: every episode with
    ground truth); only their rows are scored and every coverage is over them.
    ``rows``: per table (``outcome``, ``dense_labels``, ``rubric``) the rows to score
    instead of the whole table in ``store`` — the harness passes the rows its own run
    wrote, so that rows left by earlier runs are never scored as its answers.
    """
    from flora.data.ground_truth import load_ground_truth

    root = Path(dataset_root)
    st = store if isinstance(store, TableStore) else TableStore(store)
    gt = load_ground_truth(root)
    name = local_dataset_name(root)  # "." names the folder, as the readers do
    known = gt.episode_indices()
    eps = known if episodes is None else list(dict.fromkeys(int(i) for i in episodes))
    wanted = {f"{name}/{i:06d}" for i in eps}
    has_gt = set(known)
    with_gt = [i for i in eps if i in has_gt]

    def table(t: str) -> pd.DataFrame:
        df = st.read(t) if rows is None or t not in rows else rows[t]
        if not len(df):
            return df
        return df[(df["dataset"] == name) & df["episode_id"].astype(str).isin(wanted)]

    m: dict[str, float] = {}

    oc = table("outcome")
    if len(oc):
        ref = [gt.outcome(_index(e)) for e in oc["episode_id"]]
        m["outcome.mae"] = outcome_mae(oc["expected_score"].astype(float), ref)
        m["outcome.mae_argmax"] = outcome_mae(oc["argmax_score"].astype(float), ref)
    m["outcome.coverage"] = len(oc) / len(eps) if eps else math.nan

    de = table("dense_labels")
    ref_rows = [(f"{name}/{i:06d}", t, lab) for i in with_gt for t, lab, _ in gt.dense(i)]
    ref_df = pd.DataFrame(ref_rows, columns=["episode_id", "t_us", "ref"])
    if len(de):
        j = de.merge(ref_df, on=["episode_id", "t_us"], how="inner")
        m["dense.accuracy"] = dense_group_accuracy(j["label"].astype(int), j["ref"].astype(int))
        m["dense.failure_recall"] = failure_recall(j["label"].astype(int), j["ref"].astype(int))
        m["dense.suboptimal_recall"] = failure_recall(
            j["label"].astype(int), j["ref"].astype(int), level=2
        )
        m["dense.coverage"] = len(j) / len(ref_df) if len(ref_df) else math.nan
    else:
        m["dense.coverage"] = 0.0

    rb = table("rubric")
    if len(rb):
        l1, tot = [], []
        for row in rb.itertuples(index=False):
            _, ref = gt.rubric(_index(row.episode_id))
            pred = dict(zip(list(row.step_names), map(float, row.step_scores), strict=True))
            l1.append(rubric_l1(pred, ref))
            tot.append(abs(float(row.total) - math.fsum(ref.values())))
        m["rubric.l1"] = float(np.mean(l1))
        m["rubric.total_abs_error"] = float(np.mean(tot))
    m["rubric.coverage"] = len(rb) / len(eps) if eps else math.nan
    return m


def _index(episode_id: str) -> int:
    return int(str(episode_id).rsplit("/", 1)[1])


def run_rows(store: TableStore, res: StepResult, backend: VLMBackend) -> pd.DataFrame:
    """The rows behind one step run: the parts of the episodes it wrote or (resume) kept,
    and of those only rows answered by ``backend``'s model and model_version."""
    ids = list(dict.fromkeys([*res.written, *res.skipped]))
    parts = [p for p in (store.read_part(res.table, e) for e in ids) if p is not None and len(p)]
    if not parts:
        return pd.DataFrame(columns=list(COMMON_COLUMNS))
    df = pd.concat(parts, ignore_index=True)
    model, version = stored_identity(backend)
    return df[(df["model"].astype(str) == model) & (df["model_version"].astype(str) == version)]


def gt_rubric_for(dataset_root: str | Path):
    """Episode -> the ground-truth rubric of its task family (toy world)."""
    from flora.data.ground_truth import load_ground_truth

    gt = load_ground_truth(dataset_root)
    cache: dict[str, Rubric] = {}

    def pick(ep: Episode) -> Rubric | None:
        try:
            rub, _ = gt.rubric(ep.index)
        except (FloraDataError, KeyError):
            return None
        key = json.dumps(rub, sort_keys=True)
        if key not in cache:
            cache[key] = Rubric.model_validate(rub)
        return cache[key]

    return pick


@dataclass
class BenchmarkResult:
    """Metrics plus the step results (failures with reasons) behind them."""

    metrics: dict[str, float]
    steps: dict[str, Any]
    out: Path


def run_toy_benchmark(
    dataset_root: str | Path,
    backend: VLMBackend,
    out: str | Path,
    *,
    modes: Sequence[str] = MODES,
    episodes: Sequence[int] | None = None,
    max_attempts: int = 3,
    resume: bool = False,
    progress: bool = True,
) -> BenchmarkResult:
    """Run the chosen rewarder steps on a toy-world dataset and score them.

    Scored: the rows these steps wrote (with ``resume``, also the ones they kept, which
    the steps keep only when the same model and model_version wrote them and, for rubric,
    with the same rubric), for the requested ``episodes`` (default: all); coverage is
    over the requested episodes.
    """
    bad = [m for m in modes if m not in MODES]
    if bad:
        raise ValueError(f"unknown modes {bad}; choose from {MODES}")
    store = TableStore(out)
    kw = dict(episodes=episodes, max_attempts=max_attempts, resume=resume, progress=progress)
    steps: dict[str, Any] = {}
    if "outcome" in modes:
        steps["outcome"] = outcome_dataset(dataset_root, backend, store, **kw)
    if "dense" in modes:
        steps["dense"] = dense_dataset(dataset_root, backend, store, **kw)
    if "rubric" in modes:
        steps["rubric"] = rubric_dataset(dataset_root, backend, store,
                                         gt_rubric_for(dataset_root), **kw)  # fmt: skip
    rows = {TABLES[mode]: run_rows(store, res, backend) for mode, res in steps.items()}
    metrics = score_tables(dataset_root, store, episodes=episodes, rows=rows)
    metrics = {k: v for k, v in metrics.items() if k.split(".")[0] in modes}
    for mode, res in steps.items():
        metrics[f"{mode}.failures"] = float(len(res.failures))
    return BenchmarkResult(metrics, steps, Path(out))


# --------------------------------------------------------------------------- RoboRewardBench


class RoboRewardBench:
    """A RoboRewardBench-layout folder, read as a dataset (one episode per video row)."""

    format = "roborewardbench"

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.name = self.root.name
        self.items = _read_annotations(self.root)

    def episode_indices(self) -> list[int]:
        return list(range(len(self.items)))

    def human_score(self, i: int) -> int:
        return self.items[i]["score"]

    def episode(self, i: int) -> Episode:
        """Episode ``i``: the row's video as a single main camera, with the row's task."""
        from flora.data.dataset import Mp4FolderDataset

        if not 0 <= i < len(self.items):
            raise FloraDataError("row out of range", dataset=self.name, episode=i,
                                 field="episode_index")  # fmt: skip
        it = self.items[i]
        ep = Mp4FolderDataset(it["path"].parent, [it["path"]]).episode(0)
        cams = {k: dataclasses.replace(c, role="main") for k, c in ep.cameras.items()}
        return dataclasses.replace(ep, dataset=self.name, index=i, task=it["task"], cameras=cams)


def _read_annotations(root: Path) -> list[dict[str, Any]]:
    jl, cv = root / "annotations.jsonl", root / "annotations.csv"
    if jl.exists():
        src, rows = jl, []
        for n, line in enumerate(jl.read_text().splitlines(), start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except (json.JSONDecodeError, RecursionError) as e:
                raise FloraDataError(f"line {n} is not JSON ({e})", dataset=root.name,
                                     file=jl) from e  # fmt: skip
            if not isinstance(obj, dict):
                raise FloraDataError(
                    f"row {len(rows)} (line {n}) is a JSON {type(obj).__name__}, not an object "
                    "with video, task and score", dataset=root.name, episode=len(rows),
                    file=jl, field="row",
                )  # fmt: skip
            rows.append(obj)
    elif cv.exists():
        src = cv
        with cv.open(newline="") as f:
            rows = list(csv.DictReader(f))
    else:
        raise FloraDataError("no annotations.jsonl or annotations.csv", dataset=root.name,
                             file=root)  # fmt: skip
    items = []
    for n, r in enumerate(rows):
        for key in ("video", "task", "score"):
            if key not in r or r[key] is None or (isinstance(r[key], str) and not r[key]):
                raise FloraDataError(f"row {n} lacks {key!r}", dataset=root.name, episode=n,
                                     file=src, field=key)  # fmt: skip
        for key in ("video", "task"):
            if not isinstance(r[key], str):
                raise FloraDataError(f"row {n} {key} {r[key]!r} is not a string",
                                     dataset=root.name, episode=n, file=src, field=key)  # fmt: skip
        try:
            # A JSON true/false is not a score (float(True) would make it 1).
            s = math.nan if isinstance(r["score"], bool) else float(r["score"])
        except (TypeError, ValueError, OverflowError):
            s = math.nan
        if not s.is_integer() or not 1 <= s <= 5:
            raise FloraDataError(f"row {n} score {r['score']!r} is not an integer 1..5",
                                 dataset=root.name, episode=n, file=src, field="score")  # fmt: skip
        path = (root / str(r["video"])).resolve()
        if not path.is_file():
            raise FloraDataError(f"row {n} video not found", dataset=root.name, episode=n,
                                 file=path, field="video")  # fmt: skip
        items.append({"path": path, "task": str(r["task"]), "score": int(s)})
    if not items:
        raise FloraDataError("annotations list no videos", dataset=root.name, file=src)
    return items


def run_roborewardbench(
    root: str | Path,
    backend: VLMBackend,
    out: str | Path,
    *,
    max_attempts: int = 3,
    max_frames: int = 32,
    resume: bool = False,
    progress: bool = True,
) -> BenchmarkResult:
    """Outcome rewards for every annotated video, scored by MAE against the human score."""
    bench = RoboRewardBench(root)
    store = TableStore(out)
    res = outcome_dataset(bench, backend, store, max_attempts=max_attempts,
                          max_frames=max_frames, resume=resume, progress=progress)  # fmt: skip
    df = run_rows(store, res, backend)  # this run's answers only, never an earlier model's
    df = df[df["dataset"] == bench.name] if len(df) else df
    m: dict[str, float] = {"rrb.items": float(len(bench.items))}
    if len(df):
        ref = [bench.human_score(_index(e)) for e in df["episode_id"]]
        m["rrb.mae"] = outcome_mae(df["expected_score"].astype(float), ref)
        m["rrb.mae_argmax"] = outcome_mae(df["argmax_score"].astype(float), ref)
    m["rrb.coverage"] = len(df) / len(bench.items)
    m["rrb.failures"] = float(len(res.failures))
    return BenchmarkResult(m, {"outcome": res}, Path(out))


def is_roborewardbench(root: str | Path) -> bool:
    """True for a folder in the RoboRewardBench layout accepted here."""
    r = Path(root)
    return (r / "annotations.jsonl").exists() or (r / "annotations.csv").exists()


def log_benchmark(result: BenchmarkResult, params: dict[str, Any]) -> str | None:
    """Log metrics, params and failures to MLflow via ``flora.tracking``; returns run id."""
    import mlflow

    from flora import tracking

    with tracking.mlflow_run("eval-reward", tags={"flora.area": "reward"}) as run:
        mlflow.log_params({k: str(v) for k, v in params.items()})
        mlflow.log_metrics({k: v for k, v in result.metrics.items() if math.isfinite(v)})
        failures = [
            f.__dict__ for res in result.steps.values() for f in getattr(res, "failures", [])
        ]
        mlflow.log_dict({"metrics": result.metrics, "failures": failures},
                        "eval_reward/result.json")  # fmt: skip
        return run.info.run_id
