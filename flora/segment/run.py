"""The segment pipeline step: episodes → windows → model outputs → stitched ``events`` table.

``segment_episode`` plans the primary (and shifted) windows, asks a backend for each
window's ``u v l r`` list (frames sampled at 4 Hz, multi-camera mosaics), parses with
bounded retries, records every window that still fails (pass, index, reason), stitches
the windows that succeeded and refines boundaries with the shifted pass.

With ``backend=None`` the kinematic baseline (:mod:`flora.segment.kinematic`) plays the
model: it segments each window from the episode's own state, and its output goes through
the same render → parse → stitch → refine path.

``segment_dataset`` runs that over a dataset and writes the ``events`` table with
:class:`flora.tables.TableStore` (one Parquet part per episode, resumable; failures
recorded), then validates the whole table with its GX suite before returning it.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from flora.backends.base import VLMBackend, VLMRequest, VLMResponse
from flora.contract import ContractError, Event, validate_events
from flora.data.episode import Episode, FloraDataError, make_episode_id
from flora.parsing import Rejection, generate_parsed
from flora.segment import kinematic
from flora.segment.grammar import parse_segments, render_segments, segments_regex
from flora.segment.plan import LocalSegment, Window, plan_windows
from flora.segment.prompts import SYSTEM, segment_prompt
from flora.segment.refine import refine_detailed
from flora.segment.stitch import stitch_detailed
from flora.steps_common import (
    model_identity,
    read_validated,
    run_episodes,
    split_current,
    stored_identity,
)
from flora.tables import Failure, TableStore

TABLE = "events"
EVENT_DTYPES: dict[str, str] = {
    "episode_id": "object",
    "dataset": "object",
    "model": "object",
    "model_version": "object",
    "run_id": "object",
    "event_index": "int64",
    "start_us": "int64",
    "end_us": "int64",
    "duration_us": "int64",
    "caption": "object",
    "source": "object",
    "n_windows": "int64",
    "windows": "object",
    "profile": "object",
    "start_refined": "bool",
    "end_refined": "bool",
}


def window_item(pass_name: str, index: int, start_us: int, end_us: int) -> str:
    """How a failure report names one window: its pass, index and span (the span tells
    apart windows of one index, e.g. a training set's clipped windows)."""
    return f"{pass_name} window {index} [{start_us}, {end_us}) µs"


@dataclass(frozen=True)
class WindowFailure:
    """A window whose output could not be obtained or parsed (after bounded retries)."""

    pass_name: str  # "primary" | "shifted"
    window: int
    start_us: int
    end_us: int
    reason: str

    @property
    def item(self) -> str:
        return window_item(self.pass_name, self.window, self.start_us, self.end_us)


@dataclass(frozen=True)
class SegmentedEvent:
    """One output event with its provenance."""

    start_us: int
    end_us: int
    windows: tuple[int, ...]  # primary windows whose segments formed it
    start_refined: bool = False
    end_refined: bool = False


class RepeatedEventError(FloraDataError):
    """An episode's stitched events repeat an interval, which the ``events`` table forbids
    (its suite would then fail on every later run, the part being already on disk).

    Stitching and refinement collapse repeats, so this is a guard: :func:`segment_episode`
    raises it before any row exists, and :func:`segment_dataset` records it as the
    episode's failure (item ``episode``) and writes nothing for the episode.
    """


def check_unique_intervals(events: Sequence[SegmentedEvent], episode_id: str) -> None:
    """Raise :class:`RepeatedEventError` if two events share ``(start_us, end_us)``."""
    seen: dict[tuple[int, int], int] = {}
    for i, e in enumerate(events):
        key = (int(e.start_us), int(e.end_us))
        if key in seen:
            raise RepeatedEventError(
                f"events {seen[key]} and {i} repeat the interval [{key[0]}, {key[1]}) µs; "
                "nothing written for this episode",
                episode=episode_id,
                field="events",
            )
        seen[key] = i


@dataclass
class EpisodeSegmentation:
    """Everything ``segment_episode`` produced for one episode."""

    episode_id: str
    dataset: str
    duration_us: int
    profile: str
    model: str
    model_version: str
    events: list[SegmentedEvent]
    primary_windows: list[Window]
    shifted_windows: list[Window]
    failures: list[WindowFailure] = field(default_factory=list)

    def to_events(self) -> list[Event]:
        return [Event(e.start_us, e.end_us) for e in self.events]

    def to_frame(self, run_id: str) -> pd.DataFrame:
        """Rows of the ``events`` table for this episode (empty frame when no events)."""
        rows = [
            {
                "episode_id": self.episode_id,
                "dataset": self.dataset,
                "model": self.model,
                "model_version": self.model_version,
                "run_id": run_id,
                "event_index": i,
                "start_us": e.start_us,
                "end_us": e.end_us,
                "duration_us": self.duration_us,
                "caption": "",
                "source": "stitch+refine" if (e.start_refined or e.end_refined) else "stitch",
                "n_windows": len(e.windows),
                "windows": ",".join(map(str, e.windows)),
                "profile": self.profile,
                "start_refined": e.start_refined,
                "end_refined": e.end_refined,
            }
            for i, e in enumerate(self.events)
        ]
        df = pd.DataFrame(rows, columns=list(EVENT_DTYPES))
        return df.astype(EVENT_DTYPES)


# --------------------------------------------------------------------------- window outputs


def _kinematic_outputs(
    episode: Episode,
    windows: Sequence[Window],
    pass_name: str,
    cfg: kinematic.KinematicConfig | None,
) -> tuple[list[list[LocalSegment] | None], list[WindowFailure]]:
    kin = kinematic.episode_kinematics(episode)
    outs: list[list[LocalSegment] | None] = []
    fails: list[WindowFailure] = []
    for k, w in enumerate(windows):
        n_frames = int(np.count_nonzero((kin.t_us >= w.start_us) & (kin.t_us < w.end_us)))
        if n_frames == 0:
            fails.append(
                WindowFailure(pass_name, k, w.start_us, w.end_us, "no state frames in window")
            )
            outs.append(None)
            continue
        segs = kinematic.kinematic_window_segments(episode, w, cfg, kin=kin)
        # Same text path as a model: render, then the strict parser.
        parsed = parse_segments(render_segments(segs), w.n_ticks)
        if isinstance(parsed, Rejection):
            fails.append(WindowFailure(pass_name, k, w.start_us, w.end_us, parsed.reason))
            outs.append(None)
        else:
            outs.append(parsed)
    return outs, fails


def _window_images(
    episode: Episode, windows: Sequence[Window]
) -> tuple[list[tuple[list[np.ndarray], list[int]] | None], list[str], tuple[str, ...]]:
    """4 Hz mosaics per window; ``None`` + reason for a window whose frames are missing."""
    from flora.data.mosaic import episode_roles, sample_mosaics

    roles = episode_roles(episode)
    times = [w.frame_times_us() for w in windows]
    out: list[tuple[list[np.ndarray], list[int]] | None] = [None] * len(windows)
    reasons = [""] * len(windows)
    if not roles:
        return out, ["episode has no cameras"] * len(windows), roles
    flat = [t for ts in times for t in ts]
    try:
        mos = sample_mosaics(episode, flat)
        j = 0
        for k, ts in enumerate(times):
            chunk = mos[j : j + len(ts)]
            j += len(ts)
            out[k] = ([m.image for m in chunk], [t - windows[k].start_us for t in ts])
        return out, reasons, roles
    except FloraDataError:
        pass  # some instant has no frame: sample window by window to isolate it
    for k, ts in enumerate(times):
        try:
            mos = sample_mosaics(episode, ts)
        except FloraDataError as e:
            reasons[k] = f"no frames: {e.reason}"
            continue
        if not mos:
            reasons[k] = "no frames: window has no 4 Hz sample"
            continue
        out[k] = ([m.image for m in mos], [t - windows[k].start_us for t in ts])
    return out, reasons, roles


def window_request(
    episode: Episode,
    window: Window,
    index: int,
    pass_name: str,
    images: list[np.ndarray],
    rel_times: list[int],
    roles: Sequence[str],
    max_new_tokens: int,
) -> VLMRequest:
    """The request for window ``index`` of one pass — what the engine sends and what the
    training sets store (:func:`training.sets.segmenter_examples`), so there is one prompt
    path. It carries the grammar's regex for backends that can constrain decoding."""
    w = window
    return VLMRequest(
        prompt=segment_prompt(w, episode.task, roles, len(images)),
        images=images,
        frame_times_us=rel_times,
        system=SYSTEM,
        max_new_tokens=max_new_tokens,
        temperature=0.0,
        request_id=f"{episode.episode_id}:{pass_name}:{index}:{w.start_us}-{w.end_us}",
        guided_regex=segments_regex(w.n_ticks),
    )


def _backend_outputs(
    episode: Episode,
    windows: Sequence[Window],
    pass_name: str,
    backend: VLMBackend,
    *,
    max_attempts: int,
    max_new_tokens: int,
    batch_windows: int,
) -> tuple[list[list[LocalSegment] | None], list[WindowFailure]]:
    outs: list[list[LocalSegment] | None] = [None] * len(windows)
    fails: list[WindowFailure] = []
    for lo in range(0, len(windows), batch_windows):
        chunk = list(range(lo, min(len(windows), lo + batch_windows)))
        imgs, reasons, roles = _window_images(episode, [windows[k] for k in chunk])
        # One generate_parsed call per tick count: the parser needs each window's n_ticks.
        groups: dict[int, list[tuple[int, VLMRequest]]] = {}
        for pos, k in enumerate(chunk):
            w = windows[k]
            if imgs[pos] is None:
                fails.append(WindowFailure(pass_name, k, w.start_us, w.end_us, reasons[pos]))
                continue
            images, rel_times = imgs[pos]  # type: ignore[misc]
            req = window_request(episode, w, k, pass_name, images, rel_times, roles, max_new_tokens)
            groups.setdefault(w.n_ticks, []).append((k, req))
        for n_ticks, items in groups.items():

            def parse(resp: VLMResponse, n: int = n_ticks) -> list[LocalSegment] | Rejection:
                return parse_segments(resp.text, n)

            results = generate_parsed(backend, [r for _, r in items], parse, max_attempts)
            for (k, _), res in zip(items, results, strict=True):
                w = windows[k]
                if res.ok:
                    outs[k] = res.value
                else:
                    rej = res.rejection
                    reason = f"{rej.kind}: {rej.reason}" if rej else "unknown"
                    tries = len(res.attempts)
                    fails.append(
                        WindowFailure(
                            pass_name, k, w.start_us, w.end_us, f"{reason} (after {tries} tries)"
                        )
                    )
    fails.sort(key=lambda f: f.window)
    return outs, fails


# --------------------------------------------------------------------------- one episode


def segment_episode(
    episode: Episode,
    backend: VLMBackend | None = None,
    profile: str = "standard",
    shift: bool = True,
    *,
    max_attempts: int = 3,
    max_new_tokens: int = 384,
    batch_windows: int = 16,
    kinematic_config: kinematic.KinematicConfig | None = None,
) -> EpisodeSegmentation:
    """Segment one episode into events (DESIGN §3.1, §3.7).

    ``backend=None`` uses the kinematic baseline. Windows whose output fails (no frames,
    transport error, or a parse rejected ``max_attempts`` times) are recorded in
    ``failures``; the other windows are stitched. Raises FloraDataError only when the
    episode itself is unusable (e.g. non-positive duration, unusable state for the
    kinematic baseline) or — :class:`RepeatedEventError` — when its events would repeat
    an interval (a guard: stitching collapses repeats), so no such rows are ever written.
    """
    T = int(episode.duration_us)
    if T <= 0:
        raise FloraDataError(
            f"episode duration must be > 0 µs, got {T}",
            dataset=episode.dataset,
            episode=episode.index,
            field="duration_us",
        )
    primary = plan_windows(T, profile)
    shifted = plan_windows(T, profile, shift=True) if shift and len(primary) > 1 else []
    passes = [("primary", primary), ("shifted", shifted)]
    outputs: dict[str, list[list[LocalSegment] | None]] = {}
    failures: list[WindowFailure] = []
    for name, wins in passes:
        if not wins:
            outputs[name] = []
            continue
        if backend is None:
            outs, fails = _kinematic_outputs(episode, wins, name, kinematic_config)
        else:
            outs, fails = _backend_outputs(
                episode,
                wins,
                name,
                backend,
                max_attempts=max_attempts,
                max_new_tokens=max_new_tokens,
                batch_windows=batch_windows,
            )
        outputs[name] = outs
        failures.extend(fails)

    ok_p = [k for k, o in enumerate(outputs["primary"]) if o is not None]
    stitched = stitch_detailed([primary[k] for k in ok_p], [outputs["primary"][k] for k in ok_p], T)
    # Provenance in primary window indices (stitch saw only the succeeded subset).
    members = [tuple(ok_p[i] for i in ev.windows) for ev in stitched]
    ok_s = [k for k, o in enumerate(outputs["shifted"]) if o is not None]
    refined = refine_detailed(
        [ev.to_event() for ev in stitched],
        [shifted[k] for k in ok_s],
        [outputs["shifted"][k] for k in ok_s],  # type: ignore[misc]
        T,
        primary_windows=primary,
    )
    events = [
        SegmentedEvent(r.start_us, r.end_us, members[r.origin], r.start_refined, r.end_refined)
        for r in refined
    ]
    try:
        validate_events([Event(e.start_us, e.end_us) for e in events], T, where=episode.episode_id)
    except ContractError as e:  # would be a bug in stitching: never write such rows
        raise AssertionError(str(e)) from e
    check_unique_intervals(events, episode.episode_id)
    model, version = (
        (kinematic.MODEL_NAME, kinematic.MODEL_VERSION)
        if backend is None
        else model_identity(backend)
    )
    return EpisodeSegmentation(
        episode_id=episode.episode_id,
        dataset=episode.dataset,
        duration_us=T,
        profile=primary[0].profile,
        model=model,
        model_version=version,
        events=events,
        primary_windows=primary,
        shifted_windows=shifted,
        failures=failures,
    )


# --------------------------------------------------------------------------- dataset step


@dataclass
class SegmentRun:
    """Result of ``segment_dataset``: the validated table and what happened."""

    table_dir: Path
    events: pd.DataFrame
    run_id: str
    processed: list[str]
    skipped: list[str]
    failures: list[Failure]
    report: object | None = None  # flora.validation.core.ValidationReport

    def to_dict(self) -> dict:
        """JSON-serialisable summary (what an Airflow task / KFP component hands on)."""
        return {
            "table_dir": str(self.table_dir),
            "run_id": self.run_id,
            "rows": int(len(self.events)),
            "episodes": int(self.events["episode_id"].nunique()) if len(self.events) else 0,
            "processed": list(self.processed),
            "skipped": list(self.skipped),
            "failures": [f.__dict__ for f in self.failures],
            "validation": self.report.to_dict() if hasattr(self.report, "to_dict") else None,
        }


def segment_dataset(
    dataset_path: str | Path,
    out_dir: str | Path,
    backend: VLMBackend | None = None,
    run_id: str | None = None,
    *,
    profile: str = "standard",
    shift: bool = True,
    episodes: Sequence[int] | None = None,
    max_attempts: int = 3,
    max_new_tokens: int = 384,
    overwrite: bool = False,
    progress: bool = True,
    kinematic_config: kinematic.KinematicConfig | None = None,
) -> SegmentRun:
    """Segment every episode of a dataset into ``<out_dir>/events/`` (resumable).

    An episode already written (and without recorded failures) is skipped unless
    ``overwrite``; an episode with failed windows is written with the events of its
    good windows, its failures recorded, and retried by the next run. An episode that
    cannot be read, or whose events would repeat an interval (:class:`RepeatedEventError`),
    is recorded as failed and not written. The whole table is validated
    with the ``events`` suite before it is returned (TableValidationError otherwise).
    ``max_attempts`` and ``max_new_tokens`` bound each window's model calls (see
    :func:`segment_episode`).
    """
    from flora.data.dataset import open_dataset

    ds = open_dataset(dataset_path)
    store = TableStore(out_dir)
    run_id = run_id or f"segment-{uuid.uuid4().hex[:12]}"
    indices = list(ds.episode_indices()) if episodes is None else [int(i) for i in episodes]
    # Ids are known without loading the episodes (reading video metadata is not free).
    index_of = {make_episode_id(ds.name, i): int(i) for i in indices}
    # A rerun with another model (or version) redoes what the earlier one wrote.
    identity = (
        (kinematic.MODEL_NAME, kinematic.MODEL_VERSION)
        if backend is None
        else stored_identity(backend)
    )
    todo, skipped = split_current(store, TABLE, list(index_of), identity, redo=overwrite)

    def step(eid: str) -> tuple[pd.DataFrame, list[Failure], dict[str, int]]:
        seg = segment_episode(
            ds.episode(index_of[eid]),
            backend,
            profile,
            shift,
            max_attempts=max_attempts,
            max_new_tokens=max_new_tokens,
            kinematic_config=kinematic_config,
        )
        failures = [Failure(TABLE, seg.episode_id, f.item, f.reason) for f in seg.failures]
        counts = {"events": len(seg.events), "failed_windows": len(seg.failures)}
        return seg.to_frame(run_id), failures, counts

    processed = run_episodes(store, TABLE, todo, step, desc=f"segment {ds.name}",
                             progress=progress)  # fmt: skip
    df, report = read_validated(store, TABLE, ds.name, EVENT_DTYPES)
    return SegmentRun(
        table_dir=Path(out_dir) / TABLE,
        events=df,
        run_id=run_id,
        processed=processed,
        skipped=skipped,
        failures=store.failures(TABLE),
        report=report,
    )
