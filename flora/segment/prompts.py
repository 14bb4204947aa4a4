"""Segmenter prompt (seed §2, eq. 12): one request per window, answer in the tick grammar.

The prompt states the window's clock (20 Hz ticks from the window start, the frame →
tick mapping at 4 Hz), the camera layout of the mosaic, and the output grammar of
``docs/grammars.md``. It deliberately does not mention the core: which segments are kept
is deterministic post-processing, so the model describes everything it sees.
"""

from __future__ import annotations

from collections.abc import Sequence

from flora.contract import TICK_US
from flora.segment.plan import Window

SYSTEM = (
    "You are Flora-Segmenter. You watch a short clip of a robot episode and list the "
    "robot's actions with exact local timestamps."
)

_CAMERA_TEXT = {
    "main": "the main (scene) camera",
    "wrist": "the wrist camera",
}


def camera_text(roles: Sequence[str]) -> str:
    """How the prompt names the tiles of the mosaic, left to right."""
    if not roles:
        return "a single camera"
    if len(roles) == 1:
        return f"one view: {_CAMERA_TEXT.get(roles[0], roles[0] + ' camera')}"
    parts = [_CAMERA_TEXT.get(r, f"the {r} camera") for r in roles]
    return "tiles side by side, left to right: " + ", ".join(parts)


def segment_prompt(window: Window, task: str, roles: Sequence[str], n_frames: int) -> str:
    """The user prompt for one window (the images are its 4 Hz frames, in order)."""
    n = window.n_ticks
    step = 250_000 // TICK_US  # ticks between consecutive 4 Hz frames (5)
    task_line = f"Task given to the robot: {task.strip()}\n" if task and task.strip() else ""
    return (
        f"{task_line}"
        f"The clip is one window of a longer robot episode: {n_frames} frames at 4 Hz, "
        f"each frame showing {camera_text(roles)}.\n"
        f"Time is measured in ticks of 50 ms (20 Hz) from the start of the clip: frame i "
        f"is at tick {step}*i, and the clip spans ticks 0 to {n}.\n"
        "List every action the robot performs, one per line, as four integers "
        "separated by single spaces:\n"
        "u v l r\n"
        f"- u, v: start and end tick of the action, 0 <= u < v <= {n};\n"
        "- l: 1 if the action was already under way before the clip starts (then u = 0), "
        "else 0;\n"
        f"- r: 1 if the action continues after the clip ends (then v = {n}), else 0.\n"
        "Sort the lines by u, then v. Actions that overlap in time (e.g. two arms) are "
        "separate lines. Idle time is not an action. If the robot does nothing, answer "
        "exactly: none\n"
        "Answer with the lines only."
    )
