"""Episode shards and the small references the data-engine DAG passes in XCom.

The DAG fans its heavy steps out over shards with dynamic task mapping: ``plan_shards``
returns one :class:`Shard` dict per mapped instance, and each instance processes the
episodes ``episodes[index::count]`` (strided, so long and short episodes spread evenly).

Episode lists never travel in XCom. ``ingest`` and ``validate`` write them to the run's
*episode sets* file (``<outputs>/runs/<dataset>/<mlflow run id>/episodes.json``) and hand
on its path and counts; every step reads the list it needs with :func:`episode_set`.
Steps write their full reports next to it (:func:`report_path`) and return a reference.
Light on imports: the DAG files import this module at parse time.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypedDict


#: What ``plan_shards`` returns per mapped instance.
class Shard(TypedDict):
    index: int
    count: int


def plan_shards(n_episodes: int, shards: int) -> list[Shard]:
    """``min(shards, n_episodes)`` shards (at least one), as mapping inputs."""
    if shards < 1:
        raise ValueError(f"shards must be >= 1, got {shards}")
    n = max(1, min(int(shards), int(n_episodes)))
    return [{"index": k, "count": n} for k in range(n)]


def shard_episodes(episodes: Sequence[int], shard: Mapping[str, int] | None) -> list[int]:
    """The episodes of ``shard`` (all of them when ``shard`` is None): ``sorted[index::count]``."""
    eps = sorted(int(i) for i in episodes)
    if shard is None:
        return eps
    k, n = int(shard["index"]), int(shard["count"])
    if not 0 <= k < n:
        raise ValueError(f"shard index {k} is not in [0, {n})")
    return eps[k::n]


def shard_label(shard: Mapping[str, int] | None) -> str:
    """``"k-of-n"`` (``"all"`` without a shard): names report files and MLflow runs."""
    return "all" if shard is None else f"{int(shard['index'])}-of-{int(shard['count'])}"


def shard_tags(shard: Mapping[str, int] | None) -> dict[str, str]:
    """The MLflow tags of a step's child run on ``shard``."""
    return {"flora.shard": shard_label(shard)}


def vlm_shard_episodes(
    valid: Sequence[int], shard: Mapping[str, int] | None, options: Any
) -> list[int]:
    """The episodes a VLM step processes on ``shard``: the run-wide bound
    (``StepOptions.vlm_episodes``) first, then the shard's part of what it keeps, so the
    bound means the same with any number of shards."""
    return shard_episodes(options.vlm_episodes(valid), shard)


def plan_shards_with_episodes(
    valid: Sequence[int], shards: int, options: Any
) -> list[dict[str, Any]]:
    """:func:`plan_shards` with each shard's episodes in it: ``episodes`` (segment) and
    ``vlm_episodes`` (caption, rewards: :func:`vlm_shard_episodes`).

    For the KFP pipeline, whose loop iterations take only the loop item (and pipeline
    parameters) reliably; the Airflow DAG keeps episode lists out of XCom instead.
    """
    return [
        {
            **sh,
            "episodes": shard_episodes(valid, sh),
            "vlm_episodes": vlm_shard_episodes(valid, sh, options),
        }  # fmt: skip
        for sh in plan_shards(len(valid), shards)
    ]


def unfinished_shards(
    shards: Sequence[Mapping[str, int]], handoffs: Mapping[str, Sequence[Mapping | None]]
) -> dict[str, list[str]]:
    """Shard label -> the steps it did not finish (shards that finished every step are left
    out). ``handoffs``: per step, each shard's hand-off (carrying its ``shard``) or None."""
    out: dict[str, list[str]] = {}
    for sh in shards:
        missing = [step for step, hs in handoffs.items()
                   if not any(h and dict(h["shard"]) == dict(sh) for h in hs)]  # fmt: skip
        if missing:
            out[shard_label(sh)] = missing
    return out


def describe_failed_shards(failed: Mapping[str, Sequence[str]], n_shards: int) -> str:
    """The error a run's summary raises when shards did not finish: how many, and for each
    the steps it did not finish (``failed``: shard label -> steps)."""
    return f"{len(failed)} of {n_shards} shard(s) did not finish: " + "; ".join(
        f"shard {k}: {', '.join(v)}" for k, v in sorted(failed.items())
    )


def run_dir(state: Mapping[str, Any]) -> Path:
    """``<outputs>/runs/<dataset>/<mlflow run id>``: this pipeline run's own files."""
    return Path(state["outputs_dir"]) / "runs" / state["dataset"] / state["mlflow_run_id"]


def write_episode_sets(state: Mapping[str, Any], **sets: Any) -> str:
    """Add ``sets`` (name -> list or dict) to the run's episode-sets file; return its path.

    Written to a temporary file and renamed, so a retried task never leaves half a file.
    """
    path = run_dir(state) / "episodes.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.loads(path.read_text()) if path.exists() else {}
    data.update(sets)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, sort_keys=True))
    os.replace(tmp, path)
    return str(path)


def episode_set(state: Mapping[str, Any], name: str) -> Any:
    """The episode set ``name`` (``episodes``, ``ingested``, ``valid``, ``invalid``,
    ``ingest_errors``) of the run whose state this is; a clear error when it is missing."""
    path = Path(state["episode_sets"])
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError as e:
        raise FileNotFoundError(
            f"episode sets {path} of run {state.get('mlflow_run_id')} are missing: the run's "
            "ingest/validate tasks wrote them; rerun the DAG run from ingest"
        ) from e
    if name not in data:
        raise KeyError(f"episode sets {path} have no {name!r} (have: {sorted(data)})")
    return data[name]


def report_path(state: Mapping[str, Any], step: str, shard: Mapping[str, int] | None) -> Path:
    """Where a step writes its full report for one shard."""
    return run_dir(state) / "steps" / f"{step}.{shard_label(shard)}.json"


__all__ = [
    "Shard",
    "describe_failed_shards",
    "episode_set",
    "plan_shards",
    "plan_shards_with_episodes",
    "report_path",
    "run_dir",
    "shard_episodes",
    "shard_label",
    "shard_tags",
    "unfinished_shards",
    "vlm_shard_episodes",
    "write_episode_sets",
]
