"""Hand-built engine tables for curation tests (one TableStore root)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from flora.tables import Failure, TableStore

DS = "toy"


def eid(i: int) -> str:
    return f"{DS}/{i:06d}"


def common(i: int, run: str, model: str = "m") -> dict:
    return {"episode_id": eid(i), "dataset": DS, "model": model, "model_version": "1",
            "run_id": run}  # fmt: skip


def meta(tasks: dict[int, str], duration_s: float = 10.0, robot: str = "arm") -> pd.DataFrame:
    return pd.DataFrame([
        {"episode_id": eid(i), "episode_index": i, "task": t, "robot": robot,
         "policy_version": "v1", "day": "2026-11-30", "duration_us": int(duration_s * 1e6)}
        for i, t in tasks.items()
    ])  # fmt: skip


class Tables:
    """Write events/captions/outcome/dense_labels/rubric parts and failures."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.store = TableStore(root)

    def events(self, i: int, spans: list[tuple[float, float, str]], T: float = 10.0) -> None:
        rows = [{**common(i, "seg-run"), "event_index": k, "start_us": int(s * 1e6),
                 "end_us": int(e * 1e6), "duration_us": int(T * 1e6), "caption": "",
                 "source": "stitch", "n_windows": 1}
                for k, (s, e, _) in enumerate(spans)]  # fmt: skip
        self.store.write("events", eid(i), pd.DataFrame(rows))

    def captions(self, i: int, spans: list[tuple[float, float, str]], T: float = 10.0,
                 reject: tuple[int, ...] = ()) -> None:  # fmt: skip
        rows, fails = [], []
        for k, (s, e, c) in enumerate(spans):
            if k in reject:
                fails.append(
                    Failure(
                        "captions",
                        eid(i),
                        f"event {k} [{int(s * 1e6)}, {int(e * 1e6)}) µs",
                        "grammar rejection after 3 attempts",
                    )
                )
                continue
            rows.append(
                {
                    **common(i, "cap-run"),
                    "event_index": k,
                    "start_us": int(s * 1e6),
                    "end_us": int(e * 1e6),
                    "duration_us": int(T * 1e6),
                    "caption": c,
                }
            )
        if rows:
            self.store.write("captions", eid(i), pd.DataFrame(rows))
        self.store.record_failures("captions", eid(i), fails)

    def outcome(self, i: int, reward: float | None, reason: str = "grammar: no score") -> None:
        if reward is None:
            self.store.record_failures(
                "outcome", eid(i), [Failure("outcome", eid(i), "episode", reason)]
            )
            return
        self.store.write(
            "outcome", eid(i), pd.DataFrame([{**common(i, "rw-run"), "reward": reward}])
        )

    def dense(self, i: int, labels: list[int], reason: str = "drop: object fell") -> None:
        rows = [{**common(i, "rw-run"), "t_us": g * 500_000, "label": lab,
                 "reason": "" if lab == 3 else reason, "source_window": 0,
                 "source_group": g + 1} for g, lab in enumerate(labels)]  # fmt: skip
        self.store.write("dense_labels", eid(i), pd.DataFrame(rows))

    def full(self, i: int, spans, reward: float | None = 0.9, labels=None, T: float = 10.0,
             reject: tuple[int, ...] = ()) -> None:  # fmt: skip
        self.events(i, spans, T)
        self.captions(i, spans, T, reject)
        self.outcome(i, reward)
        self.dense(i, labels or [3] * int(T * 2))


SPANS = [
    (0.5, 2.0, "reach toward the red block"),
    (2.0, 3.5, "grasp the red block"),
    (3.5, 6.0, "lift the red block"),
    (6.0, 9.0, "move the red block over the bowl"),
]
