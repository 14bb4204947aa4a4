"""SFT and GRPO sets from the toy world's ground truth (or a curated mixture), as Parquet.

Every example is built with the *inference* step's own request builder and its output
grammar's renderer, so training sees exactly the prompts the engine sends (no second
prompt path, DESIGN §3.4):

- segmenter: every window of the standard and long-horizon profiles, primary and shifted
  passes (:func:`flora.segment.plan_windows`), 4 Hz mosaics, ``segment_prompt``; target =
  :func:`flora.segment.targets.window_targets` rendered by ``render_segments``.
- captioner: :func:`flora.caption.run.build_caption_requests` with
  ``neighbour_captions=False`` (ground-truth captions never reach a prompt, DESIGN §3.2);
  target = ``render_caption`` of the event's ground-truth caption.
- rewarder: ``outcome_request`` / ``dense_requests`` / ``rubric_request`` of
  :mod:`flora.reward.run`; targets by ``render_outcome`` / ``render_dense`` /
  ``render_rubric`` (rubric targets think first). The three kinds are co-trained as
  built: no reweighting, no oversampling.

Splits are by episode: ``sha256(episode_id)`` mapped to [0, 1) against the held-out
fraction (or the mixture's own ``split`` column, which must be constant per episode);
never by window, so no held-out episode reaches training through an overlapping window.

A set is a directory: ``examples.parquet`` (one row per example, :data:`COLUMNS`),
``failures.parquet`` (items that could not be built, with reasons) and ``manifest.json``
(counts, source, DVC md5, MLflow run). It passes the ``training_set`` GX suite before
it is written, is written to a temporary folder renamed into place, and is logged as
MLflow datasets (one input per split).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from flora.backends.base import VLMRequest
from flora.contract import Event
from flora.data.episode import Episode, FloraDataError
from flora.parsing import Rejection
from flora.tables import Failure
from flora.validation.core import checks_hold, columns_exist, not_null, register_suite

ModelName = Literal["segmenter", "captioner", "rewarder"]
TASK_KINDS: dict[str, tuple[str, ...]] = {
    "segmenter": ("segment",),
    "captioner": ("caption",),
    "rewarder": ("outcome", "dense", "rubric"),
}
GRPO_MODELS = ("segmenter", "captioner")
SPLITS = ("train", "heldout")
TABLE = "training_set"
EXAMPLES_FILE = "examples.parquet"
FAILURES_FILE = "failures.parquet"
MANIFEST_FILE = "manifest.json"
SET_FORMAT = "flora-training-set/1"
#: ``kind`` in a set folder's owner marker (:mod:`flora.safety`): only such a folder (or a
#: set written before the marker, its manifest naming :data:`SET_FORMAT`) is replaced.
SET_KIND = "training set"
#: Examples per Parquet row group of a set's examples file.
SET_ROW_GROUP = 64
COLUMNS: tuple[str, ...] = (
    "example_id",
    "model",
    "task_kind",
    "purpose",  # sft | grpo
    "dataset",
    "episode_id",
    "split",
    "request_id",
    "system",
    "prompt",
    "images",  # list of PNG bytes, prompt order
    "frame_times_us",  # list[int] or None (rubric clips carry no timestamps)
    "max_new_tokens",
    "temperature",
    "top_logprobs",
    "target",
    "reference",  # JSON: what evaluation / the GRPO reward needs
    "weight",
    "guided_regex",  # the grammar regex the request carries (None: unconstrained)
)
#: Columns a set written before they existed may lack; read as ``None``.
OPTIONAL_COLUMNS: tuple[str, ...] = ("guided_regex",)
MIXTURE_COLUMNS = ("episode_id", "start_us", "end_us", "caption", "weight", "split")
_HELDOUT_ALIASES = {"heldout", "held_out", "val", "validation", "test", "eval"}
#: The splits of a mixture written by ``flora curate`` (flora.curate.rules.SPLITS): what a
#: row is *for*, not train vs held-out. The captioner's targets are the ``pretrain`` rows
#: (accepted captions); every row of an episode gives the segmenter its events and the
#: prompts their context; the rewarder reads every episode of the mixture.
CURATED_SPLITS = ("pretrain", "policy", "failures")
CAPTION_SPLIT = "pretrain"
#: Why a captioner event is kept out of a GRPO set.
NO_REQUIREMENTS = "no reference requirements (r_cap needs them)"


class SetError(ValueError):
    """A set that cannot be built or read (bad arguments, empty, malformed file)."""


# --------------------------------------------------------------------------- examples


@dataclass
class Example:
    """One row of a set; :meth:`to_request` is the request every trainer and evaluator uses."""

    example_id: str
    model: str
    task_kind: str
    purpose: str
    dataset: str
    episode_id: str
    split: str
    request_id: str
    system: str | None
    prompt: str
    images: list[bytes]
    frame_times_us: list[int] | None
    max_new_tokens: int
    temperature: float
    top_logprobs: int
    target: str
    reference: str = "{}"
    weight: float = 1.0
    guided_regex: str | None = None
    _decoded: list[np.ndarray] | None = field(default=None, repr=False, compare=False)

    def image_arrays(self) -> list[np.ndarray]:
        """The frames as uint8 HWC RGB arrays (decoded once)."""
        if self._decoded is None:
            self._decoded = [decode_png(b) for b in self.images]
        return self._decoded

    def to_request(self, keep_frames: bool = True) -> VLMRequest:
        """The exact ``VLMRequest`` the inference step sends for this item.

        ``keep_frames=False``: the decoded frames are not kept on the example (a caller
        that builds each request once per use, over a large set).
        """
        frames = self.image_arrays() if keep_frames or self._decoded is not None else [
            decode_png(b) for b in self.images]  # fmt: skip
        return VLMRequest(
            prompt=self.prompt,
            images=list(frames),
            frame_times_us=list(self.frame_times_us) if self.frame_times_us is not None else None,
            system=self.system,
            max_new_tokens=int(self.max_new_tokens),
            temperature=float(self.temperature),
            top_logprobs=int(self.top_logprobs),
            request_id=self.request_id,
            guided_regex=self.guided_regex or None,
        )

    def reference_obj(self) -> dict[str, Any]:
        """The parsed ``reference`` JSON."""
        return json.loads(self.reference)


def encode_png(img: np.ndarray) -> bytes:
    """Lossless PNG bytes of one uint8 HWC RGB frame."""
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.asarray(img, dtype=np.uint8), mode="RGB").save(
        buf, format="PNG", compress_level=1
    )
    return buf.getvalue()


def decode_png(data: bytes) -> np.ndarray:
    """Inverse of :func:`encode_png`."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as im:
        return np.asarray(im.convert("RGB"), dtype=np.uint8).copy()


