"""The caption pipeline step: events → contexts → mosaics → model → ``captions`` table.

``caption_episode`` picks each event's BEFORE/TARGET/AFTER clips
(:mod:`flora.caption.context`), samples them as multi-camera mosaics
(:func:`flora.data.mosaic.sample_mosaics`: main left, wrist right, black tile where a camera
has no frame), builds one request per event (:mod:`flora.caption.prompts`), asks any
``VLMBackend``, parses with the caption grammar and bounded retries
(:func:`flora.parsing.generate_parsed`) and returns one row per captioned event plus one
recorded failure per event that could not be captioned (malformed interval, no frames,
output still rejected after the retries). Boundaries are copied from the events, never
changed.

``caption_dataset`` runs that over every episode of an events table and writes the
``captions`` table with :class:`flora.tables.TableStore` (one Parquet part per episode,
resumable, failures recorded), validated with its GX suite before it is returned.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from flora.backends.base import VLMBackend, VLMRequest
from flora.caption.context import (
    ROLE_BEFORE,
    ROLE_TARGET,
    EventContext,
    select_contexts,
)
from flora.caption.grammar import caption_regex, parse_caption_response
from flora.caption.prompts import (
    PROMPT_VERSION,
    SYSTEM_PROMPT,
    ClipSpec,
    build_caption_prompt,
)
from flora.contract import EVENT_KEY, Event, event_keys
from flora.data.episode import Episode, FloraDataError, make_episode_id
from flora.parsing import generate_parsed
from flora.steps_common import (
    model_identity,
    read_validated,
    run_episodes,
    split_current,
    stored_identity,
)
from flora.tables import Failure, TableStore, part_key

TABLE = "captions"
CAPTION_DTYPES: dict[str, str] = {
    "episode_id": "object",
    "dataset": "object",
    "model": "object",
    "model_version": "object",
    "run_id": "object",
    "episode_index": "int64",
    "event_index": "int64",
    "start_us": "int64",
    "end_us": "int64",
    "duration_us": "int64",
    "caption": "object",
    "context_roles": "object",
    "before_event_index": "int64",  # -1 when there is no BEFORE context
    "after_event_index": "int64",  # -1 when there is no AFTER context
    "missing_views": "object",  # JSON {clip role: [camera roles missing at some instant]}
    "views": "object",  # mosaic layout, left to right, e.g. "main,wrist"
    "n_frames": "int64",
    "attempts": "int64",
    "prompt_version": "object",
}


@dataclass(frozen=True)
class CaptionConfig:
    """Sampling and decoding settings of the captioner (defaults documented in docs)."""

    target_fps: float = 2.0  # TARGET frames per second ...
    max_target_frames: int = 16  # ... spread uniformly when the event is long
    context_fps: float = 2.0  # BEFORE / AFTER: 2 s at 2 Hz = 4 frames
    max_context_frames: int = 4
    max_new_tokens: int = 96
    temperature: float = 0.0
    max_attempts: int = 3
    # Off by default: the seed's context is the neighbouring *clips*. When on, captions come
    # only from a previous model pass, never from ground truth (see load_events_table).
    neighbour_captions: bool = False
    require_neighbour: bool = True  # DESIGN: context clips only next to a neighbour event


@dataclass
class EpisodeCaptions:
    """What ``caption_episode`` produced: table rows and per-event failures."""

    episode_id: str
    rows: pd.DataFrame
    failures: list[Failure] = field(default_factory=list)


def _times(start_us: int, end_us: int, fps: float, max_frames: int) -> list[int]:
    """Sample times of a clip at ``fps``, thinned uniformly to at most ``max_frames``."""
    from flora.data.frames import sample_times

    ts = sample_times(start_us, end_us, fps)
    if len(ts) > max_frames:
        idx = np.unique(np.round(np.linspace(0, len(ts) - 1, max_frames)).astype(int))
        ts = [ts[i] for i in idx]
    return ts


def _plan_times(ctx: EventContext, cfg: CaptionConfig) -> list[tuple[str, list[int]]]:
    out = []
    for c in ctx.clips:
        if c.role == ROLE_TARGET:
            out.append(
                (c.role, _times(c.start_us, c.end_us, cfg.target_fps, cfg.max_target_frames))
            )
        else:
            out.append(
                (c.role, _times(c.start_us, c.end_us, cfg.context_fps, cfg.max_context_frames))
            )
    return out


def _as_event(ev: Any) -> Any:
    """Normalise numpy integers to ``int`` so eq. (1) checks see real integers."""
    s, e = getattr(ev, "start_us", None), getattr(ev, "end_us", None)
    if isinstance(s, np.integer):
        s = int(s)
    if isinstance(e, np.integer):
        e = int(e)
    if s is None or e is None:
        return ev
    return Event(s, e, str(getattr(ev, "caption", "") or ""))  # type: ignore[arg-type]


def _mosaics_for(episode: Episode, times: list[int]) -> dict[int, Any]:
    """Mosaic per distinct time (one decode pass per camera for the whole episode)."""
    from flora.data.mosaic import sample_mosaics

    uniq = sorted(set(times))
    try:
        return dict(zip(uniq, sample_mosaics(episode, uniq, clamp_end=False), strict=True))
    except FloraDataError:
        # Some instant has no camera at all: sample time by time so only the events that
        # need such an instant fail (their error is raised again per event below).
        out: dict[int, Any] = {}
        for t in uniq:
            try:
                out[t] = sample_mosaics(episode, [t])[0]
            except FloraDataError:
                continue
        return out


@dataclass
class CaptionRequests:
    """Requests for one episode's events, with what each row needs, and early failures."""

    episode_id: str
    requests: list[VLMRequest]
    meta: list[dict[str, Any]]  # per request: event position, context, missing views ...
    failures: list[Failure]
    event_indices: list[int]


