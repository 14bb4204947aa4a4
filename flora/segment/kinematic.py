"""Kinematic baseline segmenter: actions from the robot's own proprioception.

No model: an episode's end-effector trajectory and gripper opening are enough to find
where one motion primitive ends and the next begins. The cues (documented in
``docs/segmentation.md``):

* **activity** ``a_t = |Δee_t|·fps / s_ee + |Δgrip_t|·fps / s_grip`` — end-effector speed
  plus gripper rate, each divided by a robust scale of the episode (its 95th percentile
  of nonzero values) so the detector is unit free; lightly smoothed;
* **speed minima**: a local minimum of ``a`` whose value is below ``valley_ratio`` of the
  lower of its two flanking peaks (a prominence test) separates two primitives;
* **pauses**: a run of still frames (``a < idle_frac``) at least ``pause_s`` long, or at
  the start/end of the episode, is not part of any action (idle operator time);
* **gripper transitions**: a chunk dominated by the gripper (its gripper part more than
  ``gripper_dominance`` = 3x its arm part) that *closes* it completes
  the preceding approach (grasp = descend + close); one that *opens* it starts the
  following withdrawal (release = open + lift off);
* chunks shorter than ``min_segment_s`` merge into their neighbour.

The detector runs on any slice of an episode, so it can act as a per-window "model":
:func:`kinematic_window_outputs` segments each window on its own (seeing only that
window's frames), emits ``LocalSegment`` ticks with continuation flags, and the result goes
through the real render → parse → stitch → refine path like a VLM's output.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.signal import find_peaks, peak_prominences

from flora.contract import TICK_US, Event
from flora.data.episode import Episode, FloraDataError
from flora.segment.plan import LocalSegment, Window

MODEL_NAME = "kinematic-baseline"
MODEL_VERSION = "1"


@dataclass(frozen=True)
class KinematicConfig:
    """Thresholds of the kinematic detector (see module doc)."""

    smooth_frames: int = 3
    idle_frac: float = 0.01
    pause_s: float = 0.5
    valley_ratio: float = 0.3
    min_segment_s: float = 0.35
    gripper_dominance: float = 3.0


@dataclass(frozen=True)
class Kinematics:
    """Per-frame signals of one episode (or a slice of it)."""

    t_us: np.ndarray  # (N,) int64 frame times
    end_us: int  # end of the last frame (episode duration for a full episode)
    ee: np.ndarray  # (N, 3)
    grip: np.ndarray  # (N,) gripper opening (zeros when the robot has none)


def _find(names: Sequence[str], *keys: str) -> list[int]:
    low = [n.lower() for n in names]
    return [i for k in keys for i, n in enumerate(low) if k in n]


def episode_kinematics(episode: Episode) -> Kinematics:
    """End-effector position and gripper opening from an Episode's state.

    Columns are found by name (``ee_x/y/z`` or ``*x``/``*y``/``*z`` pose names, any name
    containing ``grip``); without names the first three state dims are the position and
    the last one the gripper. Raises FloraDataError naming the episode when state is
    unusable.
    """
    st = np.asarray(episode.state, dtype=np.float64)
    where = dict(dataset=episode.dataset, episode=episode.index, field="observation.state")
    if st.ndim != 2 or st.shape[0] != len(episode.timestamps_us):
        raise FloraDataError(
            f"state has shape {st.shape}, expected (N={len(episode.timestamps_us)}, D)", **where
        )
    if st.shape[0] < 2 or st.shape[1] < 1:
        raise FloraDataError("state needs at least 2 frames and 1 dimension", **where)
    if not np.isfinite(st).all():
        raise FloraDataError("state contains NaN/inf", **where)
    names = list(episode.state_names)
    pos = [i for i in (_find(names, "ee_x") + _find(names, "ee_y") + _find(names, "ee_z"))]
    grip = _find(names, "grip")
    if len(pos) != 3:
        pos = list(range(min(3, st.shape[1] - 1 if st.shape[1] > 3 else st.shape[1])))
    if not grip:
        grip = [st.shape[1] - 1] if st.shape[1] > 3 else []
    ee = st[:, pos]
    if ee.shape[1] < 3:
        ee = np.pad(ee, ((0, 0), (0, 3 - ee.shape[1])))
    g = st[:, grip[0]] if grip else np.zeros(len(st))
    t = np.asarray(episode.timestamps_us, dtype=np.int64)
    return Kinematics(t, int(episode.duration_us), ee, g)


def _scale(x: np.ndarray) -> float:
    nz = x[x > 1e-9]
    return float(np.percentile(nz, 95)) if nz.size else 1.0


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """Maximal runs ``[a, b)`` where mask is True."""
    if not mask.any():
        return []
    d = np.diff(np.concatenate([[0], mask.astype(np.int8), [0]]))
    return list(zip(np.flatnonzero(d == 1).tolist(), np.flatnonzero(d == -1).tolist(), strict=True))


def detect_chunks(
    k: Kinematics, fps: float, cfg: KinematicConfig | None = None
) -> list[tuple[int, int]]:
    """Action chunks as frame ranges ``[a, b)`` of ``k`` (see module doc for the rules)."""
    cfg = cfg or KinematicConfig()
    n = len(k.t_us)
    if n < 3:
        return []
    dee = np.linalg.norm(np.diff(k.ee, axis=0), axis=1) * fps
    dg = np.abs(np.diff(k.grip)) * fps
    # Motion between frame t-1 and t is attributed to frame t (frame 0 has none).
    dee = np.concatenate([[0.0], dee])
    dg = np.concatenate([[0.0], dg])
    s_ee, s_g = _scale(dee), _scale(dg)
    part_ee, part_g = dee / s_ee, dg / s_g
    act = part_ee + part_g
    if cfg.smooth_frames > 1:
        ker = np.ones(cfg.smooth_frames) / cfg.smooth_frames
        act = np.convolve(act, ker, mode="same")
    still = act < cfg.idle_frac
    pause_frames = max(1, int(round(cfg.pause_s * fps)))

    # Frames belonging to no action: leading/trailing stillness and long pauses.
    idle = np.zeros(n, dtype=bool)
    for a, b in _runs(still):
        if a == 0 or b == n or (b - a) >= pause_frames:
            idle[a:b] = True
    # Speed minima: prominent valleys (a flat still stretch yields its middle frame).
    cuts: set[int] = set()
    valleys, _ = find_peaks(-act)
    if valleys.size:
        prom = peak_prominences(-act, valleys)[0]
        for v, p in zip(valleys.tolist(), prom.tolist(), strict=True):
            if not idle[v] and act[v] <= cfg.valley_ratio * (act[v] + p):
                cuts.add(v)
    chunks: list[tuple[int, int]] = []
    for a, b in _runs(~idle):
        inner = sorted(c for c in cuts if a < c < b)
        edges = [a, *inner, b]
        chunks.extend((x, y) for x, y in zip(edges[:-1], edges[1:], strict=True) if y > x)

    # Gripper-dominated chunks join the approach (closing) or the withdrawal (opening).
    def grip_kind(a: int, b: int) -> int:
        ge, gg = part_ee[a:b].sum(), part_g[a:b].sum()
        # A gripper transition: the gripper part dominates the arm part; a chunk that also
        # holds substantial arm motion (e.g. open + withdraw blurred together) stands alone.
        if gg == 0 or gg <= cfg.gripper_dominance * ge:
            return 0
        return -1 if k.grip[b - 1] < k.grip[a] else 1

    # Classify once on the raw chunks so a merged chunk is never re-merged.
    kinds = [grip_kind(a, b) for a, b in chunks]
    merged: list[list[int]] = []
    pending: tuple[int, int] | None = None  # an opening chunk waiting for its withdrawal
    for (a, b), kind in zip(chunks, kinds, strict=True):
        if pending is not None:
            pa, pb = pending
            pending = None
            if pb == a:
                if kind == 1:  # consecutive openings: keep waiting together
                    pending = (pa, b)
                else:
                    merged.append([pa, b])  # opening starts this withdrawal
                continue
            merged.append([pa, pb])  # nothing adjacent follows: the opening stands alone
        if kind == -1 and merged and merged[-1][1] == a:
            merged[-1][1] = b  # closing completes the preceding approach
        elif kind == 1:
            pending = (a, b)
        else:
            merged.append([a, b])
    if pending is not None:
        merged.append(list(pending))
    # Tiny chunks merge into an adjacent neighbour (the shorter one), else stay.
    min_frames = max(1, int(round(cfg.min_segment_s * fps)))
    changed = True
    while changed:
        changed = False
        for i, (a, b) in enumerate(merged):
            if b - a >= min_frames:
                continue
            left = i > 0 and merged[i - 1][1] == a
            right = i + 1 < len(merged) and merged[i + 1][0] == b
            if not (left or right):
                continue
            if left and (
                not right
                or merged[i - 1][1] - merged[i - 1][0] <= merged[i + 1][1] - merged[i + 1][0]
            ):
                merged[i - 1][1] = b
            else:
                merged[i + 1][0] = a
            merged.pop(i)
            changed = True
            break
    return [(a, b) for a, b in merged]


def _frame_end_us(k: Kinematics, b: int) -> int:
    return int(k.t_us[b]) if b < len(k.t_us) else int(k.end_us)


def kinematic_events(episode: Episode, cfg: KinematicConfig | None = None) -> list[Event]:
    """Events of a whole episode straight from the detector (no windows, no stitching)."""
    k = episode_kinematics(episode)
    chunks = detect_chunks(k, float(episode.fps), cfg)
    out = [Event(int(k.t_us[a]), _frame_end_us(k, b)) for a, b in chunks]
    return [e for e in out if e.start_us < e.end_us]


def kinematic_window_segments(
    episode: Episode,
    window: Window,
    cfg: KinematicConfig | None = None,
    *,
    kin: Kinematics | None = None,
    fps: float | None = None,
) -> list[LocalSegment]:
    """Segment one window seeing only its own frames, as a windowed model would.

    A chunk that starts at the window's first frame while the arm is already moving is
    flagged left-open (unless the window starts the episode); one that runs to the
    window's last frame while still moving is right-open (unless it ends the episode).
    ``kin``/``fps``: signals sampled at another rate than the episode's (e.g. the 4 Hz
    frames a segmenter sees, ``benchmarks/frame_signal.py``) with that rate.
    """
    cfg = cfg or KinematicConfig()
    k = kin or episode_kinematics(episode)
    sel = np.flatnonzero((k.t_us >= window.start_us) & (k.t_us < window.end_us))
    if sel.size < 3:
        return []
    a0, b0 = int(sel[0]), int(sel[-1]) + 1
    sub = Kinematics(k.t_us[a0:b0], _frame_end_us(k, b0), k.ee[a0:b0], k.grip[a0:b0])
    # The slice's first frame has no predecessor inside the window; include the frame
    # before it for the speed of that first frame, as a model sees motion blur/continuity.
    fps = float(fps if fps is not None else episode.fps)
    chunks = detect_chunks(sub, fps, cfg)
    moving_in = a0 > 0 and np.linalg.norm(k.ee[a0] - k.ee[a0 - 1]) * fps > 1e-6
    moving_out = b0 < len(k.t_us) and np.linalg.norm(k.ee[b0] - k.ee[b0 - 1]) * fps > 1e-6
    n = window.n_ticks
    out: set[LocalSegment] = set()
    for a, b in chunks:
        s = int(sub.t_us[a])
        e = _frame_end_us(sub, b)
        u = max(0, (s - window.start_us) // TICK_US)
        v = min(n, -(-(e - window.start_us) // TICK_US))
        if u >= v:
            continue
        left = a == 0 and window.start_us > 0 and bool(moving_in)
        right = b == len(sub.t_us) and window.end_us < k.end_us and bool(moving_out)
        out.add(LocalSegment(0 if left else u, n if right else v, left, right))
    return sorted(out, key=lambda x: (x.u, x.v, x.left_open, x.right_open))


def kinematic_window_outputs(
    episode: Episode, windows: Sequence[Window], cfg: KinematicConfig | None = None
) -> list[list[LocalSegment]]:
    """:func:`kinematic_window_segments` for every window of a pass."""
    kin = episode_kinematics(episode)
    return [kinematic_window_segments(episode, w, cfg, kin=kin) for w in windows]