def split_of(episode_id: str, heldout_fraction: float) -> str:
    """``"heldout"`` or ``"train"`` from a deterministic hash of ``episode_id`` only."""
    if not 0.0 <= heldout_fraction < 1.0:
        raise SetError(f"split_fraction must be in [0, 1), got {heldout_fraction}")
    h = int.from_bytes(hashlib.sha256(episode_id.encode()).digest()[:8], "big") / 2**64
    return "heldout" if h < heldout_fraction else "train"


def _example(
    *,
    model: str,
    kind: str,
    purpose: str,
    episode: Episode,
    split: str,
    req: VLMRequest,
    target: str,
    reference: dict[str, Any],
    weight: float = 1.0,
) -> Example:
    return Example(
        example_id=f"{model}:{purpose}:{req.request_id}",
        model=model,
        task_kind=kind,
        purpose=purpose,
        dataset=episode.dataset,
        episode_id=episode.episode_id,
        split=split,
        request_id=req.request_id,
        system=req.system,
        prompt=req.prompt,
        images=[encode_png(i) for i in req.images],
        frame_times_us=[int(t) for t in req.frame_times_us]
        if req.frame_times_us is not None
        else None,
        max_new_tokens=int(req.max_new_tokens),
        temperature=float(req.temperature),
        top_logprobs=int(req.top_logprobs),
        target=target,
        reference=json.dumps(reference, sort_keys=True),
        weight=float(weight),
        guided_regex=req.guided_regex,
    )


# --------------------------------------------------------------------------- sources


@dataclass
class EpisodeSource:
    """What the builders need about one episode: events (with captions) and its split.

    ``targets``: the ``(start_us, end_us)`` of the events the captioner builds examples for
    (``None``: every event); the other events are still its prompts' context.
    """

    index: int
    episode_id: str
    split: str
    events: list[Any]  # GTEvent or MixtureEvent (start_us, end_us, caption, requirements)
    weight: float = 1.0
    targets: set[tuple[int, int]] | None = None


@dataclass
class MixtureEvent:
    """An event of a mixture row; ``requirements`` and ``success`` come from the ground-truth
    event with the same interval (none when the dataset has no ground truth or no such event:
    the fleet's case)."""

    start_us: int
    end_us: int
    caption: str
    requirements: list[Any] = field(default_factory=list)
    success: bool = True


def is_curated(mix: pd.DataFrame) -> bool:
    """True for a mixture written by ``flora curate`` (splits pretrain / policy / failures),
    False for one whose ``split`` says train / held-out."""
    vals = {str(v).strip().lower() for v in mix["split"]}
    return bool(vals) and vals <= set(CURATED_SPLITS)


def read_mixture(path: str | Path) -> pd.DataFrame:
    """Read and check a mixture: one written by ``flora curate`` (its curated splits kept as
    they are, :func:`is_curated`) or one whose ``split`` is train / held-out (normalised;
    an episode in two splits is a clear error). A missing column is a clear error."""
    p = Path(path)
    if not p.is_file():
        raise SetError(f"mixture {p} does not exist")
    df = pd.read_parquet(p)
    missing = [c for c in MIXTURE_COLUMNS if c not in df.columns]
    if missing:
        raise SetError(f"mixture {p}: missing column(s) {missing}")
    df = df.copy()
    if is_curated(df):
        df["split"] = [str(v).strip().lower() for v in df["split"]]
        return df
    df["split"] = [_norm_split(s, p) for s in df["split"]]
    both = df.groupby("episode_id")["split"].nunique()
    if (both > 1).any():
        bad = sorted(both[both > 1].index)[:5]
        raise SetError(f"mixture {p}: episode(s) {bad} appear in two splits (field split)")
    return df


def _norm_split(s: Any, where: Path) -> str:
    v = str(s).strip().lower()
    if v == "train":
        return "train"
    if v in _HELDOUT_ALIASES:
        return "heldout"
    raise SetError(
        f"mixture {where}: split {s!r} is not train/heldout, nor are all splits those of a "
        f"curated mixture {list(CURATED_SPLITS)} (field split)"
    )