def request_id(episode_id: str, event_index: int, start_us: int, end_us: int) -> str:
    """``<episode_id>#event<k>@<start_us>-<end_us>`` — names the event in error reports."""
    return f"{episode_id}#event{event_index}@{start_us}-{end_us}"


def parse_request_id(rid: str) -> tuple[str, int, int, int]:
    """Inverse of ``request_id``: ``(episode_id, event_index, start_us, end_us)``."""
    eid, _, rest = rid.rpartition("#event")
    k, _, span = rest.partition("@")
    s, _, e = span.partition("-")
    return eid, int(k), int(s), int(e)


def _model_key(value: Any) -> str:
    """A ``model`` value, stripped and lower-cased; null (None, NaN, NA) is ``""``.

    A null model is no model name: after concatenating a model pass with ground-truth rows
    those rows carry NaN or None, and they are reference rows (``str`` would make them the
    model names ``"nan"`` / ``"None"``).
    """
    if value is None or (pd.api.types.is_scalar(value) and pd.isna(value)):
        return ""
    return str(value).strip().lower()


def _refuse_reference_events(events: Sequence[Any], episode: Episode) -> None:
    """Neighbour captions may only come from events that name a non-reference model.

    The same rule as :func:`load_events_table`, for callers (SFT/GRPO/eval set builders)
    that pass events directly: ground-truth ``Event`` objects carry no ``model`` and are
    refused, so no reference caption can reach a prompt through this path either.
    """
    for e in events:
        model = _model_key(getattr(e, "model", None))
        if not model or model in REFERENCE_MODELS:
            raise FloraDataError(
                "neighbour captions need events from a previous model pass; these carry "
                f"no model or a reference model ({model or 'none'!r}) and would leak "
                "reference captions into the prompt",
                dataset=episode.dataset,
                episode=episode.episode_id,
                field="caption",
            )


