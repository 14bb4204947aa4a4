"""flora.segment: windowed temporal segmentation (DESIGN §3.1, §3.7; seed §2).

Window planning, the ``u v l r`` tick grammar, the core filter + stitching, shifted-pass
refinement, the kinematic baseline, and the pipeline step that writes the ``events`` table.
"""

from __future__ import annotations

from typing import Any

from flora.segment.grammar import parse_segments, render_segments
from flora.segment.plan import PROFILES, LocalSegment, Window, WindowProfile, plan_windows
from flora.segment.refine import refine
from flora.segment.stitch import StitchedEvent, stitch, stitch_detailed

__all__ = [
    "PROFILES",
    "LocalSegment",
    "StitchedEvent",
    "Window",
    "WindowProfile",
    "parse_segments",
    "plan_windows",
    "refine",
    "render_segments",
    "segment_dataset",
    "segment_episode",
    "stitch",
    "stitch_detailed",
]


def __getattr__(name: str) -> Any:
    # The pipeline step pulls in data readers and backends; import it only when used so
    # the pure planning/stitching code stays importable on its own.
    if name in ("segment_episode", "segment_dataset"):
        from flora.segment import run

        return getattr(run, name)
    raise AttributeError(f"module 'flora.segment' has no attribute {name!r}")