def episode_sources(
    dataset_path: str | Path,
    split_fraction: float,
    *,
    mixture: str | Path | None = None,
    max_episodes: int | None = None,
    model: str | None = None,
) -> tuple[Any, Any, list[EpisodeSource]]:
    """(dataset, ground truth, sources) — from ground truth, or the mixture's episodes/events.

    A curated mixture (``flora curate``, :func:`is_curated`): train / held-out by
    ``split_of(episode_id, split_fraction)`` (DESIGN §3.5); an episode's events are its
    rows of every split (one per interval), and the captioner's targets its
    :data:`CAPTION_SPLIT` rows (``model``; an episode without one is left out). Ground truth
    is optional with a mixture (``None`` when the dataset has none); each event takes its
    reference requirements and success from the ground-truth event with the same interval.
    """
    from flora.data.dataset import open_dataset
    from flora.data.episode import make_episode_id
    from flora.data.ground_truth import load_ground_truth

    ds = open_dataset(dataset_path)
    try:
        gt = load_ground_truth(dataset_path)
    except FloraDataError:
        if mixture is None or model == "rewarder":
            raise
        gt = None  # a fleet's mixture: no ground truth behind it
    indices = gt.episode_indices() if gt is not None else ds.episode_indices()
    by_id = {make_episode_id(ds.name, i): i for i in indices}
    sources: list[EpisodeSource] = []
    if mixture is not None:
        mix = read_mixture(mixture)
        curated = is_curated(mix)
        for eid, g in mix.groupby("episode_id", sort=True):
            if eid not in by_id:
                raise SetError(
                    f"mixture {mixture}: episode {eid!r} is not in dataset {ds.name} "
                    "(field episode_id)"
                )
            g = g.sort_values(["start_us", "end_us"], kind="stable")
            truth = (
                {(int(e.start_us), int(e.end_us)): e for e in gt.events(by_id[eid])}
                if gt is not None
                else {}
            )
            evs: list[MixtureEvent] = []
            seen: set[tuple[int, int]] = set()
            for r in g.itertuples(index=False):
                key = (int(r.start_us), int(r.end_us))
                if key in seen:  # a curated item is a row of each split it belongs to
                    continue
                seen.add(key)
                t = truth.get(key)
                evs.append(
                    MixtureEvent(
                        *key,
                        str(r.caption) if r.caption is not None else "",
                        list(t.requirements) if t is not None else [],
                        bool(t.success) if t is not None else True,
                    )
                )
            if not curated:
                sources.append(
                    EpisodeSource(
                        by_id[eid], eid, str(g["split"].iloc[0]), evs, float(g["weight"].sum())
                    )
                )
                continue
            targets = None
            rows = g
            if model == "captioner":
                rows = g[g["split"] == CAPTION_SPLIT]
                if not len(rows):
                    continue  # no accepted caption in this episode
                targets = set(zip(rows.start_us.tolist(), rows.end_us.tolist(), strict=True))
            w = float(rows.drop_duplicates(["start_us", "end_us"])["weight"].sum())
            sources.append(
                EpisodeSource(
                    by_id[eid], eid, split_of(eid, split_fraction), evs, w, targets=targets
                )
            )
    else:
        for eid, i in sorted(by_id.items(), key=lambda kv: kv[1]):
            sources.append(EpisodeSource(i, eid, split_of(eid, split_fraction), gt.events(i)))
    if max_episodes is not None:
        sources = sources[:max_episodes]
    return ds, gt, sources


# --------------------------------------------------------------------------- builders


def _clipped_windows(episode: Episode, n: int) -> list[tuple[str, bool, list[Any]]]:
    """``n`` standard-profile windows clipped at random ends, as ``(profile, shift,
    [(index, window)])`` passes: each the last window the engine would plan for this
    episode cut at a random 250 ms tick in [2 s, T) (its index is that window's index in
    its pass). Seeded by the episode id, so a rebuild is identical and independent of the
    other episodes."""
    from flora.segment.plan import plan_windows

    step = 250_000  # one 4 Hz mosaic frame: clip where a frame falls
    top = (episode.duration_us - 1) // step
    if top < 8:
        return []
    seed = int.from_bytes(hashlib.sha256(f"clip:{episode.episode_id}".encode()).digest()[:8])
    rng = np.random.default_rng(seed)
    got: list[tuple[str, bool, list[Any]]] = []
    for _ in range(n):
        end = int(rng.integers(8, top + 1)) * step
        shift = bool(rng.integers(2))
        w = plan_windows(end, "standard", shift)[-1]
        got.append(("standard", shift, [(w.index, w)]))
    return got