def build_caption_requests(
    episode: Episode,
    events: Sequence[Any],
    *,
    config: CaptionConfig | None = None,
    event_indices: Sequence[int] | None = None,
) -> CaptionRequests:
    """Context selection, mosaics and prompts for every event of one episode.

    Events that cannot be captioned (malformed, outside the episode, an instant with no
    camera) are returned as ``Failure``s; the others get one ``VLMRequest`` each.
    """
    cfg = config or CaptionConfig()
    eid = episode.episode_id
    if cfg.neighbour_captions:
        _refuse_reference_events(events, episode)
    evs = [_as_event(e) for e in events]
    idx = list(event_indices) if event_indices is not None else list(range(len(evs)))
    if len(idx) != len(evs):
        raise ValueError(f"{eid}: {len(idx)} event_indices for {len(evs)} events")
    failures: list[Failure] = []

    def fail(k: int, reason: str) -> None:
        ev = evs[k]
        item = f"event {idx[k]} [{getattr(ev, 'start_us', '?')}, {getattr(ev, 'end_us', '?')}) µs"
        failures.append(Failure(TABLE, eid, item, reason))

    contexts = select_contexts(
        evs,
        episode.duration_us,
        dataset=episode.dataset,
        episode=episode.index,
        require_neighbour=cfg.require_neighbour,
    )
    plans: dict[int, list[tuple[str, list[int]]]] = {}
    for k, ctx in enumerate(contexts):
        if isinstance(ctx, FloraDataError):
            fail(k, f"invalid event: {ctx}")
        else:
            plans[k] = _plan_times(ctx, cfg)
    all_times = [t for p in plans.values() for _, ts in p for t in ts]
    mosaics = _mosaics_for(episode, all_times) if all_times else {}

    requests: list[VLMRequest] = []
    meta: list[dict[str, Any]] = []
    for k, plan in plans.items():
        ctx = contexts[k]
        assert isinstance(ctx, EventContext)
        missing_t = [t for _, ts in plan for t in ts if t not in mosaics]
        if missing_t:
            fail(k, f"no camera has a frame at {missing_t[0]} µs (episode {eid})")
            continue
        images, times, specs = [], [], []
        missing_views: dict[str, list[str]] = {}
        views: tuple[str, ...] = ()
        for role, ts in plan:
            first = len(images) + 1
            gaps: dict[str, list[int]] = {}
            for t in ts:
                m = mosaics[t]
                views = m.roles
                images.append(m.image)
                times.append(int(t))
                for v in m.roles:
                    if v not in m.present:
                        gaps.setdefault(v, []).append(len(images))
            if gaps:
                missing_views[role] = sorted(gaps)
            clip = ctx.clip(role)
            assert clip is not None
            neighbour = ctx.before if role == ROLE_BEFORE else ctx.after
            specs.append(
                ClipSpec(
                    role=role,
                    first_image=first,
                    last_image=len(images),
                    start_us=clip.start_us,
                    end_us=clip.end_us,
                    neighbour_start_us=neighbour.start_us if neighbour else None,
                    neighbour_end_us=neighbour.end_us if neighbour else None,
                    neighbour_caption=(
                        neighbour.caption if neighbour and cfg.neighbour_captions else ""
                    ),
                    missing=gaps,
                )
            )
        prompt = build_caption_prompt(episode.task, episode.duration_us, views, specs)
        requests.append(
            VLMRequest(
                prompt=prompt,
                images=images,
                frame_times_us=times,
                system=SYSTEM_PROMPT,
                max_new_tokens=cfg.max_new_tokens,
                temperature=cfg.temperature,
                request_id=request_id(eid, idx[k], ctx.target.start_us, ctx.target.end_us),
                guided_regex=caption_regex(),  # used where the backend can constrain
            )
        )
        meta.append(
            {"k": k, "ctx": ctx, "missing": missing_views, "views": views, "n": len(images)}
        )
    return CaptionRequests(eid, requests, meta, failures, idx)


