"""Pytest hooks that fail a test run which changed the checkout it ran in.

A test run must leave a user's clone as it found it: outputs belong in tmp dirs. The
controller (never an xdist worker) fingerprints the checkout before and after the
session: ``git status --porcelain`` plus a content hash of every file that status lists,
so a second edit to a file the user had already modified is seen too. ``tests/conftest.py``
imports these hooks; ``tests/test_checkout_guard.py`` runs them under ``pytester``.
"""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

_TREE = pytest.StashKey[dict[str, str] | None]()  # the checkout's fingerprint at session start
_HASH_LIMIT = 16 << 20  # larger files are fingerprinted by size and mtime, not read


def _file_print(path: Path) -> str:
    """Content hash of a file (size and mtime above the limit); 'absent' or 'dir' otherwise."""
    if not path.exists():
        return "absent"
    if path.is_dir():
        return "dir"
    st = path.stat()
    if st.st_size > _HASH_LIMIT:
        return f"size={st.st_size} mtime={st.st_mtime_ns}"
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tree_fingerprint(root: Path) -> dict[str, str] | None:
    """``{porcelain status line: fingerprint of its file}`` of the checkout at ``root``.

    None where git cannot tell (not a git checkout, git missing or hung): the guard then
    stays silent rather than failing a run it cannot judge.
    """
    try:
        out = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=all", "-z"],
            cwd=root, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    prints: dict[str, str] = {}
    entries = iter(out.stdout.split("\0"))
    for entry in entries:
        if not entry:
            continue
        if entry[0] in "RC":  # a rename or copy: the next NUL-separated field is the source
            next(entries, None)
        prints[entry] = _file_print(root / entry[3:])
    return prints


def pytest_sessionstart(session: pytest.Session) -> None:
    # Controller only (xdist workers carry ``workerinput``): one look before, one after.
    if not hasattr(session.config, "workerinput"):
        session.config.stash[_TREE] = tree_fingerprint(session.config.rootpath)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run, naming the files, when the tests changed the checkout's tracked or
    unignored files (status lines that came or went, or a listed file's content)."""
    if hasattr(session.config, "workerinput"):
        return
    before = session.config.stash.get(_TREE, None)
    after = tree_fingerprint(session.config.rootpath) if before is not None else None
    if before is None or after is None or after == before:
        return
    # Both directions: a test that restores or deletes a file the user had changed counts too.
    changed = {
        "now": sorted(set(after) - set(before)),
        "before": sorted(set(before) - set(after)),
        "rewritten": sorted(k for k in set(after) & set(before) if after[k] != before[k]),
    }
    changed = {k: v for k, v in changed.items() if v}
    rep = session.config.pluginmanager.get_plugin("terminalreporter")
    if rep is not None:
        rep.write_line(
            f"the test run changed the checkout {session.config.rootpath} (git status): {changed}",
            red=True,
        )
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
