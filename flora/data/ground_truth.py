"""Ground truth of a generated toy-world dataset (``<root>/ground_truth/``).

Files (a contract other areas code against):

- ``events.parquet``: episode_index, start_us, end_us, caption, action, object, success,
  requirements (JSON list of {"family", "text", "mass"}). Non-overlapping, sorted, tiling
  the active parts of each episode (idle stretches are not events).
- ``dense.parquet``: episode_index, t_us (start of each 0.5 s group), label (1 failure,
  2 suboptimal, 3 normal), reason ('' when 3).
- ``outcome.parquet``: episode_index, score (1..5), success, failure_modes (comma-joined).
- ``rubric.json``: {rubric family: {"task", "steps": [{"name", "description",
  "allowed"}]}}, maxima summing to 1; ``rubric_scores.parquet``: episode_index, task
  (rubric family), step, score.
- ``episodes.parquet`` (extra): episode_index, task, family, duration_us.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from flora.data.episode import FloraDataError

REQUIREMENT_FAMILIES = ("action", "object", "spatial", "coordination", "outcome")
DENSE_GROUP_US = 500_000
FILES = (
    "events.parquet",
    "dense.parquet",
    "outcome.parquet",
    "rubric.json",
    "rubric_scores.parquet",
)


@dataclass(frozen=True)
class Requirement:
    """One unit of caption support mass (used by r_cap)."""

    family: str  # action | object | spatial | coordination | outcome
    text: str
    mass: float


@dataclass(frozen=True)
class GTEvent:
    """A ground-truth event; a failed attempt keeps its goal and has success=False."""

    start_us: int
    end_us: int
    caption: str
    action: str
    object: str
    success: bool
    requirements: list[Requirement] = field(default_factory=list)


class GroundTruth:
    """Read access to one dataset's ground truth tables."""

    def __init__(self, root: Path, tables: dict[str, pd.DataFrame], rubrics: dict) -> None:
        self.root = root
        self._t = tables
        self.rubrics = rubrics
        self._events = {int(k): g for k, g in tables["events"].groupby("episode_index")}
        self._dense = {int(k): g for k, g in tables["dense"].groupby("episode_index")}
        self._outcome = tables["outcome"].set_index("episode_index")
        self._rubric = {int(k): g for k, g in tables["rubric_scores"].groupby("episode_index")}

    @property
    def tables(self) -> dict[str, pd.DataFrame]:
        """The raw DataFrames: events, dense, outcome, rubric_scores (and episodes)."""
        return self._t

    def episode_indices(self) -> list[int]:
        """Episodes that have ground truth, ascending."""
        return sorted(int(i) for i in self._outcome.index)

    def _check(self, i: int) -> None:
        if i not in self._outcome.index:
            raise FloraDataError(
                "no ground truth for this episode",
                dataset=self.root.name,
                episode=i,
                file=self.root / "ground_truth" / "outcome.parquet",
                field="episode_index",
            )

    def _error(self, message: str, i: int, name: str, field: str) -> FloraDataError:
        """A ``FloraDataError`` about episode ``i`` in ``ground_truth/<name>``."""
        return FloraDataError(
            message,
            dataset=self.root.name,
            episode=i,
            file=self.root / "ground_truth" / name,
            field=field,
        )

    def _rows(self, groups: dict[int, pd.DataFrame], i: int, name: str) -> pd.DataFrame:
        """Episode ``i``'s rows of a per-episode table every episode has rows in."""
        self._check(i)
        g = groups.get(i)
        if g is None:  # has an outcome row but none here: the ground truth is incomplete
            raise self._error(f"episode has no rows in {name}", i, name, "episode_index")
        return g

    def events(self, i: int) -> list[GTEvent]:
        """Ground-truth events of episode i, sorted by start."""
        self._check(i)
        g = self._events.get(i)
        if g is None:
            return []
        out = []
        for r in g.sort_values("start_us").itertuples(index=False):
            try:
                reqs = [
                    Requirement(str(q["family"]), str(q["text"]), float(q["mass"]))
                    for q in json.loads(r.requirements)
                ]
            except (TypeError, ValueError, KeyError) as e:  # JSONDecodeError is a ValueError
                raise self._error(
                    f"requirements of the event at {r.start_us} µs are not a JSON list of "
                    f'{{"family", "text", "mass"}} ({type(e).__name__}: {e})',
                    i,
                    "events.parquet",
                    "requirements",
                ) from e
            out.append(
                GTEvent(
                    int(r.start_us),
                    int(r.end_us),
                    str(r.caption),
                    str(r.action),
                    str(r.object),
                    bool(r.success),
                    reqs,
                )
            )
        return out

    def dense(self, i: int) -> list[tuple[int, int, str]]:
        """(t_us, label, reason) per 0.5 s group of episode i."""
        g = self._rows(self._dense, i, "dense.parquet").sort_values("t_us")
        return [
            (int(t), int(lab), str(rs))
            for t, lab, rs in zip(g.t_us, g.label, g.reason, strict=True)
        ]

    def outcome(self, i: int) -> int:
        """Outcome score 1..5 of episode i."""
        self._check(i)
        return int(self._outcome.loc[i, "score"])

    def success(self, i: int) -> bool:
        self._check(i)
        return bool(self._outcome.loc[i, "success"])

    def failure_modes(self, i: int) -> list[str]:
        self._check(i)
        s = str(self._outcome.loc[i, "failure_modes"])
        return [m for m in s.split(",") if m]

    def rubric(self, i: int) -> tuple[dict, dict[str, float]]:
        """(rubric of the episode's task family, {step name: score})."""
        g = self._rows(self._rubric, i, "rubric_scores.parquet")
        fam = str(g.task.iloc[0])
        if fam not in self.rubrics:
            raise self._error(
                f"rubric family {fam!r} (rubric_scores.parquet column task) is not in "
                f"rubric.json (families: {sorted(self.rubrics)})",
                i,
                "rubric.json",
                "task",
            )
        return self.rubrics[fam], {str(s): float(v) for s, v in zip(g.step, g.score, strict=True)}