def caption_episode(
    episode: Episode,
    events: Sequence[Any],
    backend: VLMBackend,
    *,
    config: CaptionConfig | None = None,
    run_id: str = "",
    event_indices: Sequence[int] | None = None,
) -> EpisodeCaptions:
    """Caption every event of one episode (see the module docstring).

    ``events`` are objects with ``start_us``/``end_us`` (and optionally ``caption``), in
    the events table's order; ``event_indices`` gives their ``event_index`` values
    (default ``0..n-1``). Per-event problems become ``Failure``s; the rest completes.
    """
    cfg = config or CaptionConfig()
    built = build_caption_requests(episode, events, config=cfg, event_indices=event_indices)
    eid, idx, failures = built.episode_id, built.event_indices, list(built.failures)
    results = (
        generate_parsed(backend, built.requests, parse_caption_response, cfg.max_attempts)
        if built.requests
        else []
    )
    rows: list[dict[str, Any]] = []
    for m, res in zip(built.meta, results, strict=True):
        k, ctx = m["k"], m["ctx"]
        n_attempts = len(res.attempts) + (1 if res.ok else 0)
        if not res.ok:
            assert res.rejection is not None
            failures.append(
                Failure(
                    TABLE,
                    eid,
                    f"event {idx[k]} [{ctx.target.start_us}, {ctx.target.end_us}) µs",
                    f"{res.rejection.kind} rejection after {n_attempts} attempts: "
                    f"{res.rejection.reason} (last output: {res.rejection.text[:120]!r})",
                )
            )
            continue
        before = idx[ctx.before_index] if ctx.before_index is not None else -1
        after = idx[ctx.after_index] if ctx.after_index is not None else -1
        model, version = model_identity(backend)  # after the answer: a pod's fingerprint
        rows.append(
            {
                "episode_id": eid,
                "dataset": episode.dataset,
                "model": model,
                "model_version": version,
                "run_id": run_id,
                "episode_index": int(episode.index),
                "event_index": int(idx[k]),
                "start_us": ctx.target.start_us,  # copied: the captioner never moves them
                "end_us": ctx.target.end_us,
                "duration_us": int(episode.duration_us),
                "caption": res.value,
                "context_roles": ",".join(ctx.roles),
                "before_event_index": before,
                "after_event_index": after,
                "missing_views": json.dumps(m["missing"], sort_keys=True),
                "views": ",".join(m["views"]),
                "n_frames": m["n"],
                "attempts": n_attempts,
                "prompt_version": PROMPT_VERSION,
            }
        )
    df = pd.DataFrame(rows, columns=list(CAPTION_DTYPES)).astype(CAPTION_DTYPES)
    df = df.sort_values("event_index", kind="stable").reset_index(drop=True)
    return EpisodeCaptions(eid, df, failures)


# --------------------------------------------------------------------------- events input


# ``model`` values that mark a table as reference annotations rather than a model pass.
REFERENCE_MODELS = frozenset({"ground_truth", "ground-truth", "ground-truth-oracle", "gt", "human"})


def is_reference_table(df: pd.DataFrame) -> bool:
    """True when an events table's captions are reference (ground-truth) captions.

    A table counts as a model pass only when every row names a model that is not a
    reference source: the toy world's ``ground_truth/events.parquet`` has no ``model``
    column at all, the ground-truth oracle labels its rows ``ground-truth-oracle``, and a
    row whose model is empty or null (None/NaN, e.g. ground-truth rows concatenated with a
    model pass) is a reference row.
    """
    if "model" not in df.columns or df.empty:
        return "model" not in df.columns
    models = df["model"].map(_model_key)
    if (models == "").any() or models.isin(REFERENCE_MODELS).any():
        return True
    if "model_version" in df.columns:
        return bool((df["model_version"].map(_model_key) == "gt").any())
    return False


def segmented_into_no_events(
    events_table: str | Path | pd.DataFrame, episode_ids: Iterable[str]
) -> set[str]:
    """The ``episode_ids`` whose part in an events *store* (``<out>/events`` or its root)
    exists and holds no rows: the segmenter found no event in them.

    A DataFrame or a single Parquet file cannot say so (an episode absent from it may just
    not be segmented yet): none.
    """
    if isinstance(events_table, pd.DataFrame):
        return set()
    d = Path(events_table)
    if d.is_dir() and (d / "events").is_dir():
        d = d / "events"
    if not d.is_dir():
        return set()
    import pyarrow.parquet as pq

    out = set()
    for eid in episode_ids:
        part = d / f"{part_key(eid)}.parquet"
        if part.is_file() and pq.ParquetFile(part).metadata.num_rows == 0:
            out.add(eid)
    return out


