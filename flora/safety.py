"""Output folders: Flora never deletes or overwrites data it did not create.

A command that writes a folder (``flora tiny-model --out``, the embedded tiny model, the
demo's toy world) first asks :func:`ensure_own_output_dir`. A path that does not exist, or
an empty folder, is free. A folder that holds something is replaced only when Flora made
it for the same purpose — it carries the owner marker :data:`OWNER_MARKER` with that
``kind`` (written by :func:`claim_output_dir` before anything else, so even a half-written
folder of a crashed run is recognised), or one of the older completion markers the caller
names (``flora_tiny.json``, ``meta/flora_synth.json``). Anything else — a dataset, a file,
a symlink — is refused with :class:`OutputDirError` unless the user passes ``overwrite``
(the CLI's ``--overwrite``). Design notes: ``docs/reliability.md``.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

#: File Flora writes into every output folder it creates, naming what the folder is.
OWNER_MARKER = ".flora-output.json"


class OutputDirError(FileExistsError):
    """An output path holds data Flora did not write there; refused without overwrite."""


def output_kind(path: str | Path) -> str | None:
    """The ``kind`` in ``path``'s owner marker, or None (no marker, or unreadable)."""
    try:
        data = json.loads((Path(path) / OWNER_MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if isinstance(data, dict) and data.get("created_by") == "flora":
        kind = data.get("kind")
        return kind if isinstance(kind, str) else None
    return None


def is_own_output_dir(path: str | Path, kind: str, *, markers: Sequence[str] = ()) -> bool:
    """True when ``path`` is a real folder that Flora made as a ``kind``.

    ``markers`` are paths (relative to ``path``) of files only Flora writes for this kind,
    accepted as proof too (folders written before the owner marker existed).
    """
    p = Path(path)
    if p.is_symlink() or not p.is_dir():
        return False
    return output_kind(p) == kind or any((p / m).is_file() for m in markers)


def ensure_own_output_dir(
    path: str | Path,
    kind: str,
    *,
    overwrite: bool = False,
    markers: Sequence[str] = (),
    hint: str = "pass --overwrite to replace it",
) -> bool:
    """Check that Flora may (re)create ``path`` as a ``kind``; refuse otherwise.

    Returns True when something is there that may now be replaced (Flora's own ``kind``
    folder, or anything with ``overwrite``), False when nothing is in the way (no such
    path, or an empty folder). Raises :class:`OutputDirError` — naming the path, what is
    there and how to proceed — for a file, a symlink or a non-empty folder Flora did not
    make as a ``kind``, unless ``overwrite``.
    """
    p = Path(path)
    if p.is_symlink() or (p.exists() and not p.is_dir()):
        if overwrite:
            return True
        what = "a symlink" if p.is_symlink() else "a file"
        raise OutputDirError(
            f"{p} is {what}, not a folder Flora made for a {kind}; refusing to replace it ({hint})"
        )
    if not p.exists() or not any(p.iterdir()):
        return False
    if overwrite or is_own_output_dir(p, kind, markers=markers):
        return True
    raise OutputDirError(
        f"{p} is not empty and was not written by Flora as a {kind} (no {OWNER_MARKER}"
        + "".join(f" or {m}" for m in markers)
        + f"); refusing to replace it: move it away, choose another folder, or {hint}"
    )


def clear_output_path(path: str | Path) -> None:
    """Remove ``path`` (a folder tree, a file, or a symlink itself — never its target)."""
    p = Path(path)
    if p.is_symlink() or (p.exists() and not p.is_dir()):
        p.unlink()
    elif p.exists():
        shutil.rmtree(p)


def claim_output_dir(path: str | Path, kind: str) -> Path:
    """Create ``path`` (if needed) and write its owner marker for ``kind``, atomically.

    The marker's bytes depend only on ``kind``, so a deterministic artifact stays
    byte-identical from build to build.
    """
    p = Path(path)
    p.mkdir(parents=True, exist_ok=True)
    body = json.dumps({"created_by": "flora", "kind": kind}, sort_keys=True).encode()
    fd, tmp = tempfile.mkstemp(dir=p, prefix=f"{OWNER_MARKER}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(body)
        os.replace(tmp, p / OWNER_MARKER)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return p


def prepare_output_dir(
    path: str | Path,
    kind: str,
    *,
    overwrite: bool = False,
    markers: Sequence[str] = (),
    hint: str = "pass --overwrite to replace it",
) -> Path:
    """:func:`ensure_own_output_dir`, clear what may be replaced, create and claim ``path``."""
    if ensure_own_output_dir(path, kind, overwrite=overwrite, markers=markers, hint=hint):
        clear_output_path(path)
    return claim_output_dir(path, kind)


__all__ = [
    "OWNER_MARKER",
    "OutputDirError",
    "claim_output_dir",
    "clear_output_path",
    "ensure_own_output_dir",
    "is_own_output_dir",
    "output_kind",
    "prepare_output_dir",
]