def segmenter_examples(
    episode: Episode,
    src: EpisodeSource,
    *,
    purpose: str = "sft",
    profiles: Sequence[str] = ("standard", "long_horizon"),
    shifted: bool = True,
    clipped: int = 0,
    max_new_tokens: int = 384,
) -> tuple[list[Example], list[Failure]]:
    """One example per distinct window (profiles x passes) of one episode.

    ``clipped`` > 0 adds, for a training-split episode, up to that many standard-profile
    windows clipped at a random end (a draw repeating a window already there is kept once):
    the last window of the episode cut at a random 250 ms tick (>= 2 s), primary or shifted
    pass at random, seeded by the episode id. The engine's last window of every episode is
    clipped at the episode's end, and a world's episode lengths give only a few clip
    lengths to learn the stated end from (docs/training.md, "Clipped windows"). Held-out
    episodes keep exactly the engine's windows.
    """
    from flora.segment.grammar import render_segments
    from flora.segment.plan import plan_windows
    from flora.segment.run import _window_images, window_item, window_request
    from flora.segment.targets import window_targets

    out: list[Example] = []
    fails: list[Failure] = []
    seen: set[tuple[int, int]] = set()
    passes: list[tuple[str, bool, list[Any]]] = []
    for profile in profiles:
        for shift in (False, True) if shifted else (False,):
            windows = plan_windows(episode.duration_us, profile=profile, shift=shift)
            passes.append((profile, shift, list(enumerate(windows))))
    if clipped > 0 and src.split == "train":
        passes.extend(_clipped_windows(episode, clipped))
    for profile, shift, indexed in passes:
        pass_name = f"{profile}:{'shifted' if shift else 'primary'}"
        windows = [w for _, w in indexed]
        imgs, reasons, roles = _window_images(episode, windows)
        for j, (k, w) in enumerate(indexed):
            key = (w.start_us, w.end_us)
            if key in seen:  # a short episode's single window repeats in every pass
                continue
            seen.add(key)
            if imgs[j] is None:
                item = window_item(pass_name, k, w.start_us, w.end_us)
                fails.append(Failure(TABLE, episode.episode_id, item, reasons[j]))
                continue
            images, rel_times = imgs[j]  # type: ignore[misc]
            req = window_request(episode, w, k, pass_name, images, rel_times, roles, max_new_tokens)
            segs = window_targets(src.events, w)
            ref = {
                "n_ticks": w.n_ticks,
                "segments": [[s.u, s.v, int(s.left_open), int(s.right_open)] for s in segs],
                "window": [w.start_us, w.end_us, w.core_start_us, w.core_end_us],
                "profile": profile,
                "pass": "shifted" if shift else "primary",
                "duration_us": episode.duration_us,
            }
            out.append(
                _example(
                    model="segmenter",
                    kind="segment",
                    purpose=purpose,
                    episode=episode,
                    split=src.split,
                    req=req,
                    target=render_segments(segs),
                    reference=ref,
                    weight=src.weight,
                )
            )
    return out, fails


def captioner_examples(
    episode: Episode, src: EpisodeSource, *, purpose: str = "sft"
) -> tuple[list[Example], list[Failure]]:
    """One example per event (per target event of ``src.targets``); prompts never carry any
    caption (neighbour_captions=False). A GRPO example needs the event's reference
    requirements (its reward r_cap does): an event without them is a failed item
    (:data:`NO_REQUIREMENTS`), never a prompt whose every answer scores 0."""
    from flora.caption.grammar import render_caption
    from flora.caption.run import CaptionConfig, build_caption_requests

    evs = [Event(int(e.start_us), int(e.end_us), str(e.caption)) for e in src.events]
    # Only boundaries go in: the captions stay here, as targets and references.
    bare = [Event(e.start_us, e.end_us, "") for e in evs]
    built = build_caption_requests(episode, bare, config=CaptionConfig(neighbour_captions=False))
    out: list[Example] = []
    fails = list(built.failures)
    for req, meta in zip(built.requests, built.meta, strict=True):
        k = meta["k"]
        ev = src.events[k]
        if src.targets is not None and (int(ev.start_us), int(ev.end_us)) not in src.targets:
            continue  # context only (another split of a curated mixture)
        if purpose == "grpo" and not list(getattr(ev, "requirements", None) or []):
            fails.append(Failure(TABLE, episode.episode_id, f"event {k}", NO_REQUIREMENTS))
            continue
        try:
            target = render_caption(ev.caption)
        except ValueError as e:
            fails.append(Failure(TABLE, episode.episode_id, f"event {k}", str(e)))
            continue
        ref = {
            "caption": str(ev.caption),
            "start_us": int(ev.start_us),
            "end_us": int(ev.end_us),
            "requirements": [
                {"family": q.family, "text": q.text, "mass": q.mass}
                for q in getattr(ev, "requirements", [])
            ],
            "success": bool(getattr(ev, "success", True)),
            "event_index": int(k),
        }
        out.append(
            _example(
                model="captioner",
                kind="caption",
                purpose=purpose,
                episode=episode,
                split=src.split,
                req=req,
                target=target,
                reference=ref,
                weight=src.weight,
            )
        )
    return out, fails


def _rubric_thinking(rubric: Any, scores: dict[str, float]) -> str:
    """A short, truthful justification derived from the per-step ground truth."""
    parts = []
    for s in rubric.steps:
        v = float(scores[s.name])
        top = max(s.allowed)
        state = "done" if abs(v - top) < 1e-9 else ("partly done" if v > 0 else "not done")
        parts.append(f"{s.name}: {state}")
    return "; ".join(parts) + "."


