"""The checkout guard (tests/checkout_guard.py) fails a pytest run that changed the git
checkout it ran in, and only such a run. Each case runs an inner pytest session under
``pytester`` in a throwaway git repository holding a user's files."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

# The outer run imported the guard already, so pytest cannot assertion-rewrite it (no asserts).
GUARD = ["-p", "tests.checkout_guard", "-p", "no:cacheprovider",
         "-W", "ignore::pytest.PytestAssertRewriteWarning"]  # fmt: skip


def _git(root: Path, *args: str) -> None:
    who = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}  # fmt: skip
    subprocess.run(["git", *args], cwd=root, check=True, capture_output=True,
                   env={**os.environ, **who})  # fmt: skip


@pytest.fixture
def checkout(pytester: pytest.Pytester) -> Path:
    """A git checkout with a committed README, a user's uncommitted edit to notes.md and
    an untracked file of theirs; ``__pycache__`` is ignored as in a real clone."""
    root = pytester.path
    (root / ".gitignore").write_text("__pycache__/\n")
    (root / "README.md").write_text("readme\n")
    (root / "notes.md").write_text("committed\n")
    _git(root, "init", "-q")
    _git(root, "add", ".")
    _git(root, "commit", "-q", "-m", "init")
    (root / "notes.md").write_text("the user's edit\n")
    (root / "mine.txt").write_text("the user's own file\n")
    return root


def _run(pytester: pytest.Pytester, body: str) -> pytest.RunResult:
    pytester.makepyfile(test_inner=f"from pathlib import Path\nROOT = Path(__file__).parent\n\n"
                                   f"def test_inner():\n    {body}\n")  # fmt: skip
    # The inner test file itself is new and untracked: commit it so only the body's effect shows.
    _git(pytester.path, "add", "test_inner.py")
    _git(pytester.path, "commit", "-q", "-m", "inner test")
    return pytester.runpytest_inprocess(*GUARD)


def test_a_run_that_leaves_the_checkout_alone_passes(pytester, checkout):
    res = _run(pytester, "assert (ROOT / 'README.md').read_text() == 'readme\\n'")
    assert res.ret == pytest.ExitCode.OK
    assert "changed the checkout" not in res.stdout.str()


@pytest.mark.parametrize(
    ("body", "kind", "name"),
    [
        ("(ROOT / 'README.md').write_text('overwritten')", "now", " M README.md"),
        ("(ROOT / 'out.json').write_text('{}')", "now", "?? out.json"),
        ("(ROOT / 'mine.txt').unlink()", "before", "?? mine.txt"),
        # A second edit to a file the user had already modified: same status line, new content.
        ("(ROOT / 'notes.md').write_text('a test wrote here')", "rewritten", " M notes.md"),
    ],
    ids=["tracked-written", "output-left", "users-file-deleted", "users-edit-rewritten"],
)
def test_a_run_that_changes_the_checkout_fails_naming_it(pytester, checkout, body, kind, name):
    res = _run(pytester, body)
    out = res.stdout.str()
    assert res.ret == pytest.ExitCode.TESTS_FAILED, out
    line = next(ln for ln in out.splitlines() if "changed the checkout" in ln)
    assert f"'{kind}': ['{name}']" in line
    res.assert_outcomes(passed=1)  # the inner test itself passed: the guard failed the run


def test_outside_a_git_checkout_the_guard_stays_silent(pytester):
    pytester.makepyfile(test_inner="def test_inner():\n    open('out.txt', 'w').write('x')\n")
    res = pytester.runpytest_inprocess(*GUARD)
    assert res.ret == pytest.ExitCode.OK