def load_events_table(
    events_table: str | Path | pd.DataFrame,
    dataset_name: str,
    *,
    neighbour_captions: bool = False,
) -> pd.DataFrame:
    """Events to caption, as a DataFrame with ``episode_id``, ``event_index``, boundaries.

    Accepts a DataFrame, a Parquet file (the segmenter's part or the ground truth's
    ``events.parquet``, which has ``episode_index`` instead of ``episode_id``), a folder of
    parts (``<out>/events``) or a TableStore root holding ``events/``.

    The ``caption`` column is blanked unless ``neighbour_captions``: an events table's
    captions must never reach a prompt as neighbour context by accident (DESIGN §3.2).
    With ``neighbour_captions`` a reference table (:func:`is_reference_table`) is refused
    with a ``FloraDataError`` — quoting ground truth would let the model copy its answer.
    """
    if isinstance(events_table, pd.DataFrame):
        df = events_table.copy()
        src = "<DataFrame>"
    else:
        p = Path(events_table)
        src = str(p)
        if p.is_dir() and (p / "events").is_dir():
            p = p / "events"
        if p.is_dir():
            parts = sorted(p.glob("*.parquet"))
            if not parts:
                raise FloraDataError("no events parquet parts", dataset=dataset_name, file=p)
            df = pd.concat([pd.read_parquet(q) for q in parts], ignore_index=True)
        elif p.is_file():
            df = pd.read_parquet(p)
        else:
            raise FloraDataError("events table not found", dataset=dataset_name, file=p)
    for col in ("start_us", "end_us"):
        if col not in df.columns:
            raise FloraDataError(
                "events table lacks a column", dataset=dataset_name, file=src, field=col
            )
    if "episode_id" not in df.columns:
        if "episode_index" not in df.columns:
            raise FloraDataError(
                "events table needs episode_id or episode_index",
                dataset=dataset_name,
                file=src,
                field="episode_id",
            )
        df["episode_id"] = [make_episode_id(dataset_name, i) for i in df["episode_index"]]
    if neighbour_captions and is_reference_table(df):
        raise FloraDataError(
            "refusing neighbour captions from a ground-truth / reference events table: "
            "they would leak reference answers into the prompts; use a previous model "
            "pass's table (its rows name the model) or leave neighbour captions off",
            dataset=dataset_name,
            file=src,
            field="caption",
        )
    if "caption" not in df.columns or not neighbour_captions:
        df["caption"] = ""
    if "event_index" not in df.columns:
        df = df.sort_values(["episode_id", "start_us", "end_us"], kind="stable")
        df["event_index"] = df.groupby("episode_id").cumcount()
    return df.reset_index(drop=True)


def _episode_index(eid: str, dataset_name: str) -> int:
    prefix, _, num = eid.rpartition("/")
    if prefix != dataset_name or not num.isdigit():
        raise FloraDataError(
            f"episode_id {eid!r} does not belong to dataset {dataset_name!r}",
            dataset=dataset_name,
            episode=eid,
            field="episode_id",
        )
    return int(num)


@dataclass
class CaptionRun:
    """Result of ``caption_dataset``: the validated table and what happened."""

    table_dir: Path
    captions: pd.DataFrame
    run_id: str
    processed: list[str]
    skipped: list[str]
    failures: list[Failure]
    report: Any  # flora.validation.core.ValidationReport
    #: Episodes of this dataset that now have no events: their captions (and failure
    #: records) from an earlier run were removed.
    dropped: list[str] = field(default_factory=list)


