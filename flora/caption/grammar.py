"""Caption output grammar: one strict parser, one renderer (DESIGN §3.4).

Grammar (documented in ``docs/grammars.md``, section "Captioner")::

    output   := "caption: " sentence [ "\\n" ]
    sentence := one line, 2..MAX_CAPTION_WORDS words, <= MAX_CAPTION_CHARS characters,
                ending in ".", with no other sentence terminator (. ! ?) followed by a
                space inside it, printable characters only, mostly letters, and none of
                the role / prompt markers (BEFORE, TARGET, AFTER, "caption:")

Surrounding whitespace of the whole output is tolerated; anything else (a second line,
a code fence, a missing prefix, an empty or over-long sentence, several sentences,
garbage) is a ``Rejection`` with a reason. The parser cannot check semantics (e.g. a
failed attempt written as a success); the judges in ``flora.caption.judges`` do.
``parse_caption(render_caption(x)) == normalise_caption(x)`` for every renderable ``x``.
"""

from __future__ import annotations

import re

from flora.backends.base import VLMResponse
from flora.parsing import Rejection

CAPTION_PREFIX = "caption: "
MAX_CAPTION_CHARS = 300
MAX_CAPTION_WORDS = 60
MIN_CAPTION_WORDS = 2
_ROLE_MARKERS_UPPER = re.compile(r"\b(BEFORE|TARGET|AFTER)\b")
_INNER_TERMINATOR = re.compile(r"[.!?]\s")
_WORD = re.compile(r"[A-Za-z][A-Za-z'-]*")


def normalise_caption(text: str) -> str:
    """Canonical sentence form: collapse inner whitespace, strip, end with one period."""
    t = " ".join(text.split())
    t = t.rstrip(" .")
    return f"{t}." if t else ""


def caption_problem(sentence: str) -> str | None:
    """Why a caption sentence breaks the grammar, or None when it is valid."""
    if not sentence.strip(" ."):
        return "empty caption"
    if len(sentence) > MAX_CAPTION_CHARS:
        return f"caption too long: {len(sentence)} > {MAX_CAPTION_CHARS} characters"
    if not sentence.isprintable():
        return "caption contains non-printable characters"
    if not sentence.endswith("."):
        return "caption must end with a period"
    if sentence.endswith("..") or _INNER_TERMINATOR.search(sentence):
        return "caption must be exactly one sentence"
    if "?" in sentence or "!" in sentence:
        return "caption must be one declarative sentence (no ? or !)"
    if _ROLE_MARKERS_UPPER.search(sentence) or "caption:" in sentence.lower():
        return "caption repeats a prompt/role marker (BEFORE/TARGET/AFTER/caption:)"
    words = sentence.split()
    if len(words) > MAX_CAPTION_WORDS:
        return f"caption too long: {len(words)} > {MAX_CAPTION_WORDS} words"
    alpha_words = _WORD.findall(sentence)
    if len(alpha_words) < MIN_CAPTION_WORDS:
        return f"caption needs at least {MIN_CAPTION_WORDS} words"
    letters = sum(ch.isalpha() for ch in sentence)
    visible = sum(not ch.isspace() for ch in sentence)
    if letters < 0.7 * visible:
        return "caption looks like garbage (too few letters)"
    if len(set(w.lower() for w in alpha_words)) < max(2, len(alpha_words) // 4):
        return "caption looks like garbage (degenerate repetition)"
    return None


def parse_caption(text: str) -> str | Rejection:
    """Parse a raw model output into its caption sentence, or a typed ``Rejection``."""
    if not isinstance(text, str):
        return Rejection(f"expected text, got {type(text).__name__}")
    body = text.strip()
    if not body:
        return Rejection("empty output", text)
    if "\n" in body or "\r" in body:
        return Rejection("output must be a single line 'caption: <sentence>'", text)
    if not body.startswith(CAPTION_PREFIX):
        return Rejection(f"output must start with {CAPTION_PREFIX!r}", text)
    sentence = body[len(CAPTION_PREFIX) :]
    if sentence != sentence.strip() or "  " in sentence:
        return Rejection("caption has irregular whitespace", text)
    reason = caption_problem(sentence)
    if reason is not None:
        return Rejection(reason, text)
    return sentence


def caption_regex() -> str:
    """The grammar's syntax as a regular expression, for guided decoding: the prefix and one
    line of at most :data:`MAX_CAPTION_CHARS` characters starting with a letter.
    Word counts and the garbage checks are not expressed: :func:`parse_caption` judges."""
    return f"{CAPTION_PREFIX}[A-Za-z][^\\r\\n]{{0,{MAX_CAPTION_CHARS - 1}}}"


def parse_caption_response(response: VLMResponse) -> str | Rejection:
    """``parse_caption`` over a backend response (for ``flora.parsing.generate_parsed``)."""
    return parse_caption(response.text)


def render_caption(caption: str) -> str:
    """Render a caption as the model's target output (used for SFT targets).

    Raises ``ValueError`` when the caption cannot be rendered into a valid output — an SFT
    target that its own parser would reject is never produced.
    """
    sentence = normalise_caption(caption)
    reason = caption_problem(sentence)
    if reason is not None:
        raise ValueError(f"cannot render caption {caption!r}: {reason}")
    return f"{CAPTION_PREFIX}{sentence}"


__all__ = [
    "CAPTION_PREFIX",
    "caption_regex",
    "caption_problem",
    "MAX_CAPTION_CHARS",
    "MAX_CAPTION_WORDS",
    "normalise_caption",
    "parse_caption",
    "parse_caption_response",
    "render_caption",
]