def rewarder_examples(
    episode: Episode,
    src: EpisodeSource,
    gt: Any,
    *,
    outcome_frames: int = 32,
    rubric_frames: int = 16,
    rubric_thinking: bool = True,
) -> tuple[list[Example], list[Failure]]:
    """Outcome, dense (one per window) and rubric examples of one episode, unweighted."""
    from flora.reward.dense import plan_windows, render_dense, window_targets
    from flora.reward.outcome import render_outcome
    from flora.reward.rubric import Rubric, render_rubric
    from flora.reward.run import dense_requests, outcome_request, rubric_request

    eid = episode.episode_id
    out: list[Example] = []
    fails: list[Failure] = []

    def add(kind: str, req: VLMRequest, target: str, ref: dict[str, Any]) -> None:
        out.append(
            _example(
                model="rewarder",
                kind=kind,
                purpose="sft",
                episode=episode,
                split=src.split,
                req=req,
                target=target,
                reference=ref,
                weight=src.weight,
            )
        )

    def attempt(item: str, fn: Callable[[], None]) -> None:
        try:
            fn()
        except (FloraDataError, ValueError, KeyError) as e:
            fails.append(Failure(TABLE, eid, item, f"{type(e).__name__}: {e}"))

    def outcome() -> None:
        s = gt.outcome(src.index)
        add("outcome", outcome_request(episode, outcome_frames), render_outcome(s), {"score": s})

    def dense() -> None:
        windows = plan_windows(episode.duration_us)
        truth = gt.dense(src.index)
        reqs = dense_requests(episode, windows)
        for w, req in zip(windows, reqs, strict=True):
            labels, reasons = window_targets(w, episode.duration_us, truth)
            ref = {
                "window": w.index,
                "start_us": w.start_us,
                "groups": list(w.groups),
                "labels": labels,
                "reasons": reasons,
            }
            add("dense", req, render_dense(labels, reasons), ref)

    def rubric() -> None:
        rub_json, scores = gt.rubric(src.index)
        rub = Rubric.model_validate(rub_json)
        think = _rubric_thinking(rub, scores) if rubric_thinking else None
        ref = {"rubric": rub.model_dump(mode="json"), "scores": scores}
        add(
            "rubric",
            rubric_request(episode, rub, rubric_frames),
            render_rubric(rub, scores, think),
            ref,
        )

    attempt("outcome", outcome)
    attempt("dense", dense)
    attempt("rubric", rubric)
    return out, fails


# --------------------------------------------------------------------------- suite


def target_problem(model: str, kind: str, target: str, reference: str) -> str | None:
    """Why ``target`` does not round-trip through its strict parser (None when it does)."""
    from flora.caption.grammar import parse_caption
    from flora.reward.dense import parse_dense
    from flora.reward.outcome import parse_outcome
    from flora.reward.rubric import Rubric, parse_rubric
    from flora.segment.grammar import parse_segments

    try:
        ref = json.loads(reference)
    except (TypeError, ValueError) as e:
        return f"reference is not JSON: {e}"
    if kind not in TASK_KINDS.get(model, ()):
        return f"task kind {kind!r} does not belong to model {model!r}"
    try:
        if kind == "segment":
            got = parse_segments(target, int(ref["n_ticks"]))
            if isinstance(got, Rejection):
                return got.reason
            if [[s.u, s.v, int(s.left_open), int(s.right_open)] for s in got] != ref["segments"]:
                return "parsed segments differ from the reference"
        elif kind == "caption":
            got = parse_caption(target)
            if isinstance(got, Rejection):
                return got.reason
        elif kind == "outcome":
            got = parse_outcome(target)
            if isinstance(got, Rejection):
                return got.reason
            if got != ref["score"]:
                return f"parsed score {got} != reference {ref['score']}"
        elif kind == "dense":
            got = parse_dense(target)
            if isinstance(got, Rejection):
                return got.reason
            if list(got.labels) != list(ref["labels"]):
                return "parsed dense labels differ from the reference"
        elif kind == "rubric":
            got = parse_rubric(Rubric.model_validate(ref["rubric"]), target)
            if isinstance(got, Rejection):
                return got.reason
            if any(abs(got[k] - float(v)) > 1e-6 for k, v in ref["scores"].items()):
                return "parsed rubric scores differ from the reference"
    except (KeyError, TypeError, ValueError) as e:
        return f"reference lacks what the parser needs: {e}"
    return None


def _derive(df: pd.DataFrame) -> pd.DataFrame:
    out = df.copy()
    n = len(df)
    if {"model", "task_kind", "target", "reference", "purpose"} <= set(df.columns):
        out["_chk_target_parses"] = [
            p == "grpo" or target_problem(m, k, t, r) is None
            for m, k, t, r, p in zip(
                df.model, df.task_kind, df.target, df.reference, df.purpose, strict=True
            )
        ]
    else:
        out["_chk_target_parses"] = [False] * n
    if {"episode_id", "split"} <= set(df.columns):
        per = df.groupby("episode_id")["split"].nunique()
        out["_chk_one_split_per_episode"] = [bool(per[e] == 1) for e in df["episode_id"]]
    else:
        out["_chk_one_split_per_episode"] = [False] * n
    if {"images", "frame_times_us"} <= set(df.columns):
        out["_chk_frames"] = [
            len(im) > 0 and (ft is None or len(ft) == len(im))
            for im, ft in zip(df.images, df.frame_times_us, strict=True)
        ]
    else:
        out["_chk_frames"] = [False] * n
    return out


