"""Prompts for the one rewarder's three modes (outcome, dense, rubric).

One model, switched by the prompt (seed §4). Outcome and dense see one mosaic per sampled
instant (cameras tiled by ``flora.data.mosaic``); rubric sees each camera as its own clip:
the request's ``images`` hold clip 1's frames, then clip 2's, … and the prompt names each
clip's camera role, image range and time span (``frame_times_us`` is None: several clips are
not one video, so backends pass them as individual images). Outcome and dense
answer directly; rubric may think first.
"""

from __future__ import annotations

from collections.abc import Sequence

from flora.contract import us_to_s
from flora.reward.dense import DENSE_FRAMES, DENSE_GROUPS, DenseWindow
from flora.reward.rubric import Rubric, format_score

SYSTEM = (
    "You are Flora-Rewarder, a critic of robot manipulation videos. Judge only what the "
    "frames show. Follow the requested answer format exactly."
)


def _cameras(roles: Sequence[str]) -> str:
    if len(roles) <= 1:
        return f"Each image is one frame from the {roles[0] if roles else 'main'} camera."
    tiles = ", ".join(f"{r} (tile {i + 1} from the left)" for i, r in enumerate(roles))
    return f"Each image is a mosaic of the cameras at one instant: {tiles}."


def outcome_prompt(task: str, roles: Sequence[str], times_us: Sequence[int]) -> str:
    """Outcome mode: whole-episode frames, answer ``score: K``."""
    span = f"{us_to_s(times_us[0]):.2f} s to {us_to_s(times_us[-1]):.2f} s" if times_us else ""
    return (
        f"Task given to the robot: {task!r}.\n"
        f"{_cameras(roles)} {len(times_us)} frames, in time order, from {span}.\n"
        "Rate how completely the robot achieved the task on a 1 to 5 scale "
        "(1 = not achieved at all, 3 = partially achieved, 5 = fully achieved).\n"
        "Answer with exactly one line: score: K"
    )


def dense_prompt(task: str, roles: Sequence[str], window: DenseWindow, duration_us: int) -> str:
    """Dense mode: one 16 s window, 64 frames at 4 Hz, 32 groups of 0.5 s."""
    real = sum(1 for t in window.frame_times_us() if t < duration_us)
    tail = (
        ""
        if real == DENSE_FRAMES
        else f" The video ends after frame {real}; later frames repeat the last one."
    )
    return (
        f"Task given to the robot: {task!r}.\n"
        f"{_cameras(roles)} This window starts at {us_to_s(window.start_us):.1f} s and holds "
        f"{DENSE_FRAMES} frames at 4 Hz; consecutive pairs form {DENSE_GROUPS} groups of 0.5 s "
        f"(group g = frames 2g-1 and 2g).{tail}\n"
        "Label every group: 1 failure, 2 suboptimal, 3 normal. Label with hindsight: use what "
        "happens later in the window.\n"
        "Answer format: first line 'worst: W' (the lowest label), then one line per group "
        "'g: L' for g = 1..32; a group labelled 1 or 2 adds ' | reason'."
    )


def rubric_prompt(
    task: str,
    rubric: Rubric,
    clips: Sequence[tuple[str, int, int]],
    times_us: Sequence[int] = (),
) -> str:
    """Rubric mode. ``clips`` = ``(camera role, first image number, last image number)``;
    every clip samples the same instants ``times_us``."""
    clip_lines = "\n".join(
        f"- clip {i + 1}: {role} camera, images {a} to {b}" for i, (role, a, b) in enumerate(clips)
    )
    if times_us:
        clip_lines += (
            f"\nEach clip shows the same {len(times_us)} instants, from "
            f"{us_to_s(times_us[0]):.2f} s to {us_to_s(times_us[-1]):.2f} s."
        )
    step_lines = "\n".join(
        f"- {s.name}: {s.description or s.name} "
        f"(allowed scores: {', '.join(format_score(v) for v in s.allowed)})"
        for s in rubric.steps
    )
    return (
        f"Task given to the robot: {task!r}.\n"
        f"The images are {len(clips)} separate camera clips of the same episode:\n{clip_lines}\n"
        f"Score each step of this rubric with one of its allowed scores:\n{step_lines}\n"
        "You may think first inside <think>...</think>. Then answer with one line per step: "
        "'<step name>: <score>'."
    )
