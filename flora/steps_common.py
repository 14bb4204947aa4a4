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


def model_identity(backend: Any) -> tuple[str, str]:
    """``(model, model_version)`` as a step writes them into its rows."""
    return (
        str(getattr(backend, "name", type(backend).__name__)),
        str(getattr(backend, "model_version", "")),
    )


def stored_identity(backend: Any) -> tuple[str, str]:
    """:func:`model_identity` as the backend's rows will carry it, for the resume check.

    The OpenAI-compatible client reports ``openai:<model>`` until an answer brings the
    server's ``system_fingerprint`` (``flora serve`` sends its weights hash), which is what
    its rows then carry; before any request its ``/v1/models`` listing gives that version
    (``flora serve`` lists ``model_version``). When the listing does not (vLLM) or fails,
    the reported value stays, and rows with another version are redone.
    """
    model, version = model_identity(backend)
    served, listing = getattr(backend, "model", None), getattr(backend, "models", None)
    if not (isinstance(served, str) and callable(listing) and version == f"openai:{served}"):
        return model, version
    try:
        for m in listing().get("data", []):
            v = m.get("model_version") if isinstance(m, dict) and m.get("id") == served else None
            if isinstance(v, str) and v:
                return model, v[:200]  # as the client keeps a fingerprint
    except Exception:  # noqa: BLE001 - no listing: keep the reported version
        pass
    return model, version


def rows_match(
    store: TableStore,
    table: str,
    episode_id: str,
    identity: tuple[str, str],
    also: Mapping[str, str] | None = None,
) -> bool:
    """Whether every stored row of the episode was answered by the model ``identity``
    (``(model, model_version)``) and carries the values ``also`` names (a rubric's JSON).

    An empty part matches (no row to be stale: the model found nothing there); an
    unreadable part, or one lacking the columns, does not (redo it).
    """
    also = dict(also or {})
    cols = ["model", "model_version", *also]
    try:
        df = store.read_part(table, episode_id, columns=cols)
    except Exception:  # noqa: BLE001 - whatever is wrong with the part, redoing fixes it
        return False
    if df is None:
        return False
    same = (df["model"].astype(str) == identity[0]) & (
        df["model_version"].astype(str) == identity[1]
    )
    for col, value in also.items():
        same &= df[col].astype(str) == value
    return bool(same.all())


def split_current(
    store: TableStore,
    table: str,
    episode_ids: Sequence[str],
    identity: tuple[str, str],
    *,
    redo: bool = False,
) -> tuple[list[str], list[str]]:
    """``(todo, skipped)`` in ``episode_ids`` order: :meth:`TableStore.split_pending`, and an
    episode it would skip is redone when its rows came from another model or version
    (:func:`rows_match`): a rerun with a new model rewrites what the old one wrote."""
    todo, skipped = store.split_pending(table, list(episode_ids), redo=redo)
    stale = {e for e in skipped if not rows_match(store, table, e, identity)}
    if not stale:
        return todo, skipped
    redo_ids = set(todo) | stale
    return [e for e in episode_ids if e in redo_ids], [e for e in skipped if e not in stale]


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


__all__ = [
    "EpisodeStep",
    "model_identity",
    "read_validated",
    "rows_match",
    "run_episodes",
    "split_current",
    "stored_identity",
]
