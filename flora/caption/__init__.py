"""flora.caption: contextual captioner (DESIGN §3.2, seed eq. 2) and caption judges.

Context selection (``context``), prompts (``prompts``), the output grammar (``grammar``),
the pipeline step (``run``: ``caption_episode`` / ``caption_dataset``), the r_cap judges
(``judges``), the ground-truth oracle backend (``oracle``) and ``flora eval caption``
(``evaluate``). See ``docs/captioning.md``.
"""

from flora.caption.context import (
    CONTEXT_US,
    ROLES,
    Clip,
    EventContext,
    select_contexts,
)
from flora.caption.grammar import parse_caption, parse_caption_response, render_caption
from flora.caption.run import CaptionConfig, caption_dataset, caption_episode

__all__ = [
    "CONTEXT_US",
    "ROLES",
    "CaptionConfig",
    "Clip",
    "EventContext",
    "caption_dataset",
    "caption_episode",
    "parse_caption",
    "parse_caption_response",
    "render_caption",
    "select_contexts",
]
