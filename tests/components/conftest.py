"""Undo what a ``kfp.local`` run leaves behind in the test process.

kfp.local (2.17) indents subprocess output by swapping ``builtins.print`` inside a context
manager (``kfp.local.logging_utils.indented_print``). Its enhanced orchestrator runs
ParallelFor iterations and parallel tasks on threads, and two threads that swap and
restore the global in overlapping order leave the indenting ``print`` installed for good:
every later test's ``print`` then starts with four spaces (the validate CLI tests failed on
the fresh clone this way). The root logger is restored too, as its handlers are also
swapped per run.
"""

from __future__ import annotations

import builtins
import logging

import pytest


@pytest.fixture(autouse=True)
def _restore_print_and_root_logger():
    original_print = builtins.print
    root = logging.getLogger()
    level, handlers = root.level, root.handlers[:]
    yield
    builtins.print = original_print
    root.setLevel(level)
    root.handlers[:] = handlers


@pytest.fixture
def task_tmp(tmp_path, monkeypatch):
    """The temp dir kfp.local's task subprocesses use (``TMPDIR``), to check that a
    component's scratch folders are removed, not left to pile up on the machine."""
    scratch = tmp_path / "task_tmp"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    return scratch
