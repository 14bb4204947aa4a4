"""Byte-identity checks that tell a real dependency from the rare video byte flip.

About one generation of the demo toy world in sixty writes one video file as the same
alternative bytes (``docs/dataset.md``, "Determinism"; renderer or x264, not yet known).
A check that two generations write the same bytes would then fail by chance. Here a
difference counts only when a second, fresh pair of generations shows it again: a real
dependency (on what ran before in the process, on threads beside it, on a stale
pointer) differs every time, while two flips in a row are about as rare as the square of
one. A difference that is not repeated is reported as a warning naming the files.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

Digest = dict[str, str]


def differing(a: Digest, b: Digest) -> list[str]:
    """Names whose digests differ, or that only one of ``a`` and ``b`` has."""
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


def repeated_difference(
    first: tuple[Digest, Digest], again: Callable[[], tuple[Digest, Digest]], what: str
) -> list[str]:
    """The names where ``first``'s two digests differ *and* those of a fresh pair
    (``again()``, made only when the first pair differs) still differ; [] when either
    pair matches."""
    once = differing(*first)
    if not once:
        return []
    twice = differing(*again())
    if not twice:
        warnings.warn(
            f"{what}: one of two generations differed in {once} (the rare video byte flip, "
            "docs/dataset.md); a fresh pair matched",
            stacklevel=2,
        )
    return twice
