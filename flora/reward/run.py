"""Rewarder step functions: one per table (``outcome``, ``dense_labels``, ``rubric``).

Each step reads episodes from a dataset, builds the mode's requests, asks any
``VLMBackend`` through ``flora.parsing.generate_parsed`` (bounded retries), turns accepted
answers into rows with the common columns, validates each episode's rows with the table's
Great Expectations suite and writes them with ``flora.tables.TableStore``. A rejected
item (an episode, or one dense window) is recorded as a failure with its reason and the
rest completes; nothing is filled in. A rerun skips episodes already written without
failures by the same model and model_version (and, in rubric mode, with the same rubric)
and redoes the others; a redone episode that yields no rows loses its earlier part.

Inputs per mode (see ``docs/reward.md``):

- outcome: up to ``max_frames`` instants spread over the episode, one mosaic each.
- dense: per window the 64 instants at 4 Hz, one mosaic each; instants at or after T repeat
  the last real instant's mosaic. ``frame_times_us`` are the nominal grid relative to
  the window's start (0, 0.25, …, 15.75 s; the prompt states the start), as the segmenter's
  windows are: group g's frames then carry the same stamps in every window, so which
  frames a group line describes never depends on where the window lies in the episode.
- rubric: the same instants for every camera, each camera its own clip; the request's
  ``images`` are clip 1's frames then clip 2's, … and the prompt names each clip's range.

Request ids are ``"<episode_id>|<mode>|<item>"`` (item ``episode`` or ``w<k>``).
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from flora.backends.base import VLMBackend, VLMRequest
from flora.data.episode import Episode, FloraDataError, make_episode_id
from flora.parsing import Attempted, Rejection, generate_parsed
from flora.reward import prompts
from flora.reward.dense import (
    DenseOutput,
    DenseWindow,
    dense_regex,
    group_times,
    parse_dense,
    plan_windows,
    stitch_outputs,
    stitch_sources,
)
from flora.reward.outcome import OutcomeScore, outcome_regex, parse_outcome_response
from flora.reward.rubric import Rubric, load_rubric, parse_rubric, rubric_regex, score
from flora.steps_common import model_identity, rows_match, stored_identity
from flora.tables import Failure, TableStore

Mode = Literal["outcome", "dense", "rubric"]
TABLES: dict[str, str] = {"outcome": "outcome", "dense": "dense_labels", "rubric": "rubric"}
RubricSource = Rubric | Mapping[str, Any] | str | Path | Callable[[Episode], Rubric | None]


@dataclass
class StepResult:
    """What one step run did: episodes written/skipped, failures, final table validation."""

    table: str
    root: Path
    run_id: str
    written: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    rows: int = 0
    validation: Any = None  # flora.validation.core.ValidationReport of the whole table

    @property
    def ok(self) -> bool:
        """True when nothing failed and the whole table passed its suite."""
        return not self.failures and (self.validation is None or self.validation.success)

    def summary(self) -> dict[str, Any]:
        """Counts for logs and MLflow."""
        return {
            "table": self.table,
            "written": len(self.written),
            "skipped": len(self.skipped),
            "failures": len(self.failures),
            "rows": self.rows,
            "valid": None if self.validation is None else bool(self.validation.success),
        }


# --------------------------------------------------------------------------- frames


def episode_times(duration_us: int, max_frames: int = 32, fps: float = 4.0) -> list[int]:
    """Instants for whole-episode modes: at most ``fps`` per second and ``max_frames``.

    ``n = clamp(ceil(T * fps), 1, max_frames)`` instants at ``floor(i * T / n)``, all < T.
    """
    if duration_us <= 0:
        raise ValueError(f"duration_us={duration_us} must be positive")
    n = max(1, min(int(max_frames), math.ceil(duration_us * fps / 1_000_000)))
    return [(i * int(duration_us)) // n for i in range(n)]


def _mosaics(episode: Episode, times_us: Sequence[int]) -> tuple[list[np.ndarray], list[str]]:
    from flora.data.mosaic import sample_mosaics

    ms = sample_mosaics(episode, list(times_us), clamp_end=True)
    roles = list(ms[0].roles) if ms else []
    return [m.image for m in ms], roles


def _camera_clips(episode: Episode, times_us: Sequence[int]) -> list[tuple[str, list[np.ndarray]]]:
    """One clip per camera (main first, then wrist, then others by key)."""
    from flora.data.frames import sample_frames
    from flora.data.mosaic import MOSAIC_ROLES

    order = {r: i for i, r in enumerate(MOSAIC_ROLES)}
    cams = sorted(episode.cameras.values(), key=lambda c: (order.get(c.role, 99), c.key))
    if not cams:
        raise FloraDataError("episode has no cameras", dataset=episode.dataset,
                             episode=episode.index, field="cameras")  # fmt: skip
    clips = []
    for c in cams:
        frames = sample_frames(c, list(times_us), clamp_end=True, dataset=episode.dataset,
                               episode=episode.index)  # fmt: skip
        clips.append((c.role or c.key, [f.image for f in frames if f is not None]))
    return clips


# --------------------------------------------------------------------------- requests


def request_id(episode: Episode, mode: str, item: str = "episode") -> str:
    """``<episode_id>|<mode>|<item>``: carried through backends into failure reports."""
    return f"{episode.episode_id}|{mode}|{item}"


OUTCOME_MAX_NEW_TOKENS = 8
DENSE_MAX_NEW_TOKENS = 768  # worst line + 32 group lines with short reasons
RUBRIC_MAX_NEW_TOKENS = 1024  # room to think first


def outcome_request(
    episode: Episode,
    max_frames: int = 32,
    top_logprobs: int = 20,
    max_new_tokens: int = OUTCOME_MAX_NEW_TOKENS,
) -> VLMRequest:
    """Outcome request: mosaics over the episode, score logprobs requested."""
    times = episode_times(episode.duration_us, max_frames)
    images, roles = _mosaics(episode, times)
    return VLMRequest(
        prompt=prompts.outcome_prompt(episode.task, roles, times),
        images=images,
        frame_times_us=times,
        system=prompts.SYSTEM,
        max_new_tokens=max_new_tokens,
        top_logprobs=top_logprobs,
        request_id=request_id(episode, "outcome"),
        guided_regex=outcome_regex(),  # used where the backend can constrain
    )


def dense_requests(
    episode: Episode,
    windows: Sequence[DenseWindow],
    max_new_tokens: int = DENSE_MAX_NEW_TOKENS,
) -> list[VLMRequest]:
    """One request per dense window; instants past T repeat the last real instant."""
    T = episode.duration_us
    reqs = []
    for w in windows:
        nominal = w.frame_times_us()
        real = [t for t in nominal if t < T]
        images, roles = _mosaics(episode, real)
        images = images + [images[-1]] * (len(nominal) - len(real))
        reqs.append(
            VLMRequest(
                prompt=prompts.dense_prompt(episode.task, roles, w, T),
                images=images,
                frame_times_us=[t - w.start_us for t in nominal],
                system=prompts.SYSTEM,
                max_new_tokens=max_new_tokens,
                request_id=request_id(episode, "dense", f"w{w.index}"),
                guided_regex=dense_regex(),
            )
        )
    return reqs


def rubric_request(
    episode: Episode,
    rubric: Rubric,
    max_frames: int = 16,
    max_new_tokens: int = RUBRIC_MAX_NEW_TOKENS,
) -> VLMRequest:
    """Rubric request: each camera as its own clip, concatenated in ``images``."""
    times = episode_times(episode.duration_us, max_frames)
    clips = _camera_clips(episode, times)
    images: list[np.ndarray] = []
    ranges = []
    for role, frames in clips:
        ranges.append((role, len(images) + 1, len(images) + len(frames)))
        images.extend(frames)
    return VLMRequest(
        prompt=prompts.rubric_prompt(episode.task, rubric, ranges, times),
        images=images,
        # Several clips are not one video: no timestamps, so backends pass stamped images.
        frame_times_us=None,
        system=prompts.SYSTEM,
        max_new_tokens=max_new_tokens,
        request_id=request_id(episode, "rubric"),
        guided_regex=rubric_regex(rubric),
    )


# --------------------------------------------------------------------------- helpers


def _open(dataset: Any):
    if hasattr(dataset, "episode") and hasattr(dataset, "episode_indices"):
        return dataset
    from flora.data import open_dataset

    return open_dataset(dataset)


def _store(out: str | Path | TableStore) -> TableStore:
    return out if isinstance(out, TableStore) else TableStore(out)


def _common(episode: Episode, backend: VLMBackend, run_id: str) -> dict[str, Any]:
    model, version = model_identity(backend)
    return {
        "episode_id": episode.episode_id,
        "dataset": episode.dataset,
        "model": model,
        "model_version": version,
        "run_id": run_id,
    }


def rubric_json(rubric: Rubric) -> str:
    """The ``rubric_json`` column of a rubric row: the rubric, canonical JSON."""
    return json.dumps(rubric.model_dump(mode="json"), sort_keys=True)


def _reason(a: Attempted) -> str:
    rej = a.rejection or Rejection("unknown")
    last = (rej.text or "").strip()
    # !r writes a newline as \n once; escaping it first showed "\\n" in every report.
    tail = f"; last output: {last[:160]!r}" if last else ""
    return f"{rej.kind}: {rej.reason} (after {len(a.attempts)} attempts){tail}"


#: ``current(index, episode_id)``: whether the episode's stored rows are what this run
#: would write (same model, model_version and, in rubric mode, rubric).
Current = Callable[[int, str], bool]


def _pending(
    store: TableStore,
    table: str,
    ds: Any,
    episodes: Iterable[int] | None,
    resume: bool,
    current: Current | None = None,
) -> tuple[list[int], list[str]]:
    """Episode indices still to do, and the episode ids skipped as already done.

    With ``resume`` an episode is skipped only when it was written without failures *and*
    ``current`` says its rows came from this run's model (and rubric); otherwise redone.
    """
    idx = [int(i) for i in (episodes if episodes is not None else ds.episode_indices())]
    ids = [make_episode_id(ds.name, i) for i in idx]
    todo_ids, skipped = store.split_pending(table, ids, redo=not resume)
    if current is not None and skipped:
        index_of = dict(zip(ids, idx, strict=True))
        stale = {eid for eid in dict.fromkeys(skipped) if not current(index_of[eid], eid)}
        skipped = [eid for eid in skipped if eid not in stale]
        todo_ids = [*todo_ids, *stale]
    pending = set(todo_ids)
    return [i for i, eid in zip(idx, ids, strict=True) if eid in pending], skipped


def _start(
    table: str,
    dataset: Any,
    out: str | Path | TableStore,
    run_id: str | None,
    episodes: Iterable[int] | None,
    resume: bool,
    backend: VLMBackend,
    rubric_of: Callable[[Any, int], Rubric | None] | None = None,
) -> tuple[Any, TableStore, StepResult, list[int]]:
    """Open dataset and store, start the step's result; ``(ds, store, result, todo)``.

    Resume skips an episode only when its stored rows carry this backend's model and
    model_version and, in rubric mode (``rubric_of(ds, index)`` gives the episode's
    rubric), this rubric's ``rubric_json``.
    """
    ds, store = _open(dataset), _store(out)
    res = StepResult(table, store.root, _run_id(run_id))
    known: list[tuple[str, str]] = []  # resolved on the first resume check only

    def current(i: int, eid: str) -> bool:
        if not known:
            known.append(stored_identity(backend))
        identity = known[0]
        if rubric_of is None:
            return rows_match(store, table, eid, identity)
        rub = rubric_of(ds, i)
        return rub is not None and rows_match(
            store, table, eid, identity, {"rubric_json": rubric_json(rub)}
        )

    todo, res.skipped = _pending(store, table, ds, episodes, resume, current)
    return ds, store, res, todo


def _batches(items: Sequence[Any], size: int) -> list[Sequence[Any]]:
    """``items`` in consecutive slices of ``size`` (bounded memory per model call)."""
    return [items[c : c + size] for c in range(0, len(items), max(1, size))]


def _build_batch(
    ds: Any,
    table: str,
    indices: Sequence[int],
    build: Callable[[Episode], Any],
    store: TableStore,
    res: StepResult,
    bar: Any,
) -> list[tuple[Episode, Any]]:
    """Load and build each episode of a batch; one that fails is recorded and left out."""
    batch = []
    for i in indices:
        ep, built, err = _load_and_build(ds, table, i, build)
        if err is not None:
            _finish_episode(store, table, err.episode_id, [], [err], res)
            bar.update(1)
        else:
            batch.append((ep, built))
    return batch


def _finish_answer(
    store: TableStore,
    table: str,
    ep: Episode,
    a: Attempted,
    row: Callable[[Any], dict[str, Any]],
    res: StepResult,
    bar: Any,
) -> None:
    """One row from an accepted whole-episode answer, or the rejection as the failure."""
    rows = [row(a.value)] if a.ok else []
    fails = [] if a.ok else [Failure(table, ep.episode_id, "episode", _reason(a))]
    _finish_episode(store, table, ep.episode_id, rows, fails, res)
    bar.update(1)


def _finish_episode(
    store: TableStore,
    table: str,
    episode_id: str,
    rows: list[dict[str, Any]],
    failures: list[Failure],
    res: StepResult,
) -> None:
    """Validate one episode's rows, write them (or record why not), record failures.

    The episode is being redone: when no new part is written (every item failed, or the
    rows failed the table's suite) its previous part is removed, so a table never keeps an
    earlier run's rows beside this run's failure records for the same items.
    """
    from flora.validation.core import validate_table

    written = False
    if rows:
        df = pd.DataFrame(rows)
        report = validate_table(table, df)
        if report.success:
            store.write(table, episode_id, df)
            written = True
            res.written.append(episode_id)
            res.rows += len(df)
        else:
            failures = [*failures, Failure(table, episode_id, "table",
                                           f"validation: {report.summary()}")]  # fmt: skip
    if not written:
        store.drop(table, episode_id)  # pending until the failures below are recorded
    store.record_failures(table, episode_id, failures)
    res.failures.extend(failures)


def _final_validation(store: TableStore, table: str, res: StepResult) -> StepResult:
    from flora.validation.core import validate_table

    df = store.read(table)
    if len(df):
        res.validation = validate_table(table, df)
    return res


def _run_id(run_id: str | None) -> str:
    return run_id or uuid.uuid4().hex[:12]


# --------------------------------------------------------------------------- steps


def outcome_dataset(
    dataset: Any,
    backend: VLMBackend,
    out: str | Path | TableStore,
    *,
    run_id: str | None = None,
    episodes: Iterable[int] | None = None,
    max_attempts: int = 3,
    max_frames: int = 32,
    top_logprobs: int = 20,
    max_new_tokens: int = OUTCOME_MAX_NEW_TOKENS,
    batch_episodes: int = 8,
    resume: bool = True,
    progress: bool = True,
) -> StepResult:
    """Outcome step: table ``outcome`` (score_probs[5], expected_score, reward, argmax)."""
    ds, store, res, todo = _start("outcome", dataset, out, run_id, episodes, resume, backend)
    bar = tqdm(total=len(todo), desc="reward outcome", unit="ep", disable=not progress)
    for indices in _batches(todo, batch_episodes):
        chunk = _build_batch(ds, "outcome", indices, lambda e: outcome_request(
            e, max_frames, top_logprobs, max_new_tokens), store, res, bar)  # fmt: skip
        answers = generate_parsed(backend, [r for _, r in chunk], parse_outcome_response,
                                  max_attempts)  # fmt: skip
        for (ep, _), a in zip(chunk, answers, strict=True):

            def row(o: OutcomeScore, ep=ep, a=a) -> dict[str, Any]:
                return {
                    **_common(ep, backend, res.run_id),
                    "task": ep.task,
                    "score_probs": list(o.score_probs),
                    "expected_score": o.expected_score,
                    "reward": o.reward,
                    "argmax_score": o.argmax_score,
                    "answer_score": o.answer_score,
                    "missing_scores": list(o.missing_scores),
                    "attempts": len(a.attempts) + 1,
                }

            _finish_answer(store, "outcome", ep, a, row, res, bar)
    bar.close()
    return _final_validation(store, "outcome", res)


def dense_dataset(
    dataset: Any,
    backend: VLMBackend,
    out: str | Path | TableStore,
    *,
    run_id: str | None = None,
    episodes: Iterable[int] | None = None,
    max_attempts: int = 3,
    max_new_tokens: int = DENSE_MAX_NEW_TOKENS,
    batch_windows: int = 8,
    resume: bool = True,
    progress: bool = True,
) -> StepResult:
    """Dense step: table ``dense_labels`` (t_us, label, reason, source_window, source_group).

    One row per 0.5 s group start of the episode, stitched by eq. (22) over all windows.
    Windows are sent ``batch_windows`` at a time (bounded memory for long episodes). A
    window rejected after its retries is recorded as a failure; the times whose eq. (22)
    source is that window get no row (they are not re-sourced from a neighbour).
    """
    ds, store, res, todo = _start("dense_labels", dataset, out, run_id, episodes, resume,
                                  backend)  # fmt: skip
    for i in tqdm(todo, desc="reward dense", unit="ep", disable=not progress):
        ep, windows, err = _load_and_build(
            ds, "dense_labels", i, lambda e: plan_windows(e.duration_us)
        )
        answers: list[Attempted] = []
        for chunk in _batches(windows or [], batch_windows):
            reqs, err = _try(
                "dense_labels", ep.episode_id,
                lambda ep=ep, chunk=chunk: dense_requests(ep, chunk, max_new_tokens),
            )  # fmt: skip
            if err is not None:
                break
            answers += generate_parsed(backend, reqs, lambda r: parse_dense(r.text), max_attempts)
        if err is not None:
            _finish_episode(store, "dense_labels", err.episode_id, [], [err], res)
            continue
        times = group_times(ep.duration_us)
        fails = [
            Failure("dense_labels", ep.episode_id,
                    f"window {w.index} [{w.start_us}, {w.end_us}) us", _reason(a))
            for w, a in zip(windows, answers, strict=True) if not a.ok
        ]  # fmt: skip
        rows: list[dict[str, Any]] = []
        if len(fails) < len(windows):
            # Stitch with placeholders for failed windows, then drop the rows they source.
            outs = [a.value if a.ok else DenseOutput(3, (3,) * 32, ("",) * 32) for a in answers]
            ok = [a.ok for a in answers]
            src = stitch_sources(windows, times)
            common = _common(ep, backend, res.run_id)
            for r, (p, _g) in zip(stitch_outputs(windows, outs, times), src, strict=True):
                if ok[p]:
                    rows.append({**common, "t_us": r.t_us, "label": r.label, "reason": r.reason,
                                 "source_window": r.source_window,
                                 "source_group": r.source_group})  # fmt: skip
        _finish_episode(store, "dense_labels", ep.episode_id, rows, fails, res)
    return _final_validation(store, "dense_labels", res)


def _rubric_for(source: RubricSource) -> Callable[[Episode], Rubric | None]:
    if callable(source) and not isinstance(source, Rubric):
        return source  # type: ignore[return-value]
    rub = source if isinstance(source, Rubric) else load_rubric(source)  # type: ignore[arg-type]
    return lambda _e: rub


def rubric_dataset(
    dataset: Any,
    backend: VLMBackend,
    out: str | Path | TableStore,
    rubric: RubricSource,
    *,
    run_id: str | None = None,
    episodes: Iterable[int] | None = None,
    max_attempts: int = 3,
    max_frames: int = 16,
    max_new_tokens: int = RUBRIC_MAX_NEW_TOKENS,
    batch_episodes: int = 8,
    resume: bool = True,
    progress: bool = True,
) -> StepResult:
    """Rubric step: table ``rubric`` (task, rubric_json, step_names, step_scores, total).

    ``rubric`` is one rubric (object, dict or YAML/JSON path) for every episode, or a
    function episode -> Rubric (None: no rubric for that episode, recorded as a failure).
    """
    pick = _rubric_for(rubric)
    per_episode = callable(rubric) and not isinstance(rubric, Rubric)

    def rubric_of(ds: Any, i: int) -> Rubric | None:
        if not per_episode:
            return pick(None)  # type: ignore[arg-type]  # one rubric, no episode needed
        try:
            return pick(ds.episode(int(i)))
        except (FloraDataError, ValueError, OSError):
            return None  # redo it: the step records why

    ds, store, res, todo = _start("rubric", dataset, out, run_id, episodes, resume, backend,
                                  rubric_of)  # fmt: skip

    def build(e: Episode) -> tuple[Rubric, VLMRequest]:
        r = pick(e)
        if r is None:
            raise FloraDataError("no rubric for this episode's task", dataset=e.dataset,
                                 episode=e.index, field="task")  # fmt: skip
        return r, rubric_request(e, r, max_frames, max_new_tokens)

    bar = tqdm(total=len(todo), desc="reward rubric", unit="ep", disable=not progress)
    for indices in _batches(todo, batch_episodes):
        chunk = [(ep, rb, req) for ep, (rb, req) in
                 _build_batch(ds, "rubric", indices, build, store, res, bar)]  # fmt: skip
        # generate_parsed parses a response without its request, so requests sharing a
        # rubric go in one call each (usually one per task family).
        answers: list[Attempted] = [None] * len(chunk)  # type: ignore[list-item]
        for rb in {id(rb): rb for _, rb, _ in chunk}.values():
            idx = [j for j, (_, r, _) in enumerate(chunk) if r is rb]
            got_rb = generate_parsed(backend, [chunk[j][2] for j in idx],
                                     lambda resp, rb=rb: parse_rubric(rb, resp.text),
                                     max_attempts)  # fmt: skip
            for j, a in zip(idx, got_rb, strict=True):
                answers[j] = a
        for (ep, rb, _), a in zip(chunk, answers, strict=True):

            def row(scores: dict[str, float], ep=ep, rb=rb, a=a) -> dict[str, Any]:
                return {
                    **_common(ep, backend, res.run_id),
                    "task": rb.task,
                    "rubric_json": rubric_json(rb),
                    "step_names": list(scores),
                    "step_scores": [float(v) for v in scores.values()],
                    "total": score(rb, scores),
                    "attempts": len(a.attempts) + 1,
                }

            _finish_answer(store, "rubric", ep, a, row, res, bar)
    bar.close()
    return _final_validation(store, "rubric", res)


def _try(table: str, episode_id: str, fn: Callable[[], Any]) -> tuple[Any, Failure | None]:
    """Run ``fn``; bad input (unreadable video, out of range, …) becomes an episode failure."""
    try:
        return fn(), None
    except (FloraDataError, ValueError, OSError) as e:
        return None, Failure(table, episode_id, "episode", f"input: {e}")


def _load_and_build(ds: Any, table: str, i: int, build: Callable[[Episode], Any]):
    """Load episode ``i`` and build its request(s): ``(episode, built, failure | None)``."""
    eid = make_episode_id(ds.name, i)
    got, err = _try(table, eid, lambda: (ep := ds.episode(int(i)), build(ep)))
    return (None, None, err) if err is not None else (got[0], got[1], None)


def reward_dataset(mode: Mode, dataset: Any, backend: VLMBackend, out: Any, **kw) -> StepResult:
    """Dispatch to ``outcome_dataset`` / ``dense_dataset`` / ``rubric_dataset`` by mode."""
    if mode == "outcome":
        return outcome_dataset(dataset, backend, out, **kw)
    if mode == "dense":
        return dense_dataset(dataset, backend, out, **kw)
    if mode == "rubric":
        return rubric_dataset(dataset, backend, out, **kw)
    raise ValueError(f"unknown reward mode {mode!r} (outcome, dense, rubric)")