def caption_dataset(
    dataset_path: str | Path,
    events_table: str | Path | pd.DataFrame,
    out_dir: str | Path,
    backend: VLMBackend,
    run_id: str | None = None,
    *,
    config: CaptionConfig | None = None,
    episodes: Sequence[int] | None = None,
    overwrite: bool = False,
    progress: bool = True,
) -> CaptionRun:
    """Caption every event of ``events_table`` into ``<out_dir>/captions/`` (resumable).

    An episode already written without recorded failures is skipped unless ``overwrite``;
    an episode with failed events is written with its good captions, its failures
    recorded, and captioned again by the next run. An episode that cannot be read is
    recorded as failed and loses its captions of an earlier run. An episode of this
    dataset (of ``episodes``, when given) whose part in an events store is empty
    (:func:`segmented_into_no_events`) loses its captions and failure records of an earlier
    run (they describe events that no longer exist; ``CaptionRun.dropped``). Rows of
    ``events_table`` naming another dataset's episodes are left alone (reported as
    failures, nothing of that dataset is written or removed); a table with only such rows
    is a ``FloraDataError``. The whole table is validated with the ``captions`` suite
    before it is returned (``TableValidationError`` otherwise).
    """
    from flora.data.dataset import open_dataset

    ds = open_dataset(dataset_path)
    cfg = config or CaptionConfig()
    ev = load_events_table(events_table, ds.name, neighbour_captions=cfg.neighbour_captions)
    store = TableStore(out_dir)
    run_id = run_id or f"caption-{uuid.uuid4().hex[:12]}"
    groups = {
        eid: g.sort_values("event_index", kind="stable") for eid, g in ev.groupby("episode_id")
    }
    # Another dataset's episodes (a shared events store) are not this run's: never
    # captioned, failed or removed here.
    foreign = sorted(e for e in groups if e.rpartition("/")[0] != ds.name)
    if foreign and len(foreign) == len(groups):
        raise FloraDataError(
            f"the events table holds no episode of dataset {ds.name!r} (its episode ids "
            f"name other datasets, e.g. {foreign[0]!r})",
            dataset=ds.name,
            field="episode_id",
        )
    order = sorted(set(groups) - set(foreign))
    scope = {make_episode_id(ds.name, i) for i in ds.episode_indices()}
    if episodes is not None:
        wanted = {make_episode_id(ds.name, i) for i in episodes}
        order = [e for e in order if e in wanted]
        scope = wanted
    # An episode the segmenter wrote an empty part for (segmented again into no events)
    # keeps no captions of events that no longer exist, nor failures of them. An episode
    # merely absent from the events is left alone: it may not be segmented yet.
    failed = {f.episode_id for f in store.failures(TABLE)}
    pending = set(store.pending(TABLE))
    dropped: list[str] = []
    for eid in sorted(segmented_into_no_events(events_table, scope - set(groups))):
        if store.drop(TABLE, eid) or eid in failed or part_key(eid) in pending:
            store.record_failures(TABLE, eid, [])  # commits the drop: no rows, no failures
            dropped.append(eid)
    # A rerun with another model (or version) redoes what the earlier one wrote.
    todo, skipped = split_current(store, TABLE, order, stored_identity(backend), redo=overwrite)
    # Captions written for other event intervals (the episode was segmented again since)
    # describe segments that no longer exist: such an episode is captioned again.
    stale = {
        e
        for e in skipped
        if event_keys(store.read_part(TABLE, e, list(EVENT_KEY))) != event_keys(groups[e])
    }
    redo = stale | set(todo)
    todo = [e for e in order if e in redo]
    skipped = [e for e in skipped if e not in stale]

    def step(eid: str) -> tuple[pd.DataFrame, list[Failure], dict[str, int]]:
        g = groups[eid]
        out = caption_episode(
            ds.episode(_episode_index(eid, ds.name)),
            list(g.itertuples(index=False)),
            backend,
            config=cfg,
            run_id=run_id,
            event_indices=[int(i) for i in g["event_index"]],
        )
        return out.rows, out.failures, {"captions": len(out.rows), "failed": len(out.failures)}

    processed = run_episodes(store, TABLE, todo, step, desc=f"caption {ds.name}",
                             progress=progress)  # fmt: skip
    df, report = read_validated(store, TABLE, ds.name, CAPTION_DTYPES)
    not_ours = [
        Failure(TABLE, e, "episode", f"episode_id {e!r} does not belong to dataset {ds.name!r}")
        for e in foreign
    ]
    return CaptionRun(
        table_dir=Path(out_dir) / TABLE,
        captions=df,
        run_id=run_id,
        processed=processed,
        skipped=skipped,
        failures=[*store.failures(TABLE), *not_ours],
        report=report,
        dropped=dropped,
    )


__all__ = [
    "CAPTION_DTYPES",
    "TABLE",
    "CaptionConfig",
    "CaptionRun",
    "EpisodeCaptions",
    "CaptionRequests",
    "build_caption_requests",
    "caption_dataset",
    "caption_episode",
    "parse_request_id",
    "request_id",
    "load_events_table",
    "is_reference_table",
    "REFERENCE_MODELS",
]