def load_ground_truth(root: str | Path) -> GroundTruth:
    """Load ``<root>/ground_truth``; a missing file or column is a FloraDataError."""
    root = Path(root)
    gt = root / "ground_truth"
    need = {
        "events": [
            "episode_index",
            "start_us",
            "end_us",
            "caption",
            "action",
            "object",
            "success",
            "requirements",
        ],
        "dense": ["episode_index", "t_us", "label", "reason"],
        "outcome": ["episode_index", "score", "success", "failure_modes"],
        "rubric_scores": ["episode_index", "task", "step", "score"],
    }
    tables: dict[str, pd.DataFrame] = {}
    for name, cols in need.items():
        p = gt / f"{name}.parquet"
        if not p.exists():
            raise FloraDataError("ground truth file missing", dataset=root.name, file=p)
        df = pd.read_parquet(p)
        for c in cols:
            if c not in df.columns:
                raise FloraDataError(
                    "ground truth column missing", dataset=root.name, file=p, field=c
                )
        tables[name] = df
    if (gt / "episodes.parquet").exists():
        tables["episodes"] = pd.read_parquet(gt / "episodes.parquet")
    rp = gt / "rubric.json"
    if not rp.exists():
        raise FloraDataError("ground truth file missing", dataset=root.name, file=rp)
    try:
        rubrics = json.loads(rp.read_text())
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError is a ValueError
        raise FloraDataError(
            f"rubric.json is not valid JSON ({e})", dataset=root.name, file=rp, field="rubric.json"
        ) from e
    if not isinstance(rubrics, dict):
        raise FloraDataError(
            "rubric.json must be an object {family: rubric}",
            dataset=root.name,
            file=rp,
            field="rubric.json",
        )
    return GroundTruth(root, tables, rubrics)


def write_ground_truth(root: Path, rollouts: dict[int, object]) -> Path:
    """Write the ground-truth tables of simulated rollouts (``flora.data.world.Rollout``)."""
    from flora.data.world import (
        RUBRICS,
        US_PER_FRAME,
        dense_labels,
        outcome_of,
        rubric_scores,
    )

    gt = Path(root) / "ground_truth"
    gt.mkdir(parents=True, exist_ok=True)
    ev, de, oc, rs, ep = [], [], [], [], []
    for i, r in sorted(rollouts.items()):
        for e in r.events:
            ev.append(
                {
                    "episode_index": i,
                    "start_us": e.start_frame * US_PER_FRAME,
                    "end_us": e.end_frame * US_PER_FRAME,
                    "caption": e.caption,
                    "action": e.action,
                    "object": e.object,
                    "success": bool(e.success),
                    "requirements": json.dumps(e.requirements),
                }
            )
        for t, lab, reason in dense_labels(r):
            de.append({"episode_index": i, "t_us": t, "label": lab, "reason": reason})
        score, ok, modes = outcome_of(r)
        oc.append({"episode_index": i, "score": score, "success": ok, "failure_modes": modes})
        fam, steps = rubric_scores(r)
        for step, v in steps.items():
            rs.append({"episode_index": i, "task": fam, "step": step, "score": float(v)})
        ep.append(
            {
                "episode_index": i,
                "task": r.plan.task,
                "family": r.plan.family,
                "duration_us": r.n_frames * US_PER_FRAME,
            }
        )
    types = {"episode_index": "int64"}
    pd.DataFrame(ev).astype({**types, "start_us": "int64", "end_us": "int64"}).to_parquet(
        gt / "events.parquet", index=False
    )
    pd.DataFrame(de).astype({**types, "t_us": "int64", "label": "int64"}).to_parquet(
        gt / "dense.parquet", index=False
    )
    pd.DataFrame(oc).astype({**types, "score": "int64"}).to_parquet(
        gt / "outcome.parquet", index=False
    )
    pd.DataFrame(rs).astype(types).to_parquet(gt / "rubric_scores.parquet", index=False)
    pd.DataFrame(ep).astype({**types, "duration_us": "int64"}).to_parquet(
        gt / "episodes.parquet", index=False
    )
    (gt / "rubric.json").write_text(json.dumps(RUBRICS, indent=2, sort_keys=True) + "\n")
    return gt