@register_suite(
    TABLE,
    derive=_derive,
    index_columns=("episode_id", "example_id"),
    description="SFT/GRPO training set, one row per example",
)
def _training_set(gxe):
    """Training examples: ids unique, one split per episode, targets round-trip, frames set."""
    return [
        *columns_exist(gxe, *COLUMNS),
        *not_null(
            gxe,
            "example_id",
            "model",
            "task_kind",
            "episode_id",
            "split",
            "prompt",
            "target",
            "reference",
        ),
        gxe.ExpectColumnValuesToBeUnique(column="example_id"),
        gxe.ExpectColumnValuesToBeInSet(column="split", value_set=list(SPLITS)),
        gxe.ExpectColumnValuesToBeInSet(column="model", value_set=list(TASK_KINDS)),
        gxe.ExpectColumnValuesToBeInSet(column="purpose", value_set=["sft", "grpo"]),
        gxe.ExpectColumnValuesToBeBetween(column="max_new_tokens", min_value=1),
        *checks_hold(gxe, "_chk_target_parses", "_chk_one_split_per_episode", "_chk_frames"),
    ]


# --------------------------------------------------------------------------- writing


def examples_frame(examples: Sequence[Example]) -> pd.DataFrame:
    """A DataFrame with :data:`COLUMNS` (one row per example)."""
    rows = [{c: getattr(e, c) for c in COLUMNS} for e in examples]
    df = pd.DataFrame(rows, columns=list(COLUMNS))
    return df.astype({"max_new_tokens": "int64", "top_logprobs": "int64"})


def dataset_md5(dataset_path: str | Path) -> str:
    """The DVC md5 of the dataset when ``datasets.dvc`` tracks it, else a content hash."""
    root = Path(dataset_path).resolve()
    for parent in [root.parent, *root.parents]:
        dvc = parent / f"{root.name}.dvc"
        if dvc.is_file():
            import yaml

            outs = (yaml.safe_load(dvc.read_text()) or {}).get("outs") or [{}]
            if outs[0].get("md5"):
                return str(outs[0]["md5"])
    h = hashlib.md5()  # noqa: S324 - a content fingerprint, not security
    for p in sorted(q for q in root.rglob("*") if q.is_file()):
        h.update(p.relative_to(root).as_posix().encode())
        h.update(str(p.stat().st_size).encode())
        if p.suffix in (".json", ".parquet"):
            h.update(p.read_bytes())
    return h.hexdigest()


def check_set_out(out: str | Path) -> bool:
    """True when ``out`` holds an earlier set (replaced by the next build); False when free.

    Anything else there — a dataset, an unrelated folder, a file — raises
    :class:`flora.safety.OutputDirError` naming it: a set build never deletes data Flora
    did not write.
    """
    from flora.safety import ensure_own_output_dir

    p = Path(out)
    if p.is_dir() and not p.is_symlink() and (p / MANIFEST_FILE).is_file():
        try:  # a set written before the owner marker existed
            if json.loads((p / MANIFEST_FILE).read_text()).get("format") == SET_FORMAT:
                return True
        except (OSError, ValueError, AttributeError):
            pass
    return ensure_own_output_dir(p, SET_KIND, hint="delete it yourself if it is disposable")


