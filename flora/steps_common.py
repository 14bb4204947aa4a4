"""Dataset-step mechanics shared by the engine's per-episode steps (segment, caption).

A step turns one episode into rows of one table. The loop around it is the same for
every step and lives here once: skip finished episodes, run the step per episode, write
its rows and record its failures (an episode that cannot be read is recorded as failed,
loses its earlier rows, and the rest completes), then read the whole table back and
validate it with its suite.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pandas as pd
from tqdm import tqdm

from flora.data.episode import FloraDataError
from flora.tables import Failure, TableStore

#: What a step returns for one episode: its rows, its failed items, and counts for the
#: progress bar.
EpisodeStep = Callable[[str], tuple[pd.DataFrame, list[Failure], Mapping[str, int]]]


def run_episodes(
    store: TableStore,
    table: str,
    episode_ids: Sequence[str],
    step: EpisodeStep,
    *,
    desc: str,
    progress: bool = True,
) -> list[str]:
    """Run ``step`` on each episode id, write its rows and record its failures.

    A ``FloraDataError`` raised by ``step`` (the episode cannot be read) is recorded as a
    failure of item ``episode`` and nothing is written for it; the episode's part from an
    earlier run is removed (:meth:`TableStore.drop`, pending until the failure is
    recorded), so ``table`` never keeps an earlier run's rows beside this run's failure for
    the same episode. Rows and failures are committed together (:meth:`TableStore.commit`),
    so an interrupted run redoes the episode. Returns the processed ids in order.
    """
    processed: list[str] = []
    bar = tqdm(episode_ids, desc=desc, unit="episode", disable=not progress)
    for eid in bar:
        try:
            rows, failures, counts = step(eid)
        except FloraDataError as e:
            store.drop(table, eid)  # the earlier run's rows: pending until recorded below
            store.record_failures(table, eid, [Failure(table, eid, "episode", str(e))])
            processed.append(eid)
            continue
        # One commit: a crash between the part and its failure record redoes the episode.
        store.commit(table, eid, rows, failures)
        processed.append(eid)
        bar.set_postfix(**counts)
    return processed


def read_validated(
    store: TableStore, table: str, dataset: str, dtypes: Mapping[str, str]
) -> tuple[pd.DataFrame, Any]:
    """The whole table and its validation report; raises ``TableValidationError`` if invalid.

    A table without rows is returned as an empty frame with ``dtypes`` (so its suite sees
    the table's columns and types).
    """
    from flora.validation.core import TableValidationError, validate_table

    df = store.read(table)
    if len(df) == 0:
        df = pd.DataFrame({c: pd.Series(dtype=t) for c, t in dtypes.items()})
    report = validate_table(table, df, dataset=dataset)
    if not report.success:
        raise TableValidationError(report)
    return df, report


__all__ = ["EpisodeStep", "read_validated", "run_episodes"]
