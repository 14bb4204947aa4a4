"""Captioner prompt (``q_cap`` of seed eq. 2): roles, camera layout, rules, output grammar.

The model input is one ordered list of images (a mosaic per sampled instant) plus this
text. Roles are explicit: the prompt states which image numbers belong to BEFORE, TARGET
and AFTER and their episode times; only TARGET is to be described. The camera layout
(main left, wrist right) is named, and views missing at some instants are listed per clip.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from flora.caption.context import ROLE_AFTER, ROLE_BEFORE, ROLE_TARGET
from flora.caption.grammar import CAPTION_PREFIX

PROMPT_VERSION = "cap-v1"

CAMERA_DESCRIPTIONS = {
    "main": "main (third-person camera over the workspace)",
    "wrist": "wrist (camera mounted on the gripper)",
}

SYSTEM_PROMPT = (
    "You are Flora-Captioner. You watch short clips of a robot episode and write one "
    "precise, factual sentence describing the robot action in the TARGET clip."
)


@dataclass(frozen=True)
class ClipSpec:
    """What the prompt says about one clip: role, images, time span, neighbour, gaps."""

    role: str
    first_image: int  # 1-based, inclusive
    last_image: int  # 1-based, inclusive
    start_us: int
    end_us: int
    neighbour_start_us: int | None = None
    neighbour_end_us: int | None = None
    neighbour_caption: str = ""
    missing: Mapping[str, Sequence[int]] = field(default_factory=dict)  # view -> image nos


def _s(us: int) -> str:
    return f"{us / 1e6:.2f}"


def _ranges(nums: Sequence[int]) -> str:
    """Compact '3-5, 8' form of sorted image numbers."""
    nums = sorted(set(nums))
    parts: list[str] = []
    i = 0
    while i < len(nums):
        j = i
        while j + 1 < len(nums) and nums[j + 1] == nums[j] + 1:
            j += 1
        parts.append(f"{nums[i]}" if i == j else f"{nums[i]}-{nums[j]}")
        i = j + 1
    return ", ".join(parts)


def camera_layout_text(views: Sequence[str]) -> str:
    """Sentence naming the mosaic layout, left to right, by camera role."""
    if len(views) == 1:
        return f"Each image is a single view: {CAMERA_DESCRIPTIONS.get(views[0], views[0])}."
    tiles = " | ".join(CAMERA_DESCRIPTIONS.get(v, v) for v in views)
    return (
        f"Each image is a mosaic of {len(views)} views taken at the same instant, left to "
        f"right: {tiles}. The views show the same moment from different cameras; write one "
        "description that is consistent with all of them."
    )


def build_caption_prompt(
    task: str, duration_us: int, views: Sequence[str], clips: Sequence[ClipSpec]
) -> str:
    """The user prompt for one target event (see module docstring)."""
    lines = [
        f'Episode task: "{task.strip()}".' if task.strip() else "Episode task: not given.",
        f"Episode duration: {_s(duration_us)} s.",
        camera_layout_text(views),
        "Clips (images are in time order; times are seconds from the episode start):",
    ]
    for c in clips:
        span = (
            f"image {c.first_image}"
            if c.first_image == c.last_image
            else f"images {c.first_image}-{c.last_image}"
        )
        if c.role == ROLE_TARGET:
            lines.append(f"- TARGET (describe this): {span}, {_s(c.start_us)}-{_s(c.end_us)} s.")
            continue
        which = "previous" if c.role == ROLE_BEFORE else "next"
        text = f"- {c.role} (context only, do not describe): {span}, {_s(c.start_us)}-"
        text += f"{_s(c.end_us)} s."
        if c.neighbour_start_us is not None and c.neighbour_end_us is not None:
            text += (
                f" The {which} action spans {_s(c.neighbour_start_us)}-{_s(c.neighbour_end_us)} s"
            )
            text += f' ("{c.neighbour_caption.strip()}").' if c.neighbour_caption else "."
        lines.append(text)
    roles = {c.role for c in clips}
    if ROLE_BEFORE not in roles:
        lines.append("There is no BEFORE context (no earlier action).")
    if ROLE_AFTER not in roles:
        lines.append("There is no AFTER context (no later action).")
    gaps = [
        f"{view} view missing (black tile) in {c.role} image(s) {_ranges(nums)}"
        for c in clips
        for view, nums in sorted(c.missing.items())
        if nums
    ]
    if gaps:
        lines.append("Missing views: " + "; ".join(gaps) + ". Rely on the other view there.")
    lines += [
        "Rules:",
        "- Describe only what the robot does in TARGET: the intended action, the objects "
        "involved (colour and kind), how the arms coordinate when more than one arm acts, "
        "and the spatial relations that matter (where from, where to).",
        "- BEFORE and AFTER only help you tell which object is involved and which stage of "
        "the task this is; do not describe their actions.",
        "- If the action in TARGET is attempted but fails (a missed grasp, a drop, a "
        "collision), keep its goal and say it was attempted and how it failed; never write "
        "a failed attempt as a success.",
        "- Do not mention clips, images, cameras, roles or times.",
        f"Answer with exactly one line: {CAPTION_PREFIX}<one sentence ending with a period>",
    ]
    return "\n".join(lines)


__all__ = [
    "CAMERA_DESCRIPTIONS",
    "PROMPT_VERSION",
    "SYSTEM_PROMPT",
    "ClipSpec",
    "build_caption_prompt",
    "camera_layout_text",
]