def _write(
    out: str | Path,
    examples: list[Example],
    failures: list[Failure],
    manifest: dict[str, Any],
) -> Path:
    from flora.safety import claim_output_dir, clear_output_path
    from flora.validation.core import TableValidationError, validate_table

    if not examples:
        reasons = "; ".join(f"{f.episode_id} {f.item}: {f.reason}" for f in failures[:5])
        raise SetError(
            f"no examples built for {manifest['model']} ({len(failures)} failures"
            + (f": {reasons}" if reasons else "")
            + ")"
        )
    df = examples_frame(examples)
    report = validate_table(TABLE, df, dataset=manifest.get("dataset"))
    if not report.success:
        raise TableValidationError(report)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    claim_output_dir(tmp, SET_KIND)
    # Small row groups: readers stream a set a few examples at a time (load_set) instead
    # of decoding one whole column of images, which is most of the file.
    df.to_parquet(tmp / EXAMPLES_FILE, index=False, row_group_size=SET_ROW_GROUP)
    pd.DataFrame(
        [
            {"table": f.table, "episode_id": f.episode_id, "item": f.item, "reason": f.reason}
            for f in failures
        ],
        columns=["table", "episode_id", "item", "reason"],
    ).to_parquet(tmp / FAILURES_FILE, index=False)
    manifest = {
        **manifest,
        "format": SET_FORMAT,
        "examples": len(df),
        "failures": len(failures),
        "splits": {s: int((df.split == s).sum()) for s in SPLITS},
        "task_kinds": {k: int(v) for k, v in df.task_kind.value_counts().sort_index().items()},
        "episodes": {s: sorted(df.episode_id[df.split == s].unique()) for s in SPLITS},
        "sha256": hashlib.sha256((tmp / EXAMPLES_FILE).read_bytes()).hexdigest(),
    }
    (tmp / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    if check_set_out(out):  # again right before replacing: only an earlier set goes
        clear_output_path(out)
    elif out.is_dir():
        out.rmdir()  # empty
    tmp.rename(out)
    return out


def log_set(path: str | Path, *, run_name: str | None = None) -> str:
    """Log a written set to MLflow (experiment ``flora-train-<model>``); returns the run id.

    One ``mlflow.data`` pandas dataset per split, logged as run inputs with the split as
    context; the frame bytes are left out of the logged frame (only counted), the set's
    sha256 and DVC md5 are tags.
    """
    import mlflow

    from flora.tracking import mlflow_run

    path = Path(path)
    man = read_manifest(path)
    df = pd.read_parquet(path / EXAMPLES_FILE)
    light = df.drop(columns=["images"]).assign(
        n_images=[len(x) for x in df["images"]],
        frame_times_us=[
            json.dumps(None if x is None else [int(t) for t in x]) for x in df["frame_times_us"]
        ],
    )
    tags = {
        "flora.set.sha256": man["sha256"],
        "flora.data.md5": man.get("dataset_md5", ""),
        "flora.set.purpose": man["purpose"],
        "flora.model": man["model"],
    }
    name = run_name or f"set-{man['purpose']}-{man['model']}"
    with mlflow_run(name, tags, experiment=f"flora-train-{man['model']}") as run:
        mlflow.log_params({f"set.{k}": v for k, v in man["params"].items()})
        mlflow.log_metrics(
            {
                "set.examples": man["examples"],
                "set.failures": man["failures"],
                **{f"set.{s}": n for s, n in man["splits"].items()},
            }
        )
        for split in SPLITS:
            part = light[light.split == split].reset_index(drop=True)
            if part.empty:
                continue
            ds = mlflow.data.from_pandas(
                part,
                source=str(path / EXAMPLES_FILE),
                name=f"{man['model']}-{split}",
                targets="target",
            )
            mlflow.log_input(ds, context=split)
        mlflow.log_artifact(str(path / MANIFEST_FILE))
        run_id = run.info.run_id
    man["mlflow_run_id"] = run_id
    (path / MANIFEST_FILE).write_text(json.dumps(man, indent=2, sort_keys=True) + "\n")
    return run_id


def _build(
    model: str,
    purpose: str,
    dataset_path: str | Path,
    out: str | Path,
    *,
    split_fraction: float,
    mixture: str | Path | None,
    max_episodes: int | None,
    per_episode: Callable[[Episode, EpisodeSource, Any], tuple[list[Example], list[Failure]]],
    params: dict[str, Any],
    log_mlflow: bool,
    progress: bool,
) -> Path:
    if model not in TASK_KINDS:
        raise SetError(f"unknown model {model!r}; expected one of {list(TASK_KINDS)}")
    check_set_out(out)  # refuse a user's folder before any work
    ds, gt, sources = episode_sources(
        dataset_path, split_fraction, mixture=mixture, max_episodes=max_episodes, model=model
    )
    examples: list[Example] = []
    failures: list[Failure] = []
    for src in tqdm(sources, desc=f"{purpose} set {model}", unit="ep", disable=not progress):
        try:
            ep = ds.episode(src.index)
            got, bad = per_episode(ep, src, gt)
        except FloraDataError as e:
            failures.append(Failure(TABLE, src.episode_id, "episode", str(e)))
            continue
        examples.extend(got)
        failures.extend(bad)
    manifest = {
        "model": model,
        "purpose": purpose,
        "dataset": ds.name,
        "dataset_path": str(Path(dataset_path).resolve()),
        "dataset_md5": dataset_md5(dataset_path),
        "mixture": str(mixture) if mixture else None,
        "params": {"split_fraction": split_fraction, "max_episodes": max_episodes, **params},
    }
    path = _write(out, examples, failures, manifest)
    if log_mlflow:
        log_set(path)
    return path


def build_sft_set(
    model: ModelName,
    dataset_path: str | Path,
    out: str | Path,
    *,
    split_fraction: float = 0.2,
    mixture: str | Path | None = None,
    max_episodes: int | None = None,
    profiles: Sequence[str] = ("standard", "long_horizon"),
    shifted: bool = True,
    clipped: int = 0,
    outcome_frames: int = 32,
    rubric_frames: int = 16,
    rubric_thinking: bool = True,
    log_mlflow: bool = False,
    progress: bool = True,
) -> Path:
    """Build ``model``'s SFT set from ``dataset_path`` (toy world with ground truth).

    ``mixture``: a curated mixture parquet (episode_id, start_us, end_us, caption, weight,
    split) whose events, captions and splits replace the ground truth's for the segmenter
    and captioner (the rewarder keeps the ground-truth labels of the mixture's episodes).
    Returns the set directory ``out``; raises :class:`SetError` when nothing can be built.
    """
    if model == "segmenter":

        def per(ep: Episode, src: EpisodeSource, gt: Any):
            return segmenter_examples(ep, src, profiles=profiles, shifted=shifted, clipped=clipped)
    elif model == "captioner":

        def per(ep: Episode, src: EpisodeSource, gt: Any):
            return captioner_examples(ep, src)
    elif model == "rewarder":

        def per(ep: Episode, src: EpisodeSource, gt: Any):
            return rewarder_examples(
                ep,
                src,
                gt,
                outcome_frames=outcome_frames,
                rubric_frames=rubric_frames,
                rubric_thinking=rubric_thinking,
            )
    else:
        raise SetError(f"unknown model {model!r}; expected one of {list(TASK_KINDS)}")
    params = {
        "profiles": ",".join(profiles),
        "shifted": shifted,
        "clipped": clipped,
        "outcome_frames": outcome_frames,
        "rubric_frames": rubric_frames,
        "rubric_thinking": rubric_thinking,
    }
    return _build(
        model,
        "sft",
        dataset_path,
        out,
        split_fraction=split_fraction,
        mixture=mixture,
        max_episodes=max_episodes,
        per_episode=per,
        params=params,
        log_mlflow=log_mlflow,
        progress=progress,
    )


def build_grpo_set(
    model: Literal["segmenter", "captioner"],
    dataset_path: str | Path,
    out: str | Path,
    *,
    split_fraction: float = 0.2,
    mixture: str | Path | None = None,
    max_episodes: int | None = None,
    profiles: Sequence[str] = ("standard", "long_horizon"),
    shifted: bool = True,
    log_mlflow: bool = False,
    progress: bool = True,
) -> Path:
    """GRPO prompt set: the same requests, each with what its reward needs in ``reference``.

    Segmenter: ``n_ticks`` and the window's reference ``segments`` ``[u, v, l, r]`` (for
    ``r_seg``). Captioner: the reference ``requirements`` (family, text, mass), the
    caption and success (for ``r_cap``'s judge) — never in the prompt. ``target`` holds the
    rendered reference for logging. No RL for the rewarder.
    """
    if model == "segmenter":

        def per(ep: Episode, src: EpisodeSource, gt: Any):
            return segmenter_examples(ep, src, purpose="grpo", profiles=profiles, shifted=shifted)
    elif model == "captioner":

        def per(ep: Episode, src: EpisodeSource, gt: Any):
            return captioner_examples(ep, src, purpose="grpo")
    else:
        raise SetError(f"GRPO sets exist for {list(GRPO_MODELS)}, not {model!r} (no RL for it)")
    params = {"profiles": ",".join(profiles), "shifted": shifted}
    return _build(
        model,
        "grpo",
        dataset_path,
        out,
        split_fraction=split_fraction,
        mixture=mixture,
        max_episodes=max_episodes,
        per_episode=per,
        params=params,
        log_mlflow=log_mlflow,
        progress=progress,
    )


# --------------------------------------------------------------------------- reading


def _set_file(path: str | Path) -> Path:
    p = Path(path)
    f = p / EXAMPLES_FILE if p.is_dir() else p
    if not f.is_file():
        raise SetError(f"training set {p} not found (no {EXAMPLES_FILE})")
    return f


def read_manifest(path: str | Path) -> dict[str, Any]:
    """The set's ``manifest.json`` (``{}`` for a bare examples parquet)."""
    p = Path(path)
    m = (p if p.is_dir() else p.parent) / MANIFEST_FILE
    return json.loads(m.read_text()) if m.is_file() else {}


def load_set(
    path: str | Path, *, split: str | None = None, kinds: Iterable[str] | None = None
) -> list[Example]:
    """Examples of a set (optionally one split / some task kinds), in file order.

    Streamed in record batches, filtered as they come: memory holds the examples returned
    (their PNG bytes) and one batch, not the whole file as a table beside them — a
    240-episode segmenter set is 1.5 GB of images, most of them the other split's.
    A missing column or a file that is not a set is a :class:`SetError` naming it.
    """
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    if split is not None and split not in SPLITS:
        raise SetError(f"split must be one of {SPLITS}, got {split!r}")
    f = _set_file(path)
    try:
        # No pre-buffering: it would read every row group's bytes ahead of the batches.
        pf = pq.ParquetFile(f, pre_buffer=False)
    except Exception as e:  # noqa: BLE001 - any unreadable file is a bad set
        raise SetError(f"{f}: not a readable Parquet set: {e}") from e
    names = set(pf.schema_arrow.names)
    missing = [c for c in COLUMNS if c not in names and c not in OPTIONAL_COLUMNS]
    if missing:
        raise SetError(f"{f}: not a training set, missing column(s) {missing}")
    wanted = list(kinds) if kinds is not None else None
    # Arrow's allocator keeps freed batches for reuse; handed back every few batches, the
    # process does not grow by the file's size.
    pool = pa.default_memory_pool()
    out = []
    try:
        batches = pf.iter_batches(
            batch_size=SET_ROW_GROUP, columns=[c for c in COLUMNS if c in names]
        )
        for i, batch in enumerate(batches):
            if i % 8 == 7:
                pool.release_unused()
            keep = None
            if split is not None:
                keep = pc.equal(batch.column("split"), split)
            if wanted is not None:
                k = pc.is_in(batch.column("task_kind"), value_set=pa.array(wanted, pa.string()))
                keep = k if keep is None else pc.and_(keep, k)
            if keep is not None:
                batch = batch.filter(keep)
            for d in batch.to_pylist():
                for c in OPTIONAL_COLUMNS:
                    d.setdefault(c, None)
                ft = d["frame_times_us"]
                d["frame_times_us"] = None if ft is None else [int(t) for t in ft]
                d["images"] = [bytes(b) for b in d["images"]]
                out.append(Example(**d))
    except (OSError, ValueError) as e:  # a truncated or corrupt file, found mid-read
        raise SetError(f"{f}: not a readable Parquet set: {e}") from e
    del batches, pf  # their buffers go back before the pool is trimmed
    pool.release_unused()
    return out


def set_failures(path: str | Path) -> pd.DataFrame:
    """Items the builder could not turn into examples, with reasons."""
    f = _set_file(path).parent / FAILURES_FILE
    return pd.read_parquet(f) if f.is_file() else pd.DataFrame()


__all__ = [
    "COLUMNS",
    "SET_KIND",
    "SPLITS",
    "TASK_KINDS",
    "Example",
    "SetError",
    "build_grpo_set",
    "build_sft_set",
    "check_set_out",
    "decode_png",
    "encode_png",
    "load_set",
    "log_set",
    "read_manifest",
    "read_mixture",
    "set_failures",
    "split_of",
    "target_problem",
]
